"""Mass-loss protection is loud: a warning line names the nodes, and the metric counts."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.api.telemetry.metrics import held_by_mass_loss
from scheduler.planner.fleet.placements import Placement, Plan
from tests.e2e.cli import Cli

NODES = {
    "nodes": [
        {"name": "gpu-1", "gpu_class": "T4", "gpus": 2, "memory_gb": 64},
        {"name": "gpu-2", "gpu_class": "T4", "gpus": 2, "memory_gb": 64},
    ]
}
MODEL = {
    "name": "pair",
    "source": "org/pair",
    "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 2}],
    "scaling": {"min": 2},
}


def test_a_round_that_holds_replicas_on_lost_nodes_logs_a_warning(
    tmp_path: Path, sqlite_url: str
) -> None:
    cli = Cli(tmp_path, sqlite_url)
    assert cli("nodes", "report", cli.write("nodes.yaml", NODES)).returncode == 0
    assert cli("add", cli.write("m.yaml", MODEL)).returncode == 0
    assert len(cli.json("place")["placed"]) == 2
    # With no grace at all, both nodes look lost the moment after they reported: all the
    # hosting nodes at once, which protection reads as our failure, not theirs.
    cli.env["LLMGW_LOG_LEVEL"] = "INFO"
    done = cli("daemon", "--once", "--stale-after", "0s", "--grace", "0s")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in done.stderr.splitlines() if x.startswith("{")]
    (held,) = [x for x in lines if x["event"] == "placement.mass_loss_held"]
    assert held["level"] == "warning"
    assert held["lost_nodes"] == ["gpu-1", "gpu-2"] and held["held"] == 2
    assert len(cli.json("placements")) == 2  # kept, not moved


def test_the_held_replicas_count_only_what_protection_kept() -> None:
    def on(model: str, node: str) -> Placement:
        return Placement(model, 0, "t4", (node,), 1, "T4")

    kept = (on("a", "gpu-1"), on("b", "gpu-3"))
    held = Plan(keep=kept, place=(), remove=(), unplaced=(), mass_loss=True, lost_nodes=("gpu-1",))
    assert held_by_mass_loss(held) == 1
    calm = Plan(keep=kept, place=(), remove=(), unplaced=())
    assert held_by_mass_loss(calm) == 0
