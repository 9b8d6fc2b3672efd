"""Decoding one stored add: pydantic's paths against ``catalog.stored.fast_decode``, per payload.

The payloads are the adds of a generated log (``bench.shared.gen``), exactly what
``CatalogService`` writes. Each way of decoding them runs over the whole list,
interleaved with the others, best of several rounds, and the figure is CPU
microseconds per payload:

- ``json.loads``: the floor replay is measured against (no model built);
- today's fast path: ``parse_wrapped_model_json`` (pydantic ``validate_json``,
  then ``normalize`` and ``validate``), what replay runs now;
- the general path: ``read_json`` within replay's limits, then ``parse_model``;
- msgspec without memo, and with memo (sub-objects remembered by their text),
  each including ``normalize`` and ``validate``;
- the parts of the msgspec path: the decode alone, and ``normalize`` +
  ``validate`` alone on already built models.

Before timing, every payload is checked to decode to an equal model both ways.

``python -m bench decode [--quick]`` or ``python -m bench.events.decode [--quick]``.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from typing import Any

from bench.shared import common, gen
from catalog.definition.model import Model
from catalog.definition.model_rules import normalize, validate
from catalog.definition.parse import parse_wrapped_model_json
from catalog.stored import fast_decode
from events.core.types import MODEL_ADDED
from events.read.replay import STORED_LIMITS

EVENTS = 20_000
QUICK_EVENTS = 6_000


def payloads(events: int) -> tuple[list[str], int]:
    """The adds of a generated log of ``events`` events, and how many of them are bad."""
    commands, stats = gen.generate(events)
    texts = [row["payload"] for rows in commands for row in rows if row["type"] == MODEL_ADDED]
    good = [t for t in texts if parse_wrapped_model_json(t) is not None]
    return good, stats.bad


def _cpu(fn: Callable[[], Any]) -> float:
    gc.collect()
    start = time.process_time()
    fn()
    return time.process_time() - start


def _best(repeats: int, jobs: dict[str, Callable[[], Any]]) -> dict[str, float]:
    best = dict.fromkeys(jobs, float("inf"))
    for _ in range(repeats):
        for name, job in jobs.items():
            best[name] = min(best[name], _cpu(job))
    return best


def run(quick: bool) -> list[common.Table]:  # noqa: PLR0915 - one job per way, listed
    events = QUICK_EVENTS if quick else EVENTS
    common.progress(f"decode: generating a log of {events:,} events")
    texts, _ = payloads(events)
    common.progress(f"decode: checking {len(texts):,} payloads decode equal both ways")
    fast_decode.clear_caches()
    for text in texts:
        ours = fast_decode.decode_definition(text)
        theirs = parse_wrapped_model_json(text)
        if ours is None or ours != theirs or ours.to_definition() != theirs.to_definition():
            raise AssertionError(f"fast_decode disagrees with pydantic on {text[:200]}")
    sizes = fast_decode.cache_sizes()

    loads = json.loads
    decode_payload = fast_decode._DECODE_COMPLETE
    build = fast_decode._model_complete
    decoded = [decode_payload(t) for t in texts]
    built: list[Model] = [build(d.model) for d in decoded]

    def floor() -> None:
        for t in texts:
            loads(t)

    def pydantic_fast() -> None:
        for t in texts:
            parse_wrapped_model_json(t)

    def general() -> None:
        for t in texts:
            fast_decode.decode_general(t, STORED_LIMITS)

    def msgspec_no_memo() -> None:
        fast_decode.set_memo_limit(0)
        try:
            for t in texts:
                fast_decode.decode_definition(t)
        finally:
            fast_decode.set_memo_limit(4096)

    def msgspec_memo() -> None:
        fast_decode.clear_caches()  # cold at the start of each round: misses are billed
        for t in texts:
            fast_decode.decode_definition(t)

    def msgspec_decode_only() -> None:
        for t in texts:
            decode_payload(t)

    def normalize_validate_only() -> None:
        for m in built:
            validate(normalize(m))

    jobs = {
        "`json.loads` (the floor's decode)": floor,
        "pydantic `validate_json` + normalize + validate (today's fast path)": pydantic_fast,
        "general: `read_json` + `parse_model`": general,
        "msgspec + normalize + validate, no memo": msgspec_no_memo,
        "msgspec + normalize + validate, memo": msgspec_memo,
        "part: msgspec decode into structs only": msgspec_decode_only,
        "part: normalize + validate only": normalize_validate_only,
    }
    repeats = 3 if quick else 5
    common.progress(f"decode: {len(jobs)} ways x {len(texts):,} payloads, best of {repeats}")
    best = _best(repeats, jobs)
    today = best["pydantic `validate_json` + normalize + validate (today's fast path)"]
    gc_was = gc.isenabled()
    gc.disable()
    try:
        memo_nogc = _best(repeats, {"memo": msgspec_memo})["memo"]
    finally:
        if gc_was:
            gc.enable()

    table = common.Table(
        "Decoding a stored add (CPU per payload)",
        ["way", "us/payload", "vs today", "payloads/s"],
    )
    for name, seconds in best.items():
        table.add(
            name,
            f"{seconds / len(texts) * 1e6:.2f}",
            common.ratio(today, seconds),
            common.rate(len(texts), seconds),
        )
    table.add(
        "msgspec + normalize + validate, memo, collector off",
        f"{memo_nogc / len(texts) * 1e6:.2f}",
        common.ratio(today, memo_nogc),
        common.rate(len(texts), memo_nogc),
    )
    table.note(
        f"{len(texts):,} valid stored adds of a generated {events:,}-event log "
        "(bench/shared/gen.py), "
        f"each checked to decode to an equal model both ways first; best of {repeats}, "
        "interleaved; `vs today` is how many times faster than today's fast path"
    )
    table.note(
        "distinct sub-objects remembered after one pass: "
        + ", ".join(f"{k} {v}" for k, v in sizes.items())
    )
    return [table]


if __name__ == "__main__":
    import argparse

    from bench.shared.common import quiet_logs

    parser = argparse.ArgumentParser(prog="python -m bench.events.decode", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a small log, to iterate")
    args = parser.parse_args()
    quiet_logs()
    for t in run(args.quick):
        common.emit(t)
