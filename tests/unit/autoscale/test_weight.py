"""The routing weight in the placements view: declared wins, else measured, else 1."""

from __future__ import annotations

from datetime import UTC, datetime

from catalog import Catalog
from llmgw.views import replica_json
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.planner.fleet.placements import Placement
from tests.support import model

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def _weight(profile: dict[str, object], measured: dict[tuple[str, str], float]) -> object:
    m = model("chat", profiles=[{"name": "p", "gpu_class": "A100", **profile}])
    p = Placement("chat", 0, "p", ("n1",), 1, "A100")
    status = ReplicaStatus("ready", NOW, NOW)
    catalog = Catalog.build([m])
    return replica_json(p, catalog, status, m.engine_profile("p"), measured)["weight"]


def test_a_measured_capacity_is_the_weight_unless_the_profile_declares_one() -> None:
    assert _weight({}, {}) == 1.0
    assert _weight({}, {("chat", "p"): 12.0}) == 12.0
    assert _weight({"weight": 3}, {("chat", "p"): 12.0}) == 3.0
    assert _weight({}, {("chat", "other"): 12.0}) == 1.0
