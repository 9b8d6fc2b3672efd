"""Defragmentation with a real daemon and real agents (issue 29): surge-first, within budgets.

A real `llmgw serve --with-scheduler` and eight real `llmgw agent`s of eight pretend
cards each. Eight one-card replicas of ``small`` spread one a node: 56 cards are free,
yet a tensor-parallel-8 replica of ``big`` fits on no node. While ``small`` says
``disruption: {movable: false}`` it is never moved, and ``llmgw explain big`` names that
budget. Once the operator allows moves (``llmgw apply`` without the field), the round
moves one replica of ``small`` (the fewest: one node had one card taken), surge-first:
its copy starts elsewhere and reports ready before the old one stops. A sampler watches
``small`` from the outside every 200 ms (ready in the API and answering ``/health``): it
never has fewer than its ``scaling.min`` such replicas.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.agents import cluster, eventually
from tests.e2e.test_rollout import Sampler

pytestmark = pytest.mark.slow

NODES = [f"n{i}" for i in range(8)]
ROUNDS = ["--with-scheduler", "--interval", "0.3"]


def sim(name: str, tp: int, replicas: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"sim/{name}",
        "scaling": {"min": replicas},
        "profiles": [
            {
                "name": f"sim{tp}",
                "engine": "sim",
                "gpu_class": "SIM",
                "tp": tp,
                # Long enough that stopping the old copy first would leave a visible hole.
                "args": ["--startup-delay", "2"],
            }
        ],
        **extra,
    }


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "llmgw.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


def test_a_tp8_replica_is_placed_by_the_fewest_surge_first_moves_within_the_budget(
    tmp_path: Path, sqlite_url: str
) -> None:
    pinned = sim("small", 1, 8, disruption={"movable": False})
    with cluster(tmp_path, sqlite_url, NODES, models=[], server_args=ROUNDS) as c:
        for name in NODES:
            c.agent(name, gpus="SIM:8")
        # Every node reports before small is added, so that its replicas spread.
        eventually(lambda: len(c.cli.json("nodes", "list")) == 8 or None, "8 nodes", 120)
        c.add(pinned)
        ready = eventually(lambda: c.ready("small", 8), "8 small replicas ready", 180)
        assert len({tuple(p["nodes"]) for p in ready}) == 8  # spread: one a node

        # 1. The budget forbids moves: big stays unplaced, small is never moved.
        c.add(sim("big", 8, 1))
        position = c.cli.json("history")[-1]["position"]

        def explained() -> dict[str, Any] | None:
            story = c.cli.json("explain", "big")
            (replica,) = story["replicas"]
            return story if replica["outcome"] == "unplaced" else None

        story = eventually(explained, "big explained as unplaced")
        why = story["replicas"][0]["why"]
        assert "the disruption budget of small (disruption.movable is false) stood in the way" in (
            why
        ), why
        dry = c.cli.json("place", "--dry-run")
        assert dry["moves"] == [] and dry["moving"] == []
        assert any("disruption.movable is false" in u["reason"] for u in dry["unplaced"])
        # Rounds go by (0.3 s apart): still nothing moved.
        time.sleep(2)
        assert c.cli.json("history", "--placements", "--model", "small")
        assert {
            (p["replica"], tuple(p["nodes"])) for p in c.placements() if p["model"] == "small"
        } == {(p["replica"], tuple(p["nodes"])) for p in ready}
        assert not [p for p in c.placements() if p["model"] == "big"]
        assert position >= 0

        # 2. The operator allows moves: one surge-first move makes room for big.
        allowed = c.cli.write("small.yaml", sim("small", 1, 8))
        with Sampler(c, "small").watching() as sampler:
            done = c.cli("apply", allowed, "--reason", "let the scheduler move small")
            assert done.returncode == 0, done.stderr
            placed = eventually(lambda: c.ready("big", 1), "big placed and ready", 180)
            sampler.settle()
        assert sampler.during >= 3, sampler.samples  # it looked while the change ran
        assert min(sampler.samples) >= 8, sampler.samples  # never below scaling.min

        events = c.cli.json("history", "--placements")
        moved = [
            e
            for e in events
            if e.get("log") == "placements" and "to make room for model big" in e.get("reason", "")
        ]
        (node,) = placed[0]["nodes"]
        reason = f"to make room for model big, profile sim8 on node {node}"
        kinds = [(e["type"], e["model"]) for e in moved]
        # The fewest moves: one replica marked, its copy placed, then the old one removed.
        assert kinds.count(("placement.placed", "small")) == 1, kinds
        assert kinds.count(("placement.removed", "small")) == 1, kinds
        assert all(reason in e["reason"] for e in moved), moved
        order = [e["type"] for e in moved]
        assert order.index("placement.placed") < order.index("placement.removed"), order
        smalls = [p for p in c.placements() if p["model"] == "small"]
        assert len(smalls) == 8 and all(p["state"] == "ready" for p in smalls)
        assert all(node not in p["nodes"] for p in smalls)
        assert not any(p["moving"] for p in c.placements())
        # The daemon logged the move it started, with its reason.
        logged = [
            json.loads(x)
            for x in c.server.log_text().splitlines()
            if x.startswith("{") and '"placement.move_started"' in x
        ]
        assert [(x["model"], x["reason"]) for x in logged] == [("small", reason)], logged


def test_a_spread_worsened_by_a_node_loss_is_repaired_surge_first_when_the_node_returns(
    tmp_path: Path, sqlite_url: str
) -> None:
    pair = sim("pair", 1, 2, disruption={"repair_spread": True})
    # Another class of card: only n2 can run fill, and pair never lands on n2.
    fill = sim("fill", 1, 1)
    fill["profiles"] = [{**fill["profiles"][0], "gpu_class": "OTHER"}]
    # A node silent 1 s is stale, 1 s later lost: the loss happens within the test.
    args = [*ROUNDS, "--stale-after", "1s", "--grace", "1s"]
    with cluster(tmp_path, sqlite_url, ["n0", "n1", "n2"], models=[], server_args=args) as c:
        c.agent("n0", gpus="SIM:2")
        c.agent("n1", gpus="SIM:2")
        eventually(lambda: len(c.cli.json("nodes", "list")) == 2 or None, "2 nodes", 120)
        c.add(pair)

        def spread() -> list[dict[str, object]] | None:
            # (One on each node. A report late by over the test's 1 s stale-after on a
            # loaded machine once left n0 stale for the first round, and both replicas
            # went to n1; the spread repair moves one back once n0 is fresh.)
            ready = c.ready("pair", 2)
            on = sorted(p["nodes"][0] for p in ready) if ready else None
            return ready if on == ["n0", "n1"] else None

        eventually(spread, "2 pair replicas ready, one on n0 and one on n1", 180)
        # n2 runs fill (so that the loss of n1 is not most of the nodes hosting replicas);
        # when n1 goes, n0 is the only room pair has left.
        c.agent("n2", gpus="OTHER:1")
        c.add(fill)
        eventually(lambda: c.ready("fill", 1), "fill ready", 180)

        # n1 is lost: its agent and engines die; pair[.] is placed again on n0.
        c.agents["n1"].stop(signal.SIGKILL)
        c.agents["n1"].kill_engines()
        both = eventually(
            lambda: (
                ps if (ps := c.ready("pair", 2)) and {p["nodes"][0] for p in ps} == {"n0"} else None
            ),
            "both pair replicas on n0",
            180,
        )
        assert len(both) == 2

        # n1 returns: one surge-first move repairs the spread; pair never below 2 ready.
        with Sampler(c, "pair").watching() as sampler:
            c.agent("n1", gpus="SIM:2")
            repaired = eventually(
                lambda: (
                    ps
                    if (ps := c.ready("pair", 2))
                    and sorted(p["nodes"][0] for p in ps) == ["n0", "n1"]
                    else None
                ),
                "pair spread over n0 and n1 again",
                180,
            )
            sampler.settle()
        assert len(repaired) == 2
        assert sampler.during >= 3, sampler.samples  # it looked while the change ran
        assert min(sampler.samples) >= 2, sampler.samples
        events = c.cli.json("history", "--placements", "--model", "pair")
        said = [e for e in events if "to repair the spread of model pair" in e.get("reason", "")]
        assert {e["type"] for e in said} >= {"placement.placed", "placement.removed"}, said
        assert all("2 of its replicas share node n0" in e["reason"] for e in said), said
