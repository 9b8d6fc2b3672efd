"""Usage flushes: one event per flush row (the ledger as first merged) against the
roll-up (rows stored pending, one event per key and closed minute).

A minute of traffic: ``GATEWAYS`` gateways flushing every second, each flush holding
``KEYS`` rows (client, model, replica); the same keys on every gateway. Measured on a
SQLite file (WAL, synchronous=FULL, as served): the CPU time of this process for the
writes (``time.process_time``), the events the log gains, and the CPU time of reading
the ledger back (``GET /v1/usage``'s work) and of replaying the log's events.

    .venv/bin/python -m bench.events.usage_rollup
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine

from events.core.usage import UsageRow, event_for
from events.database.connection import make_engine
from events.database.migrate import upgrade
from events.read.ledger import LedgerQuery, summarise
from events.storage.backends import open_log
from events.storage.history import usage_events
from events.storage.usage_pending import pending_rows
from events.write.usage import record_usage, roll_up

GATEWAYS = 4
KEYS = 25
FLUSHES = 60
MINUTE = datetime(2026, 12, 7, 4, 5, tzinfo=UTC)


def _rows() -> list[UsageRow]:
    return [
        UsageRow(
            MINUTE,
            f"app-{k % 5}",
            f"m{k // 5}",
            f"m{k // 5}",
            f"m{k // 5}/r1",
            2,
            prompt_tokens=300,
            completion_tokens=40,
            outcomes=(("ok", 2),),
        )
        for k in range(KEYS)
    ]


def _read(engine: Engine) -> tuple[float, int]:
    start = time.process_time()
    ledger = summarise(usage_events(engine), LedgerQuery(), pending=pending_rows(engine))
    return time.process_time() - start, ledger.total.requests


def run(directory: Path) -> dict[str, dict[str, float]]:
    rows = _rows()
    out: dict[str, dict[str, float]] = {}
    for shape in ("per-flush-events", "roll-up"):
        engine = make_engine(f"sqlite:///{directory / shape}.db")
        upgrade(engine)
        log = open_log(engine)
        start = time.process_time()
        for flush in range(FLUSHES):
            for gateway in range(GATEWAYS):
                poster = f"gw-{gateway}-w0"
                if shape == "roll-up":
                    record_usage(engine, poster, f"f{flush}", rows)
                else:
                    stamped = [event_for(replace(r, gateways=(poster,))) for r in rows]
                    log.append(stamped, expected_head=None, key=f"usage:{poster}:f{flush}")
        posted = time.process_time() - start
        if shape == "roll-up":
            roll_up(log, MINUTE + timedelta(minutes=2))
        write = time.process_time() - start
        read, requests = _read(engine)
        start = time.process_time()
        replayed = sum(1 for _ in log.read_for_replay())
        replay = time.process_time() - start
        out[shape] = {
            "posts_cpu_s": round(posted, 3),
            "posts_and_roll_up_cpu_s": round(write, 3),
            "events": log.head(),
            "ledger_read_cpu_s": round(read, 4),
            "log_read_cpu_s": round(replay, 4),
            "requests": requests,
        }
        assert replayed == log.head()
        engine.dispose()
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    argparse.ArgumentParser(
        prog="python -m bench.events.usage_rollup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(Path(tmp))
    json.dump(figures, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
