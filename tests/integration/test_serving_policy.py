"""The policy the server runs with, recorded for the CLI's views (scheduler.persistence.
serving_policy), on SQLite and PostgreSQL: which record is in force, what a placer
writes, rows that cannot be read, and the bound on the table."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, insert, select

from catalog import Catalog
from events.catalog_service import CatalogService
from events.storage.backends import open_log
from llmgw.policy_view import judge
from llmgw.settings import Settings
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.serving_policy import (
    KEPT_POLICIES,
    PLACING,
    ROUND,
    STARTED,
    ServingProcess,
    policies_t,
    rounds_t,
)
from scheduler.persistence.store import SchedulerStore

T0 = datetime(2026, 12, 7, 1, 0, tzinfo=UTC)
SHORT = StalenessPolicy(stale_after=timedelta(seconds=3), grace=timedelta(seconds=3))
LONG = StalenessPolicy(stale_after=timedelta(minutes=10), grace=timedelta(hours=1))


def _round(engine: Engine, round_id: int, at: datetime, policy: object) -> None:
    """A round row as a release wrote it; only its id, time and policy are read here."""
    text = policy if isinstance(policy, str) else json.dumps(policy)
    with engine.begin() as conn:
        conn.execute(
            insert(rounds_t),
            {
                "id": round_id,
                "planned_at": at,
                "catalog_position": 0,
                "inventory_digest": "",
                "reported_at": "{}",
                "current": "[]",
                "policy": text,
                "placed": 0,
                "removed": 0,
                "unplaced": 0,
                "lifecycle": None,
            },
        )


def _v2(policy: StalenessPolicy) -> dict[str, object]:
    return {
        "stale_after_s": policy.stale_after.total_seconds(),
        "grace_s": policy.grace.total_seconds(),
        "mass_loss_fraction": 0.5,
        "preemption": True,
        "defragment": True,
        "repair_spread": False,
        "schema_version": 2,
    }


def test_the_newest_of_the_last_round_and_a_placers_start_is_in_force(engine: Engine) -> None:
    store = SchedulerStore(engine)
    assert store.policy_in_force().record is None
    _round(engine, 1, T0, _v2(LONG))
    assert store.policy_in_force().record.source == ROUND  # type: ignore[union-attr]
    # Restarted with another policy: its rounds change nothing, so none is recorded.
    serve = ServingProcess("serve", places=True, interval_s=0.5)
    store.record_policy(serve, SHORT, why=STARTED, now=T0 + timedelta(minutes=1))
    found = store.policy_in_force().record
    assert found is not None
    assert (found.policy, found.source, found.process, found.pid) == (
        SHORT,
        STARTED,
        "serve",
        serve.pid,
    )
    assert found.interval_s == 0.5
    # A round after it is newer.
    _round(engine, 2, T0 + timedelta(minutes=2), _v2(LONG))
    found = store.policy_in_force().record
    assert found is not None and (found.round_id, found.policy) == (2, LONG)


def test_a_server_without_a_scheduler_is_the_reference_only_while_no_placer_recorded(
    engine: Engine,
) -> None:
    store = SchedulerStore(engine)
    api_only = ServingProcess("serve", places=False)
    store.record_policy(api_only, LONG, why=STARTED, now=T0)
    assert store.policy_in_force().record.policy == LONG  # type: ignore[union-attr]
    daemon = ServingProcess("daemon", places=True)
    store.record_policy(daemon, SHORT, why=STARTED, now=T0 + timedelta(seconds=1))
    # Another API server starts later: what places is still the daemon.
    store.record_policy(api_only, LONG, why=STARTED, now=T0 + timedelta(seconds=2))
    found = store.policy_in_force().record
    assert found is not None and (found.process, found.policy) == ("daemon", SHORT)


def test_a_placer_records_its_policy_before_a_round_only_when_another_is_in_force(
    engine: Engine,
) -> None:
    store = SchedulerStore(engine)
    service = CatalogService(open_log(engine), Catalog.build([]))
    leader = ServingProcess("serve", places=True)
    placer = Placer(service, store, SHORT, serving=leader)
    store.record_policy(leader, SHORT, why=STARTED, now=T0)
    placer.run(now=T0 + timedelta(seconds=1))
    assert _rows(engine) == 1  # its own start is in force: nothing written
    # A standby started since, with another policy: the leader's next round says it places.
    store.record_policy(
        ServingProcess("serve", places=True), LONG, why=STARTED, now=T0 + timedelta(seconds=2)
    )
    assert store.policy_in_force().record.policy == LONG  # type: ignore[union-attr]
    placer.run(now=T0 + timedelta(seconds=3))
    found = store.policy_in_force().record
    assert found is not None
    assert (found.policy, found.source, found.instance) == (SHORT, PLACING, leader.instance)
    placer.run(now=T0 + timedelta(seconds=4))
    placer.run(dry_run=True, now=T0 + timedelta(seconds=5))
    assert _rows(engine) == 3


def test_only_the_newest_rows_are_kept(engine: Engine) -> None:
    store = SchedulerStore(engine)
    who = ServingProcess("daemon", places=True)
    for i in range(KEPT_POLICIES + 5):
        store.record_policy(who, SHORT, why=STARTED, now=T0 + timedelta(seconds=i))
    assert _rows(engine) == KEPT_POLICIES
    found = store.policy_in_force().record
    assert found is not None
    assert found.recorded_at == T0 + timedelta(seconds=KEPT_POLICIES + 4)


def test_a_round_recorded_before_versions_reads_as_it_ran(engine: Engine) -> None:
    """v1 rounds have no schema_version, preemption or defragment: on, as they planned."""
    _round(engine, 1, T0, {"stale_after_s": 3, "grace_s": 3, "mass_loss_fraction": 0.5})
    found = SchedulerStore(engine).policy_in_force().record
    assert found is not None
    assert found.policy == StalenessPolicy(
        stale_after=timedelta(seconds=3),
        grace=timedelta(seconds=3),
        preemption=True,
        defragment=False,
    )


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        ("not json", "policy"),
        ({**_v2(SHORT), "schema_version": 99}, "newer than this code reads"),
        ({**_v2(SHORT), "grace_s": -1}, "must not be negative"),
        ({**_v2(SHORT), "stale_after_s": "3"}, "stale_after_s '3' is not int or float"),
        ({**_v2(SHORT), "stale_after_s": 1e300}, "policy"),
        ([1, 2], "not a JSON object"),
        (
            {"grace_s": 3, "mass_loss_fraction": 0.5, "schema_version": 2},
            "stale_after_s is missing",
        ),
    ],
)
def test_an_unreadable_stored_policy_is_skipped_and_named_never_a_crash(
    engine: Engine, policy: object, reason: str, tmp_path: Path
) -> None:
    store = SchedulerStore(engine)
    _round(engine, 1, T0, _v2(LONG))
    _round(engine, 2, T0 + timedelta(seconds=1), policy)
    found = store.policy_in_force()
    assert found.record is not None and found.record.round_id == 1
    (skipped,) = found.skipped
    assert skipped.startswith("round 2: ") and reason in skipped, skipped
    # A process's row the same way: the one before it is in force, the bad one named.
    who = ServingProcess("serve", places=True)
    store.record_policy(who, SHORT, why=STARTED, now=T0 + timedelta(seconds=2))
    with engine.begin() as conn:
        conn.execute(
            insert(policies_t),
            {
                "recorded_at": T0 + timedelta(seconds=3),
                "instance": "x",
                "process": "serve",
                "places": True,
                "why": STARTED,
                "host": "h",
                "pid": 1,
                "interval_s": None,
                "policy": policy if isinstance(policy, str) else json.dumps(policy),
            },
        )
    found = store.policy_in_force()
    assert found.record is not None and found.record.policy == SHORT
    assert [s.split(":")[0] for s in found.skipped] == ["round 2", "serving policy 2"]
    # The command says which rows it could not read, and judges by the one in force.
    judged = judge(Settings.resolve("sqlite://", flags={}, env={}, cwd=tmp_path), found)
    assert judged.policy == SHORT
    assert "skipped, cannot be read: round 2: " in judged.text
    assert judged.json["skipped"] == list(found.skipped)


def test_with_nothing_readable_the_commands_own_settings_apply_and_it_says_so(
    engine: Engine, tmp_path: Path
) -> None:
    _round(engine, 1, T0, "{")
    found = SchedulerStore(engine).policy_in_force()
    assert found.record is None and len(found.skipped) == 1
    own = Settings.resolve("sqlite://", flags={}, env={"LLMGW_GRACE": "20s"}, cwd=tmp_path)
    judged = judge(own, found)
    assert judged.policy == own.policy
    assert judged.json["source"] == "settings"
    assert "own settings" in judged.text and "grace: env LLMGW_GRACE" in judged.text


def _rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(policies_t)).scalar_one())
