"""`llmgw nodes`, `place` and `placements` as agents, operators and scripts drive them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cli import Cli

DECLARED = {
    "models": [
        {
            "name": "llama-70b",
            "source": "meta-llama/Llama-3.1-70B-Instruct",
            "scaling": {"min": 2},
            "profiles": [
                {
                    "name": "a100-tp8",
                    "gpu_class": "A100",
                    "tp": 8,
                    "priority": 10,
                    "node_selector": {"zone": "eu"},
                },
                {"name": "t4-2x4", "gpu_class": "T4", "tp": 8, "nodes": 2, "priority": 1},
            ],
        },
        {
            "name": "qwen-0.5b",
            "source": "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            "scaling": {"min": 1},
            "profiles": [{"name": "cpu", "engine": "llamacpp", "min_memory_gb": 8}],
        },
    ]
}
NODES = [
    {"name": "a100-eu", "gpu_class": "A100", "gpus": 8, "labels": {"zone": "eu"}},
    {"name": "a100-us", "gpu_class": "A100", "gpus": 8, "labels": {"zone": "us"}},
    {"name": "t4-a", "gpu_class": "T4", "gpus": 4, "fabric": "eth-7", "memory_gb": 64},
    {"name": "t4-b", "gpu_class": "T4", "gpus": 4, "fabric": "eth-7", "memory_gb": 64},
    {"name": "cpu-1", "gpus": 0, "memory_gb": 4},
]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    cli = Cli(tmp_path, f"sqlite:///{tmp_path / 'llmgw.db'}")
    cli.write("catalog.yaml", DECLARED)
    return cli


def test_place_puts_each_replica_where_it_fits_and_explains_the_rest(cli: Cli) -> None:
    assert cli("nodes", "report", cli.write("nodes.yaml", {"nodes": NODES})).returncode == 0
    listed = cli.json("nodes", "list")
    assert {n["name"] for n in listed} == {n["name"] for n in NODES}
    assert all(n["stale"] is False and n["reported_at"] for n in listed)

    dry = cli.json("place", "--dry-run")
    assert cli.json("placements") == []  # a dry run writes nothing
    placed = cli.json("place")
    assert placed["placements"] == dry["placements"]
    by_replica = {(p["model"], p["replica"]): p for p in placed["placements"]}
    # The preferred profile where its selector matches; the gang on a shared fabric next.
    assert by_replica[("llama-70b", 0)]["nodes"] == ["a100-eu"]
    assert by_replica[("llama-70b", 1)]["profile"] == "t4-2x4"
    assert sorted(by_replica[("llama-70b", 1)]["nodes"]) == ["t4-a", "t4-b"]
    assert set(by_replica[("llama-70b", 0)]) == {
        "model",
        "replica",
        "profile",
        "nodes",
        "gpus_per_node",
        "gpu_class",
        "fingerprint",
        "version",
        "moving",
    }
    # The CPU model needs 8 GB and the CPU node has 4: it lands on a GPU node with the
    # memory (or unknown memory), without taking a card.
    qwen = by_replica[("qwen-0.5b", 0)]
    assert qwen["gpu_class"] is None and qwen["gpus_per_node"] == 0
    assert qwen["nodes"] != ["cpu-1"]
    state_keys = {"state", "state_since", "endpoint", "message"}
    state_keys |= {"effective_context_length", "context_detail", "context_warning"}
    listed_now = cli.json("placements")
    assert [{k: v for k, v in p.items() if k not in state_keys} for p in listed_now] == placed[
        "placements"
    ]
    # No agent has reported replica states: each counts as unreported (and so as ready).
    assert {p["state"] for p in listed_now} == {"unreported"}
    assert cli.json("place")["placed"] == []  # stable: nothing moves


def test_an_unplaceable_replica_is_reported_with_counts_of_why(cli: Cli) -> None:
    cli("nodes", "report", cli.write("one.yaml", NODES[1]))
    result = cli.json("place", "--dry-run")
    reasons = {(u["model"], u["replica"]): u["reason"] for u in result["unplaced"]}
    assert "profile a100-tp8: 0/1 nodes fit" in reasons[("llama-70b", 0)]
    assert "zone=eu" in reasons[("llama-70b", 0)]
    assert "profile t4-2x4" in reasons[("llama-70b", 0)]


def test_a_bad_node_report_is_refused_whole_and_names_the_node_and_field(cli: Cli) -> None:
    bad = [NODES[0], {"name": "gpu-9", "gpu_class": "A100", "gpus": 4, "gpus_reserved": 6}]
    done = cli("nodes", "report", cli.write("bad.yaml", bad))
    assert done.returncode == 1
    assert 'node "gpu-9"' in done.stderr and "gpus_reserved" in done.stderr
    typo = cli("nodes", "report", cli.write("typo.yaml", {"name": "n", "gpu": 2}))
    assert typo.returncode == 1 and "gpu" in typo.stderr
    assert cli.json("nodes", "list") == []


def test_history_shows_placement_events_beside_catalog_events(cli: Cli) -> None:
    cli("nodes", "report", cli.write("nodes.yaml", {"nodes": NODES}))
    cli.write("trial.yaml", {**DECLARED["models"][1], "name": "trial"})
    assert cli("add", "trial.yaml", "--actor", "alice").returncode == 0
    cli.json("place")
    merged = cli.json("history", "--placements")
    logs = [(e["log"], e["type"]) for e in merged]
    assert logs[0] == ("catalog", "model.added")
    placed = [e for e in merged if e["log"] == "placements"]
    assert {e["type"] for e in placed} == {"placement.placed"}
    assert {e["model"] for e in placed} == {"llama-70b", "qwen-0.5b", "trial"}
    assert all(e["actor"] == "scheduler" and "round 1" in e["reason"] for e in placed)
    only_trial = cli.json("history", "--placements", "--model", "trial")
    assert [(e["log"], e["type"]) for e in only_trial] == [
        ("catalog", "model.added"),
        ("placements", "placement.placed"),
    ]
    assert "log" not in cli.json("history")[0]


def test_place_dry_run_shows_the_moves_that_make_room_and_the_switch_turns_them_off(
    tmp_path: Path,
) -> None:
    cli = Cli(tmp_path, f"sqlite:///{tmp_path / 'llmgw.db'}")
    small = {
        "name": "small",
        "source": "sim/small",
        "scaling": {"min": 4},
        "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 1}],
    }
    cli.write("catalog.yaml", {"models": [small]})
    nodes = [{"name": f"t{i}", "gpu_class": "T4", "gpus": 2} for i in range(4)]
    assert cli("nodes", "report", cli.write("nodes.yaml", {"nodes": nodes})).returncode == 0
    assert cli("place").returncode == 0  # one a node: one card free on each
    big = {**small, "name": "big", "scaling": {"min": 1}}
    big["profiles"] = [{"name": "t4x2", "gpu_class": "T4", "tp": 2}]
    cli.write("big.yaml", big)
    assert cli("add", "big.yaml").returncode == 0
    dry = cli.json("place", "--dry-run")
    (move,) = dry["moves"]
    assert move["model"] == "small" and move["copy"] == 4
    assert move["reason"] == f"to make room for model big, profile t4x2 on node {move['from'][0]}"
    assert [p["replica"] for p in dry["moving"]] == [move["replica"]]
    text = cli("place", "--dry-run").stdout
    assert f"moves to {move['to']} as replica 4, surge-first: {move['reason']}" in text
    off = cli.json("place", "--dry-run", "--no-defragment")
    assert off["moves"] == [] and len(off["unplaced"]) == 1
    assert cli.json("placements") and not any(p["moving"] for p in cli.json("placements"))
