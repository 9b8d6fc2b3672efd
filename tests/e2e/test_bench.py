"""`llmgw bench` against a real sim engine's OpenAI endpoint.

Through the gateway is the follow-up (``test_bench_through_the_gateway``, once the
gateway is merged); until then the load driver and the step logic run against the sim
engine directly, which speaks the same streamed chat API and names no replica.
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

from tests.e2e.cli import Cli
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
    assert 0.005 < out["steps"][0]["tpot_p99_s"] < 1.0
    text = cli(*args, "--max-concurrency", "2")
    assert text.returncode == 0, text.stderr
    assert "capacity of chat (sim): 2 concurrent requests within the SLO" in text.stdout
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


def test_a_model_without_an_slo_is_refused_with_the_reason(cli: Cli, sim: str) -> None:
    done = cli("bench", "noslo", "--gateway", sim, "--token-file", "t.token")
    assert done.returncode == 1
    assert "model 'noslo' declares no slo" in done.stderr
    assert "catalog.yaml" in done.stderr
