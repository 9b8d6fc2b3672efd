"""The JSON users see (llmgw.views, printed by the CLI's --json and answered by the API)
and the CLI's tables (llmgw.cli.shared.tables): each shape is built in one place."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from catalog import Catalog
from events.core.types import StoredEvent
from events.write.commands import CommandResult
from llmgw.cli.shared.tables import catalog_table
from llmgw.views import (
    catalog_json,
    command_json,
    iso,
    node_json,
    placed_replica_json,
    placement_json,
    replica_json,
    service_change_json,
    unplaced_json,
)
from scheduler.daemon.node_service import ServiceChange
from scheduler.lifecycle.inputs import Cordon
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Placement, Unplaced
from tests.unit.catalog.catalog_builders import cpu_profile, gpu_profile, model

NOW = datetime(2026, 12, 3, 9, 30, tzinfo=UTC)
POLICY = StalenessPolicy(stale_after=timedelta(seconds=90), grace=timedelta(minutes=5))


def test_times_are_utc_with_a_z() -> None:
    east = timezone(timedelta(hours=2))
    assert iso(datetime(2026, 12, 3, 11, 30, 0, 5, tzinfo=east)) == "2026-12-03T09:30:00.000005Z"


def test_a_node_row_says_its_freshness_and_its_service() -> None:
    node = Node("gpu-7", "T4", 4, 128.0, NOW - timedelta(seconds=100), {"zone": "a"}, "ib", 1)
    cordon = Cordon("gpu-7", "draining", "alice", "kernel update", NOW)
    assert node_json(node, NOW, POLICY, cordon, 2) == {
        "name": "gpu-7",
        "gpu_class": "T4",
        "gpus": 4,
        "gpus_reserved": 1,
        "memory_gb": 128.0,
        "labels": {"zone": "a"},
        "fabric": "ib",
        "reported_at": "2026-12-03T09:28:20Z",
        "stale": True,
        "state": "stale",
        "service": "draining (2 replicas left)",
        "cordon": {
            "mode": "draining",
            "actor": "alice",
            "reason": "kernel update",
            "since": "2026-12-03T09:30:00Z",
        },
        "replicas": 2,
    }
    fresh = node_json(Node("cpu-1", None, 0, None, NOW), NOW, POLICY)
    assert (fresh["stale"], fresh["state"], fresh["service"], fresh["cordon"]) == (
        False,
        "fresh",
        "-",
        None,
    )


def test_a_service_change_has_the_apis_shape_for_the_cli_too() -> None:
    before = Cordon("gpu-7", "cordoned", "bob", "fan alarm", NOW)
    again = service_change_json(ServiceChange("gpu-7", "cordon", before, False, 3))
    assert again == {
        "node": "gpu-7",
        "action": "cordon",
        "mode": "cordoned",
        "changed": False,
        "replicas_left": 3,
        "detail": "node gpu-7 is already cordoned; nothing recorded",
        "previous": {
            "mode": "cordoned",
            "actor": "bob",
            "reason": "fan alarm",
            "since": "2026-12-03T09:30:00Z",
        },
    }
    back = service_change_json(ServiceChange("gpu-7", "uncordon", before, True, 0))
    assert (back["mode"], back["changed"]) == (None, True)


def test_a_replica_is_its_placement_its_state_and_what_its_agent_starts() -> None:
    catalog = Catalog.build([model("coder", profiles=[gpu_profile("t4", gpu_class="T4")])])
    p = Placement("coder", 0, "t4", ("gpu-7",), 1, "T4", 16, "f00d")
    assert placement_json(p) == {
        "model": "coder",
        "replica": 0,
        "profile": "t4",
        "nodes": ["gpu-7"],
        "gpus_per_node": 1,
        "gpu_class": "T4",
        "fingerprint": "f00d",
        "version": "",
        "moving": "",
    }
    status = ReplicaStatus("ready", NOW, NOW, "", "http://gpu-7:8000")
    # `llmgw placements --json`: the placement and its state.
    assert placed_replica_json(p, status) == {
        **placement_json(p),
        "state": "ready",
        "state_since": "2026-12-03T09:30:00Z",
        "endpoint": "http://gpu-7:8000",
        "message": "",
    }
    # GET /v1/placements: also what the agent starts.
    coder = catalog.resolve("coder")
    assert coder is not None
    row = replica_json(p, catalog, status, coder.engine_profile("t4"))
    # The routing weight in force: the profile declares none and nothing was measured;
    # what one request may use on the engine: not known yet.
    assert row == {
        **placed_replica_json(p, status),
        "engine": row["engine"],
        "weight": 1.0,
        "effective_context_length": None,
        "context_detail": "",
        "context_warning": None,
    }
    assert row["engine"]["engine"] == "vllm" and row["engine"]["served_model_name"] == "coder"
    assert isinstance(row["engine"]["env"], dict)
    # A replica whose model has left the catalog is still listed (it is being removed).
    gone = replica_json(
        p, Catalog.build([]), ReplicaStatus("placed", NOW, NOW, reported=False), None
    )
    assert (gone["engine"], gone["state"]) == (None, "unreported")


def test_an_unplaced_replica_says_why() -> None:
    assert unplaced_json(Unplaced("coder", 1, "no T4 free", ())) == {
        "model": "coder",
        "replica": 1,
        "reason": "no T4 free",
    }


def test_a_catalog_entry_is_the_full_definition_and_whether_it_is_declared() -> None:
    catalog = Catalog.build([model("coder", aliases=["c"])])
    (entry,) = catalog_json(catalog)
    assert entry == {**catalog.models()[0].to_definition(), "declared": True}
    assert entry["name"] == "coder" and entry["aliases"] == ["c"]


# Moved from tests/unit/catalog/test_catalog_build.py with Catalog.render (now the CLI's).
def test_the_table_lists_each_model_and_its_profiles_for_llmgw_models() -> None:
    catalog = Catalog.build(
        [
            model(
                "llama-70b",
                aliases=["llama", "big"],
                scaling={"min": 2, "max": 4},
                profiles=[
                    gpu_profile("h100-tp8", gpu_class="H100", tp=8, priority=10),
                    gpu_profile("a100-2n", tp=8, nodes=2),
                ],
            ),
            model("tiny", profiles=[cpu_profile("cpu")]),
        ]
    )
    assert catalog_table(catalog) == (
        "llama-70b (min 2, max 4) [declared] aliases=llama,big\n"
        "  h100-tp8             vllm       H100         tp=8 nodes=1 priority=10\n"
        "  a100-2n              vllm       A100         tp=8 nodes=2 priority=0\n"
        "tiny (min 0, max 1) [declared]\n"
        "  cpu                  llamacpp   -            tp=1 nodes=1 priority=0\n"
    )


def test_render_marks_runtime_models() -> None:
    assert catalog_table(Catalog.build([model("x")], declared=False)).startswith(
        "x (min 0, max 1) [runtime]\n"
    )


def test_an_empty_catalog_renders_as_nothing() -> None:
    assert catalog_table(Catalog.build([])) == ""


def test_an_add_or_remove_answers_its_events_in_full_and_the_last_position() -> None:
    event = StoredEvent(
        position=7,
        event_id="e-7",
        command_id="c-7",
        type="model.removed",
        schema_version=1,
        model="coder",
        payload='{"name": "coder"}',
        actor="alice",
        reason="trial over",
        recorded_at=NOW,
    )
    assert command_json(CommandResult((event,), already_recorded=True, attempts=1)) == {
        "already_recorded": True,
        "events": [
            {
                "position": 7,
                "event_id": "e-7",
                "command_id": "c-7",
                "type": "model.removed",
                "schema_version": 1,
                "model": "coder",
                "actor": "alice",
                "reason": "trial over",
                "recorded_at": "2026-12-03T09:30:00Z",
                "payload": {"name": "coder"},
            }
        ],
        "position": 7,
    }
