"""The vLLM command line the agent builds, held to the flags vLLM documents.

No vLLM runs here (it needs a card); its `vllm serve` options are recorded in
tests/data/vllm_serve_flags.json with their sources and version, and every
command line the adapter can build (one node, pipeline parallel, the head and a
worker of a replica spanning nodes) must use only those, a value after each
option that takes one and none after a switch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.engines import Gang, Launch, command

FLAGS = json.loads((Path(__file__).parents[2] / "data" / "vllm_serve_flags.json").read_text())
VALUE = frozenset(FLAGS["value"])
SWITCH = frozenset(FLAGS["switch"])


def check_argv(argv: tuple[str, ...]) -> None:
    assert argv[:2] == ("vllm", "serve")
    assert not argv[2].startswith("-"), "the model comes first, as model_tag"
    i = 3
    while i < len(argv):
        flag = argv[i]
        assert flag in VALUE | SWITCH, f"{flag} is not an option of vllm serve"
        if flag in SWITCH:
            i += 1
            continue
        assert i + 1 < len(argv) and not argv[i + 1].startswith("--"), f"{flag} needs a value"
        i += 2


def vllm(**kwargs: object) -> Launch:
    base: dict[str, object] = {
        "engine": "vllm",
        "profile": "a100",
        "model_path": "meta-llama/Llama-3.1-70B-Instruct",
        "served_model_name": "llama-70b",
    }
    return Launch(**{**base, **kwargs})  # type: ignore[arg-type]


def test_the_record_names_the_multi_node_flags_the_adapter_relies_on() -> None:
    assert {"--nnodes", "--node-rank", "--master-addr", "--master-port"} <= VALUE
    assert "--headless" in SWITCH
    assert {"--host", "--port", "--served-model-name", "--tensor-parallel-size"} <= VALUE


def test_one_node_and_pipeline_parallel() -> None:
    check_argv(command(vllm(tp=8), host="0.0.0.0", port=8000, devices=range(8)).argv)
    check_argv(command(vllm(tp=4, pp=2), host="0.0.0.0", port=8000, devices=range(4)).argv)


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_each_node_of_a_replica_spanning_nodes(rank: int) -> None:
    gang = Gang(rank=rank, nnodes=4, master_addr="10.0.0.7", master_port=29501)
    argv = command(
        vllm(tp=8, pp=4, nodes=4), host="0.0.0.0", port=8000, devices=range(8), gang=gang
    ).argv
    check_argv(argv)
    assert ("--headless" in argv) == (rank > 0)


@given(
    tp=st.integers(1, 64),
    pp=st.integers(0, 16),
    nnodes=st.integers(1, 8),
    rank=st.integers(0, 7),
    args=st.lists(st.sampled_from(["--max-model-len", "--gpu-memory-utilization"]), max_size=2),
)
def test_every_command_line_the_adapter_builds_is_one_vllm_accepts(
    tp: int, pp: int, nnodes: int, rank: int, args: list[str]
) -> None:
    gang = Gang(rank % nnodes, nnodes, "10.0.0.7", 29501) if nnodes > 1 else None
    # The profile's own args go last, as an operator writes them: each with a value.
    extra = tuple(x for flag in args for x in (flag, "4096" if "len" in flag else "0.9"))
    launch = vllm(tp=tp, pp=pp, nodes=nnodes, args=extra)
    check_argv(command(launch, host="0.0.0.0", port=8000, devices=range(tp), gang=gang).argv)
