"""A round whose plan is written but whose outcome write fails (the database lost
between the two transactions): the round stands, its placements are logged as placed,
and the next round records the outcome."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text
from structlog.testing import capture_logs

from catalog import Catalog
from events.catalog_service import CatalogService
from events.database.connection import make_engine
from events.storage.backends import open_log
from scheduler.daemon.leader import ProcessLeadership
from scheduler.daemon.loop import Daemon
from scheduler.daemon.round_runner import Placer
from scheduler.persistence.outcome_store import Outcome
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.inventory import parse_node_report
from tests.support import model

# A real failure of the real database, for the outcome's write alone.
FAIL_OUTCOME = [
    "CREATE TRIGGER fail_insert BEFORE INSERT ON placement_outcome "
    "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END",
    "CREATE TRIGGER fail_update BEFORE UPDATE ON placement_outcome "
    "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END",
]


def test_a_written_round_whose_outcome_fails_is_logged_as_placed_and_recorded_later(
    sqlite_url: str,
) -> None:
    engine = make_engine(sqlite_url)
    try:
        store = SchedulerStore(engine)
        node = parse_node_report({"name": "n1", "gpu_class": "A100", "gpus": 4, "address": "n1"})
        store.report([node], datetime.now(UTC))  # the daemon's rounds plan at now
        # Two replicas of 4 GPUs on one node of 4: one placed, one unplaced (an outcome).
        declared = Catalog.build([model("llama", tp=4, scaling={"min": 2})])
        placer = Placer(CatalogService(open_log(engine), declared), store)
        with engine.begin() as conn:
            for statement in FAIL_OUTCOME:
                conn.execute(text(statement))
        daemon = Daemon(placer, ProcessLeadership(), interval=1.0)
        with capture_logs() as logs:
            daemon.round()
        events = [e["event"] for e in logs]
        assert "placement.round_failed" not in events, logs
        placed = [(e["model"], e["replica"]) for e in logs if e["event"] == "placement.placed"]
        assert placed == [("llama", 0)], logs
        (unrecorded,) = [e for e in logs if e["event"] == "placement.outcome_unrecorded"]
        assert "disk I/O error" in unrecorded["error"]
        assert store.outcome() is None  # nothing recorded yet
        assert [p.replica for p, _ in store.replicas(model="llama")] == [0]

        with engine.begin() as conn:
            conn.execute(text("DROP TRIGGER fail_insert"))
            conn.execute(text("DROP TRIGGER fail_update"))
        store.report([node], datetime.now(UTC))
        with capture_logs() as logs:
            daemon.round()
        assert not [e for e in logs if e["event"] == "placement.outcome_unrecorded"], logs
        outcome = store.outcome()
        assert isinstance(outcome, Outcome), outcome
        assert [u.replica for u in outcome.unplaced] == [1], outcome
    finally:
        engine.dispose()
