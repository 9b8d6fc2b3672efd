"""Replay as start-up runs it (the read model: the lean read, catalog.fast_decode) gives
exactly what the general path gives over whole events: on a generated log with bad events
(bench/gen.py), the same catalog, the same applied positions and the same skips, reasons
included."""

from __future__ import annotations

from unittest.mock import patch

from bench import gen
from events.backends import open_log
from events.db import make_engine
from events.read_model import CatalogReadModel
from events.replay import ReplayResult, replay


def _outcome(result: ReplayResult) -> tuple[object, ...]:
    return (
        result.position,
        [m.to_definition() for m in result.catalog.models()],
        result.catalog.names(),
        result.applied,
        result.skipped,
    )


def test_replay_through_the_fast_paths_equals_the_general_path_on_a_generated_log(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    try:
        stats = gen._write(engine, 4_000)
        log = open_log(engine)
        declared = gen.declared_catalog()

        fast = CatalogReadModel(log, declared).refresh()
        with (
            patch("events.replay.decode_definition", return_value=None),
            patch("events.replay.decode_removal", return_value=None),
        ):
            general = replay(declared, log.read())
    finally:
        engine.dispose()

    assert stats.bad > 0
    assert len(fast.skipped) == stats.bad
    assert _outcome(fast) == _outcome(general)
