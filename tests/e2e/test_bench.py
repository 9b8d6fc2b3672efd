"""`llmgw bench`: through a real gateway to a replica placed by a real control plane
(``test_bench_through_the_gateway_...``: the capacity is the sim's slots, and recording
it sets the weight the gateway routes by), and against a sim engine's OpenAI endpoint
directly for the step logic and the refusals (it speaks the same streamed chat API and
names no replica).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.agents import eventually
from tests.e2e.cli import Cli
from tests.e2e.gateways import gateway_cluster
from tests.support import dump_yaml

pytestmark = pytest.mark.slow


def _model(name: str, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "source": f"sim/{name}",
        "scaling": {"min": 1, "max": 4},
        "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
        **extra,
    }


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "sim.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.sim", "--port", str(port), "--model", "chat",
         "--token-delay", "0.01"],
        stdout=log, stderr=log,
    )  # fmt: skip
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the sim did not start"
        time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture
def cli(tmp_path: Path, sqlite_url: str) -> Cli:
    models = [
        _model("chat", slo={"ttft_p99": "5s", "tpot_p99": "1s"}),
        _model("tight", slo={"tpot_p99": "1ms"}),
        _model("noslo"),
    ]
    (tmp_path / "catalog.yaml").write_text(dump_yaml({"models": models}))
    (tmp_path / "t.token").write_text("llmgw_not-checked-by-the-sim\n")
    return Cli(tmp_path, sqlite_url)


def test_bench_finds_the_highest_concurrency_that_meets_the_slo_and_records_it(
    cli: Cli, sim: str
) -> None:
    args = ["bench", "chat", "--gateway", sim, "--token-file", "t.token", "--step-time", "1s"]
    done = cli(*args, "--max-concurrency", "4", "--record", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [s["concurrency"] for s in out["steps"]] == [1, 2, 4]
    assert all(s["meets_slo"] and s["requests"] > 0 and s["errors"] == 0 for s in out["steps"])
    assert out["capacity"] == 4 and out["recorded"] is True
    # Every step met up to --max-concurrency: a floor, not a measured capacity.
    assert out["capped"] is True and out["max_concurrency"] == 4
    assert 0.005 < out["steps"][0]["tpot_p99_s"] < 1.0
    text = cli(*args, "--max-concurrency", "2")
    assert text.returncode == 0, text.stderr
    assert "capacity of chat (sim): at least 2 concurrent requests within the SLO" in text.stdout
    assert "capped by --max-concurrency 2" in text.stdout
    assert "|" in text.stdout and "trend" in text.stdout  # the chart, the SLO line


def test_a_step_that_misses_the_slo_stops_the_bench_and_nothing_is_recorded(
    cli: Cli, sim: str
) -> None:
    # The sim's chat engine serves "chat" only: the tight model is benched on the same
    # endpoint by name, so every request is refused (404): a miss, never a capacity.
    done = cli(
        "bench", "tight", "--gateway", sim, "--token-file", "t.token", "--step-time", "1s",
        "--record",
    )  # fmt: skip
    assert done.returncode == 1
    assert "missed the SLO" in done.stderr and "nothing recorded" in done.stderr


def test_record_with_two_replicas_placed_is_refused_before_any_step(cli: Cli) -> None:
    # It ran every step (minutes of load) and only then refused to record because two
    # replicas had served. The placements say so before the first request.
    cli("nodes", "report", cli.write("nodes.yaml", {"name": "n1", "gpu_class": "SIM", "gpus": 4}))
    placed = cli.json("place")
    assert len([p for p in placed["placed"] if p["model"] == "chat"]) == 1, placed
    cli.write("catalog.yaml", {"models": [_model("chat", scaling={"min": 2, "max": 4},
                                                 slo={"ttft_p99": "5s"})]})  # fmt: skip
    cli.json("place")
    started = time.monotonic()
    done = cli(
        "bench", "chat", "--gateway", "http://127.0.0.1:9", "--token-file", "t.token",
        "--step-time", "5s", "--record",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "2 replicas of model 'chat' are placed (chat/0 (placed), chat/1 (placed))" in done.stderr
    assert "Nothing run" in done.stderr and "concurrency 1" not in done.stdout
    assert time.monotonic() - started < 60  # (a hang bound: no step of 5 s ran)


def test_a_model_without_an_slo_is_refused_with_the_reason(cli: Cli, sim: str) -> None:
    done = cli("bench", "noslo", "--gateway", sim, "--token-file", "t.token")
    assert done.returncode == 1
    assert "model 'noslo' declares no slo" in done.stderr
    assert "catalog.yaml" in done.stderr


# Four slots; a request is 20 tokens at 0.1 s: past 4 concurrent, the fifth waits a
# whole request (2 s) for its first token, twice the SLO.
SLOTS = 4
SOLO = {
    "name": "solo",
    "source": "sim/solo",
    "scaling": {"min": 1, "max": 1},
    "slo": {"ttft_p99": "1s"},
    "profiles": [
        {
            "name": "sim",
            "engine": "sim",
            "gpu_class": "SIM",
            "args": ["--slots", str(SLOTS), "--token-delay", "0.1", "--startup-delay", "0.3"],
        }
    ],
}


def test_bench_through_the_gateway_finds_the_slots_and_its_record_sets_the_routing_weight(
    tmp_path: Path, sqlite_url: str
) -> None:
    rounds = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
    with gateway_cluster(tmp_path, sqlite_url, ["n1"], [SOLO], rounds) as (c, gw, t):
        c.agent("n1")
        eventually(lambda: gw.ready("solo", 1), "solo ready at the gateway")
        assert gw.routing()["models"]["solo"]["replicas"][0]["weight"] == 1.0
        (tmp_path / "client.token").write_text(t.client + "\n")
        done = c.cli(
            "bench", "solo", "--gateway", gw.url, "--token-file", "client.token",
            "--max-concurrency", str(2 * SLOTS), "--step-time", "3s", "--max-tokens", "20",
            "--record", "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        steps = {s["concurrency"]: s for s in out["steps"]}
        assert list(steps) == [1, 2, 4, 8]
        assert all(steps[n]["meets_slo"] and steps[n]["errors"] == 0 for n in (1, 2, 4))
        # Past its slots, requests wait a whole answer for their first token.
        assert not steps[8]["meets_slo"] and steps[8]["ttft_p99_s"] > 1.0
        assert out["capacity"] == SLOTS and out["recorded"] is True
        assert out["replicas_seen"].keys() == {"solo/0"}
        # The recorded capacity is the replica's weight from now on, at the gateway too.
        eventually(
            lambda: gw.routing()["models"]["solo"]["replicas"][0]["weight"] == SLOTS,
            "the gateway routes solo/0 with the measured weight",
            timeout=60,
        )
