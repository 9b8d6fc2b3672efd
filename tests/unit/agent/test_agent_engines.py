"""Engine adapters: the command line and environment each engine is started with."""

from __future__ import annotations

import pytest

from agent.engines import Gang, Launch, UnknownEngine, command


def launch(engine: str, **kw: object) -> Launch:
    fields: dict[str, object] = {
        "engine": engine,
        "profile": "p",
        "model_path": "org/m",
        "served_model_name": "m",
        **kw,
    }
    return Launch(**fields)  # type: ignore[arg-type]


def test_vllm_serves_the_source_under_the_model_name_with_its_parallelism() -> None:
    cmd = command(
        launch("vllm", tp=4, pp=2, args=("--max-model-len", "8192"), env={"HF_HOME": "/d"}),
        host="0.0.0.0",
        port=8001,
        devices=[2, 3, 4, 5],
    )
    assert cmd.argv == (
        *("vllm", "serve", "org/m", "--host", "0.0.0.0", "--port", "8001"),
        *("--served-model-name", "m", "--tensor-parallel-size", "4"),
        *("--pipeline-parallel-size", "2", "--max-model-len", "8192"),
    )
    assert cmd.env == {"HF_HOME": "/d", "CUDA_VISIBLE_DEVICES": "2,3,4,5"}


def test_llamacpp_takes_a_local_gguf_file_or_a_huggingface_repository() -> None:
    local = command(launch("llamacpp", model_path="/w/q.gguf"), host="h", port=1, devices=[])
    hub = command(launch("llamacpp", model_path="org/m-GGUF"), host="h", port=1, devices=[])
    assert local.argv[:3] == ("llama-server", "-m", "/w/q.gguf")
    assert hub.argv[:3] == ("llama-server", "-hf", "org/m-GGUF")
    assert local.argv[-2:] == ("--alias", "m")


def test_a_cpu_replica_is_given_no_card_rather_than_every_card() -> None:
    cmd = command(launch("llamacpp"), host="h", port=1, devices=[])
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == ""


def test_sim_runs_the_built_in_engine_with_the_profile_args_last() -> None:
    cmd = command(
        launch("sim", args=("--startup-delay", "1")), host="h", port=9, devices=[0], python="py"
    )
    assert cmd.argv == (
        *("py", "-m", "agent.sim", "--host", "h", "--port", "9", "--model", "m"),
        *("--startup-delay", "1"),
    )


def test_an_engine_without_an_adapter_is_refused_naming_the_model_and_profile() -> None:
    with pytest.raises(UnknownEngine, match=r"model 'm' profile 'p': engine 'tgi' has no adapter"):
        command(launch("tgi"), host="h", port=1, devices=[])


def test_a_replica_spanning_nodes_runs_vllm_with_its_rank_and_the_workers_headless() -> None:
    big = Launch(engine="vllm", profile="p", model_path="org/big", served_model_name="big",
                 tp=8, pp=2, gpus_per_node=8, nodes=2)  # fmt: skip
    head = command(big, host="0.0.0.0", port=8000, devices=range(8),
                   gang=Gang(0, 2, "10.0.0.1", 8001))  # fmt: skip
    worker = command(big, host="0.0.0.0", port=8100, devices=range(8),
                     gang=Gang(1, 2, "10.0.0.1", 8001))  # fmt: skip
    tail = [
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "10.0.0.1",
        "--master-port",
        "8001",
    ]
    assert list(head.argv[-8:]) == tail
    assert list(worker.argv[-9:]) == [*tail[:3], "1", *tail[4:], "--headless"]
    assert "--pipeline-parallel-size" in head.argv


def test_llamacpp_is_refused_across_nodes_saying_what_to_change() -> None:
    gguf = Launch(engine="llamacpp", profile="p", model_path="/m.gguf", served_model_name="m",
                  nodes=2)  # fmt: skip
    refusal = r"llama\.cpp cannot span nodes.*set the profile's nodes to 1"
    with pytest.raises(UnknownEngine, match=refusal):
        command(gguf, host="h", port=1, devices=[], gang=Gang(0, 2, "h", 2))
