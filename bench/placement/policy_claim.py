"""What recording the serving policy costs a placer's round, and a command's read of it.

``python -m bench.placement.policy_claim [--rounds 10000] [--repeats 300]``

Before each round, a placer (``serve --with-scheduler``, ``daemon``) reads the policy in
force (``scheduler.persistence.serving_policy``: the newest round's policy and the newest
placer's record) and writes its own only when it differs: the steady case is the two reads.
``status``, ``nodes list``, ``place`` and ``explain`` make the same reads. Measured on SQLite
and PostgreSQL with ``--rounds`` recorded rounds and a full ``serving_policies`` table
(``KEPT_POLICIES`` rows); the best of ``--repeats`` calls, and the median.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from sqlalchemy import Engine, insert

from bench.shared import common
from events.database.connection import make_engine
from events.database.migrate import ensure_schema
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.record_format import policy_json
from scheduler.persistence.serving_policy import (
    KEPT_POLICIES,
    STARTED,
    ServingProcess,
    claim_policy,
    record_policy,
    rounds_t,
)

T0 = datetime(2026, 12, 7, tzinfo=UTC)
POLICY = StalenessPolicy(stale_after=timedelta(seconds=3), grace=timedelta(seconds=3))
DATABASE = "llmgw_bench_policy_claim"


def _fill(engine: Engine, rounds: int) -> ServingProcess:
    ensure_schema(engine)
    text = policy_json(POLICY)
    with engine.begin() as conn:
        conn.execute(
            insert(rounds_t),
            [
                {
                    "id": i,
                    "planned_at": T0 + timedelta(seconds=i),
                    "catalog_position": 0,
                    "inventory_digest": "",
                    "reported_at": "{}",
                    "current": "[]",
                    "policy": text,
                    "placed": 0,
                    "removed": 0,
                    "unplaced": 0,
                    "lifecycle": None,
                }
                for i in range(1, rounds + 1)
            ],
        )
    who = ServingProcess("daemon", places=True)
    for i in range(KEPT_POLICIES):
        record_policy(engine, who, POLICY, why=STARTED, now=T0 + timedelta(seconds=rounds + i))
    return who


def _measure(engine: Engine, who: ServingProcess, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        wrote = claim_policy(engine, who, POLICY, T0)
        times.append(time.perf_counter() - start)
        assert not wrote  # the steady case: its own policy is in force
    return times


def run(rounds: int, repeats: int) -> common.Table:
    table = common.Table(
        "A placer's check of the policy in force, before each round (nothing to write)",
        ["back end", "recorded rounds", "serving_policies rows", "best", "median"],
    )
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'bench.db'}")
        who = _fill(engine, rounds)
        times = _measure(engine, who, repeats)
        table.add(
            "SQLite",
            f"{rounds:,}",
            KEPT_POLICIES,
            common.ms(min(times)),
            common.ms(statistics.median(times)),
        )
        engine.dispose()
    why_not = common.pg_available()
    if why_not is not None:
        table.note(why_not)
        return table
    common.pg_recreate(DATABASE)
    engine = make_engine(common.pg_url(DATABASE))
    try:
        who = _fill(engine, rounds)
        times = _measure(engine, who, repeats)
    finally:
        engine.dispose()
        with psycopg.connect(common.PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
    table.add(
        "PostgreSQL",
        f"{rounds:,}",
        KEPT_POLICIES,
        common.ms(min(times)),
        common.ms(statistics.median(times)),
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    common.emit(run(args.rounds, args.repeats))


if __name__ == "__main__":
    main()
