"""Replay as start-up runs it (the read model: the lean read, catalog.stored.fast_decode) gives
exactly what the general path gives over whole events: on a generated log with bad events
(bench/shared/gen.py), the same catalog, the same applied positions and the same skips, reasons
included."""

from __future__ import annotations

from unittest.mock import patch

from bench.shared import gen
from catalog import Catalog
from events.database.connection import make_engine
from events.read.model import CatalogReadModel
from events.read.replay import ReplayResult, replay
from events.storage.backends import open_log
from tests.support import definition, insert_raw_event


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
            patch("events.read.replay.decode_definition", return_value=None),
            patch("events.read.replay.decode_removal", return_value=None),
        ):
            general = replay(declared, log.read())
    finally:
        engine.dispose()

    assert stats.bad > 0
    assert len(fast.skipped) == stats.bad
    assert _outcome(fast) == _outcome(general)


def test_a_column_the_driver_cannot_fetch_as_text_does_not_stop_start_up_replay(
    sqlite_url: str,
) -> None:
    """The lean read on SQLite fetches every column to check its type; a TEXT value
    whose bytes are not UTF-8 used to stop the driver's fetch of that batch. It reads
    as bytes now (events.database.sqlite_text), so the row is a row of the wrong type, skipped
    and named as the whole read (history, verify, replay --explain) names it, and
    the rest of the batch is judged as before."""
    engine = make_engine(sqlite_url)
    try:
        insert_raw_event(engine, 1, payload={"model": definition("before")}, model="before")
        insert_raw_event(engine, 2, payload={"model": definition("odd")}, model="odd")
        insert_raw_event(engine, 3, payload={"model": definition("after")}, model="after")
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE events SET actor = CAST(x'ff' AS TEXT) WHERE position = 2")
        log = open_log(engine)

        result = replay(Catalog.build([]), log.read_for_replay())
        served = CatalogReadModel(log, Catalog.build([])).refresh()
    finally:
        engine.dispose()

    assert result.catalog.names() == ["after", "before"]
    assert [(s.position, s.reason) for s in result.skipped] == [
        (2, "columns not of their type: actor is bytes")
    ]
    assert served.catalog.names() == ["after", "before"]
