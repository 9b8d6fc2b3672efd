"""The scheduler's leadership lease on the real PostgreSQL: taken, renewed, lapsed, fenced.

Two ``LeaseLeadership`` objects on one database stand for two replicas. The lease's
deadline is the database's clock, so the tests wait (on state, with generous bounds)
for a short lease to lapse rather than moving any clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, select, text

from catalog import Catalog
from events.catalog_service import CatalogService
from events.database.connection import bounded_connect_args, bounded_engine
from events.storage.backends import open_log
from scheduler.daemon.leader import LeaseLeadership
from scheduler.daemon.round_runner import Placer
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.lease_store import LeadershipLost, read_lease
from scheduler.persistence.serving_policy import ServingProcess
from scheduler.persistence.store import SchedulerStore
from scheduler.persistence.tables import PlacementRoundRow, ServingPolicyRow, table
from scheduler.planner.fleet.inventory import parse_node_report
from tests.support import model

pytestmark = pytest.mark.postgres

LEASE_S = 1.0
TAKEOVER_LEASE_S = 60.0


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    engine = bounded_engine(pg_url, LEASE_S)
    yield engine
    engine.dispose()


def _placer(engine: Engine) -> Placer:
    declared = Catalog.build([model("llama", tp=4, scaling={"min": 2})])
    store = SchedulerStore(engine)
    node = {"name": "n1", "gpu_class": "A100", "gpus": 8, "memory_gb": 512}
    store.report([parse_node_report(node)], datetime.now(UTC))
    return Placer(CatalogService(open_log(engine), declared), store)


def _wait_until(check: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_one_replica_holds_the_lease_and_renews_it_in_the_same_epoch(pg_engine: Engine) -> None:
    a = LeaseLeadership(pg_engine, LEASE_S, holder="replica-a")
    b = LeaseLeadership(pg_engine, LEASE_S, holder="replica-b")
    assert a.ensure() and a.epoch == 1
    assert not b.ensure() and b.fence() is not None
    assert b.lease is not None and b.lease.holder == "replica-a"
    for _ in range(3):  # renewed inside the lease: same epoch, later deadline
        with pg_engine.connect() as conn:
            first = read_lease(conn)
        assert a.ensure() and a.epoch == 1
        with pg_engine.connect() as conn:
            again = read_lease(conn)
        assert first is not None and again is not None
        assert again.expires_at > first.expires_at and again.epoch == 1
        assert not b.ensure()


def test_a_lapsed_lease_is_taken_under_the_next_epoch_and_the_old_leaders_writes_are_refused(
    pg_engine: Engine,
) -> None:
    placer = _placer(pg_engine)
    old = LeaseLeadership(pg_engine, LEASE_S, holder="replica-a")
    # The new leader's own lease is long: its round below must not outlast it on a busy
    # machine (a 1 s lease lapsed under a round slowed by CPU load: LeadershipLost).
    new = LeaseLeadership(pg_engine, TAKEOVER_LEASE_S, holder="replica-b")
    assert old.ensure()
    frozen = old.fence()  # what the old leader will write under when it wakes
    assert frozen is not None and frozen.epoch == 1
    # The old leader stops renewing (frozen); the other takes over once the lease lapses.
    _wait_until(new.ensure, "the lease to lapse and the other replica to take it")
    assert new.epoch == 2
    assert not old.holds(), "the old leader's own clock says its lease lapsed"

    with pytest.raises(LeadershipLost, match="epoch 1"):
        placer.run(fence=frozen)
    with pg_engine.connect() as conn:
        assert conn.execute(select(table(PlacementRoundRow).c.id)).all() == []

    outcome = placer.run(fence=new.fence())
    assert outcome.round_id == 1
    rounds = table(PlacementRoundRow)
    with pg_engine.connect() as conn:
        written = conn.execute(select(rounds.c.leader, rounds.c.epoch)).all()
    assert [tuple(r) for r in written] == [("replica-b", 2)]
    # The old leader, awake, learns it lost: it does not lead and renews nothing.
    assert not old.ensure() and old.epoch is None


def test_an_old_leaders_serving_policy_record_is_fenced_too(pg_engine: Engine) -> None:
    """The round's first write, the serving policy a placer records when the policy in
    force is not its own, checks the lease like the others: an old leader woken with
    another policy must not make the CLI judge by a policy nothing places by."""
    placer = _placer(pg_engine)
    placer.serving = ServingProcess("serve", places=True, interval_s=1.0)
    placer.policy = StalenessPolicy(stale_after=timedelta(seconds=7))  # none recorded yet
    old = LeaseLeadership(pg_engine, LEASE_S, holder="replica-a")
    # The new leader's own lease is long: its round below must not outlast it on a busy
    # machine (a 1 s lease lapsed under a round slowed by CPU load: LeadershipLost).
    new = LeaseLeadership(pg_engine, TAKEOVER_LEASE_S, holder="replica-b")
    assert old.ensure()
    frozen = old.fence()
    assert frozen is not None
    _wait_until(new.ensure, "the lease to lapse and the other replica to take it")

    with pytest.raises(LeadershipLost, match="epoch 1"):
        placer.run(fence=frozen)
    policies = table(ServingPolicyRow)
    with pg_engine.connect() as conn:
        assert conn.execute(select(policies.c.id)).all() == [], "the old leader wrote a policy"

    placer.run(fence=new.fence())
    with pg_engine.connect() as conn:
        written = conn.execute(select(policies.c.why, policies.c.places)).all()
    assert [tuple(r) for r in written] == [("placing", True)]


def test_a_clean_release_hands_the_lease_over_at_once(pg_engine: Engine) -> None:
    a = LeaseLeadership(pg_engine, 60.0, holder="replica-a")
    b = LeaseLeadership(pg_engine, 60.0, holder="replica-b")
    assert a.ensure() and not b.ensure()
    a.release()
    assert b.ensure() and b.epoch == 2  # no wait for a 60 s lease
    assert not a.holds()


def test_the_leaders_own_clock_stops_it_before_the_database_would(pg_engine: Engine) -> None:
    now = [1000.0]
    a = LeaseLeadership(pg_engine, 30.0, holder="replica-a", clock=lambda: now[0])
    assert a.ensure() and a.holds()
    now[0] += 29.9
    assert a.holds()
    now[0] += 0.2  # a pause as long as the lease: it may have lapsed
    assert not a.holds()


def test_the_leaders_connections_carry_keepalives_and_timeouts(pg_url: str) -> None:
    engine = bounded_engine(pg_url, 4.0)
    try:
        with engine.connect() as conn:
            shown = {
                name: conn.execute(text(f"SHOW {name}")).scalar_one()
                for name in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                    "tcp_user_timeout",
                )
            }
    finally:
        engine.dispose()
    assert shown == {
        "statement_timeout": "4s",
        "lock_timeout": "4s",
        "idle_in_transaction_session_timeout": "2s",
        "tcp_user_timeout": "4000",  # (milliseconds, shown without a unit)
    }
    args = bounded_connect_args(4.0)
    assert args["keepalives"] == 1 and args["keepalives_idle"] == 2
    assert args["tcp_user_timeout"] == 4000


def test_a_frozen_leaders_open_transaction_cannot_hold_the_lease_past_its_timeout(
    pg_url: str,
) -> None:
    """A leader frozen inside a fenced write holds the lease row FOR SHARE: the server
    ends its idle transaction, and the takeover goes through."""
    engine = bounded_engine(pg_url, LEASE_S)
    other = bounded_engine(pg_url, LEASE_S)
    try:
        old = LeaseLeadership(engine, LEASE_S, holder="replica-a")
        assert old.ensure()
        fence = old.fence()
        assert fence is not None
        frozen = engine.connect()
        frozen.begin()
        fence(frozen)  # and then nothing: the process is stopped mid-transaction
        new = LeaseLeadership(other, LEASE_S, holder="replica-b")
        _wait_until(lambda: _try(new), "the takeover past the frozen transaction")
        assert new.epoch == 2
        frozen.invalidate()
    finally:
        engine.dispose()
        other.dispose()


def test_a_leader_frozen_while_reading_cannot_hold_the_lease_past_its_timeout(
    pg_url: str,
) -> None:
    """A leader frozen while a result was on its way (the server blocked writing to it,
    "active" in ClientWrite, which no statement or idle timeout ends) held the lease row
    FOR SHARE for as long as it stayed frozen: the replicas' chaos test saw both
    followers fail every round for a minute. The server's own tcp_user_timeout drops
    the connection; the takeover goes through within the bound."""
    engine = bounded_engine(pg_url, LEASE_S)
    other = bounded_engine(pg_url, LEASE_S)
    try:
        old = LeaseLeadership(engine, LEASE_S, holder="replica-a")
        assert old.ensure()
        fence = old.fence()
        assert fence is not None
        frozen = engine.connect()
        frozen.begin()
        fence(frozen)
        # A result far larger than both sockets' buffers, sent and never read: from the
        # server's side, exactly a process stopped mid-read (its kernel still answers).
        raw = frozen.connection.dbapi_connection
        assert raw is not None
        raw.pgconn.send_query(b"SELECT repeat('x', 1000) FROM generate_series(1, 200000)")
        new = LeaseLeadership(other, LEASE_S, holder="replica-b")
        started = time.monotonic()
        _wait_until(lambda: _try(new), "the takeover past the stalled reader", timeout=30)
        assert new.epoch == 2
        # The lease (1 s) plus the server's tcp_user_timeout (1 s) and a lock wait, with
        # room for a loaded machine; held for as long as the reader stalled before.
        assert time.monotonic() - started < 20
        frozen.invalidate()
    finally:
        engine.dispose()
        other.dispose()


def _try(leadership: LeaseLeadership) -> bool:
    try:
        return leadership.ensure()
    except Exception:  # a lock timeout while the frozen transaction lives: try again
        return False


def test_every_connection_of_the_command_line_and_serve_ends_an_idle_transaction(
    pg_url: str,
) -> None:
    """A replica frozen mid-transaction (an agent's report half written) held the node's
    row, and every other replica's report of that node waited on it until it woke."""
    from llmgw.cli.shared.context import open_engine

    engine = open_engine(pg_url)
    try:
        with engine.connect() as conn:
            shown = conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar_one()
            stalled = conn.execute(text("SHOW tcp_user_timeout")).scalar_one()
    finally:
        engine.dispose()
    assert shown == "5s"
    assert stalled == "10000"  # milliseconds
