"""The node's placements as the agent reads them: strict, bounded, newer fields ignored."""

from __future__ import annotations

from typing import Any

import pytest

from agent.placements import MAX_PLACEMENTS, Key, PlacementsError, parse_placements


def entry(model: str = "m", replica: int = 0, nodes: tuple[str, ...] = ("n1",), **kw: Any) -> Any:
    return {
        "model": model,
        "replica": replica,
        "profile": "p",
        "nodes": list(nodes),
        "gpus_per_node": 1,
        "gpu_class": "T4",
        "engine": {
            "name": "p",
            "engine": "vllm",
            "gpu_class": "T4",
            "tp": 1,
            "pp": 0,
            "gpus_per_node": 1,
            "nodes": 1,
            "args": ["--max-model-len", "4096"],
            "env": {"HF_HOME": "/data"},
            "model_path": "org/m",
            "served_model_name": model,
        },
        **kw,
    }


def test_a_placement_becomes_what_to_run_with_its_engine_view() -> None:
    (w,) = parse_placements([entry(state="placed", endpoint=None, new_field=1)], "n1")
    assert w.key == Key("m", 0) and w.gpus == 1 and not w.worker
    assert w.launch is not None and w.launch.args == ("--max-model-len", "4096")
    assert w.server_state == "placed"


def test_every_node_of_a_multi_node_replica_runs_its_rank_and_workers_follow_the_head() -> None:
    placed = entry(nodes=("n1", "n2", "n3"), endpoint="http://10.0.0.1:8000")
    (head,) = parse_placements([placed], "n1")
    (worker,) = parse_placements([placed], "n3")
    assert (head.rank, head.nnodes, head.worker, head.head_endpoint) == (0, 3, False, None)
    assert (worker.rank, worker.head, worker.head_endpoint) == (2, "n1", "http://10.0.0.1:8000")
    # The head's own fingerprint ignores its endpoint (reporting it must not restart it);
    # a worker's follows it, so a head that moves takes its workers along.
    assert (
        head.fingerprint == parse_placements([entry(nodes=("n1", "n2", "n3"))], "n1")[0].fingerprint
    )
    moved = parse_placements([{**placed, "endpoint": "http://10.0.0.1:9000"}], "n3")[0]
    assert moved.fingerprint != worker.fingerprint


def test_placements_of_other_nodes_are_ignored() -> None:
    assert parse_placements([entry(nodes=("n9",))], "n1") == []


def test_a_changed_profile_changes_the_fingerprint() -> None:
    a = parse_placements([entry()], "n1")[0]
    changed = entry()
    changed["engine"]["args"] = []
    b = parse_placements([changed], "n1")[0]
    assert a.fingerprint != b.fingerprint
    assert a.fingerprint == parse_placements([entry()], "n1")[0].fingerprint


def test_a_replica_whose_model_left_the_catalog_has_nothing_to_launch() -> None:
    (w,) = parse_placements([entry(engine=None)], "n1")
    assert w.launch is None


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"not": "a list"}, "not a list"),
        ([{**entry(), "replica": "0"}], "placement 0: replica"),
        ([entry(), {"model": "m"}], "placement 1: replica"),
        ([entry(nodes=())], "placement 0: nodes"),
        ([entry(gpus_per_node=-1)], "placement 0: gpus_per_node"),
        ([entry()] * (MAX_PLACEMENTS + 1), "lists 4097 replicas"),
    ],
)
def test_a_malformed_answer_is_refused_whole(data: Any, said: str) -> None:
    with pytest.raises(PlacementsError, match=said):
        parse_placements(data, "n1")
