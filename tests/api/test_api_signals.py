"""POST /v1/signals (a gateway's windows) and GET /v1/autoscale on a real server.

Who may post, what is refused (hostile bodies included) and that nothing of a refused
body is stored; the health check answers while a large body is refused. Who posted is
the token's name and the worker number, never the body's gateway id: one gateway token
posting under invented ids counts as one gateway, and as at most MAX_WORKERS.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoscale.signals import MAX_WORKERS
from autoscale.store import AutoscaleStore
from events.database.connection import make_engine
from tests.api.server import ApiServer, Tokens, running

W = {"model": "chat", "start": "2026-12-04T10:00:00Z", "end": "2026-12-04T10:00:05Z"}
DECLARED = {
    "models": [
        {
            "name": "chat",
            "source": "sim/chat",
            "scaling": {"min": 1, "max": 4},
            "slo": {"ttft_p99": "1s", "tpot_p99": "100ms"},
            "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
        },
        *(
            {
                "name": name,
                "source": f"sim/{name}",
                "scaling": {"min": 1, "max": 8},
                "slo": {"ttft_p99": "1s"},
                "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
            }
            for name in ("posed", "workers")
        ),
    ]
}


@pytest.fixture(scope="module")
def tokens() -> Tokens:
    """The suite's tokens and two gateways' (gw-a, gw-b)."""
    return Tokens.issue(gateways=["gw-a", "gw-b"])


@pytest.fixture(scope="module")
def api(module_db_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_db_url, tokens=tokens, declared=DECLARED)) as s:
        yield s


def _windows(api: ApiServer, tokens: Tokens) -> dict[str, Any]:
    with api.client(tokens.reader) as c:
        answer = c.get("/v1/autoscale")
    assert answer.status_code == 200, answer.text
    windows: dict[str, Any] = answer.json()
    return windows


def _signals(api: ApiServer, tokens: Tokens, model: str) -> dict[str, Any]:
    (row,) = [r for r in _windows(api, tokens)["models"] if r["model"] == model]
    signals: dict[str, Any] = row["signals"]
    return signals


def test_one_gateway_token_posting_under_invented_ids_counts_as_one_gateway(
    api: ApiServer, tokens: Tokens
) -> None:
    """Issue 36: windows posted with one gateway token under gw-fake1..3 were summed as
    three gateways. Who posted is the token's name and worker: one gateway, one load."""
    window = {**W, "model": "posed", "requests": 50, "inflight_mean": 10.0}
    with api.client(tokens.gateways["gw-a"]) as c:
        for fake in ("gw-fake1", "gw-fake2", "gw-fake3"):
            answer = c.post("/v1/signals", json={"gateway": fake, "windows": [window]})
            assert answer.status_code == 202, answer.text
            assert answer.json()["gateway"] == "gw-a-w0"
            assert answer.json()["label"] == fake
    signals = _signals(api, tokens, "posed")
    assert signals["gateways"] == 1
    assert signals["load"] == pytest.approx(10.0)


def test_each_token_and_worker_is_one_gateway_and_the_loads_add(
    api: ApiServer, tokens: Tokens
) -> None:
    window = {**W, "model": "workers", "requests": 10, "inflight_mean": 2.0}
    for name, worker in (("gw-a", 0), ("gw-a", 1), ("gw-b", 0)):
        with api.client(tokens.gateways[name]) as c:
            body = {"gateway": "same-id", "worker": worker, "windows": [window]}
            answer = c.post("/v1/signals", json=body)
        assert answer.status_code == 202, answer.text
        assert answer.json()["gateway"] == f"{name}-w{worker}"
        # The gateways live (posted within LIVE_S), this one among them: each gateway
        # deals the replicas' slots among them by its place in the list.
        assert f"{name}-w{worker}" in answer.json()["gateways"]
    assert {"gw-a-w0", "gw-a-w1", "gw-b-w0"} <= set(answer.json()["gateways"])
    assert answer.json()["gateways"] == sorted(answer.json()["gateways"])
    signals = _signals(api, tokens, "workers")
    assert signals["gateways"] == 3
    assert signals["load"] == pytest.approx(6.0)


@pytest.mark.parametrize("worker", [MAX_WORKERS, -1, 10**6, "1", True, 1.5])
def test_a_worker_beyond_the_limit_is_refused_and_nothing_is_stored(
    api: ApiServer, tokens: Tokens, worker: object
) -> None:
    before = _signals(api, tokens, "posed")
    window = {**W, "model": "posed", "requests": 50, "inflight_mean": 10.0}
    with api.client(tokens.gateways["gw-a"]) as c:
        answer = c.post("/v1/signals", json={"gateway": "g", "worker": worker, "windows": [window]})
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert f"must be a whole number from 0 to {MAX_WORKERS - 1}" in detail
    assert "give each gateway its own token" in detail
    assert _signals(api, tokens, "posed") == before


def test_an_operator_token_posts_windows_and_they_are_counted(
    api: ApiServer, tokens: Tokens
) -> None:
    body = {"gateway": "gw-1", "windows": [{**W, "requests": 7, "inflight_mean": 1.5}]}
    with api.client(tokens.operator) as c:
        answer = c.post("/v1/signals", json=body)
    assert answer.status_code == 202, answer.text
    assert answer.json()["windows"] == 1
    row = _windows(api, tokens)["models"][0]
    assert row["model"] == "chat" and row["min"] == 1 and row["max"] == 4 and row["wanted"] == 1
    assert row["signals"]["requests"] >= 7
    with api.client(tokens.reader) as c:
        metrics = c.get("/metrics").text
    assert 'llmgw_autoscale_wanted_replicas{model="chat"} 1.0' in metrics
    assert 'llmgw_autoscale_max_replicas{model="chat"} 4.0' in metrics
    assert 'llmgw_autoscale_slo_ttft_p99_seconds{model="chat"} 1.0' in metrics
    assert 'llmgw_autoscale_load{model="chat"}' in metrics


@pytest.mark.parametrize("who", ["reader", "agent"])
def test_other_roles_are_refused_and_no_token_is_401(
    api: ApiServer, tokens: Tokens, who: str
) -> None:
    with api.client(getattr(tokens, who)) as c:
        answer = c.post("/v1/signals", json={"gateway": "gw", "windows": []})
    assert answer.status_code == 403
    assert "gateway token" in answer.json()["detail"]
    with api.client() as c:
        assert c.post("/v1/signals", json={"gateway": "gw", "windows": []}).status_code == 401


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"[" * 10_000, 422, "deep"),
        (b"[" + b"1," * 200_000 + b"1]", 422, "values"),
        (b'{"gateway": "gw", "windows": [' + b"1," * 600_000 + b"1]}", 413, "bytes"),
        (b'{"gateway": "gw", "windows": [{"model": "chat", "requests": NaN}]}', 422, ""),
        (b"\xff\xfe", 422, "UTF-8"),
        (b"&", 422, "not JSON"),
        (b"gateway: gw\nwindows: []\n", 422, "not JSON"),
        (
            json.dumps({"gateway": "gw", "windows": [{**W, "model": "x\u0000"}]}).encode(),
            422,
            "NUL",
        ),
        (json.dumps({"gateway": "gw", "windows": [{**W, "requests": 10**30}]}).encode(), 422, ""),
        # A number field holding an integer past a float's range (JSON reads it whole):
        # refused naming the field, not an OverflowError (500).
        (
            json.dumps({"gateway": "gw", "windows": [{**W, "inflight_mean": 10**400}]}).encode(),
            422,
            "inflight_mean must be a number",
        ),
        (
            json.dumps({"gateway": "gw", "windows": [{**W, "ttft_p99_s": 10**400}]}).encode(),
            422,
            "ttft_p99_s must be a number",
        ),
        (
            json.dumps(
                {"gateway": "gw", "windows": [{**W, "replicas": {"r": {"inflight_mean": 10**400}}}]}
            ).encode(),
            422,
            "inflight_mean must be a number",
        ),
    ],
)
def test_hostile_bodies_are_refused_and_store_nothing(
    api: ApiServer, tokens: Tokens, body: bytes, status: int, words: str
) -> None:
    before = _windows(api, tokens)["models"][0]["signals"]
    with api.client(tokens.operator) as c:
        answer = c.post("/v1/signals", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    assert words.lower() in answer.text.lower()
    assert _windows(api, tokens)["models"][0]["signals"] == before


def test_health_answers_while_large_bodies_are_being_refused(
    api: ApiServer, tokens: Tokens
) -> None:
    big = b'{"gateway": "gw", "windows": [' + b'{"model": "chat"},' * 50_000 + b"{}]}"
    stop = threading.Event()

    def flood() -> None:
        with api.client(tokens.operator) as c:
            while not stop.is_set():
                c.post("/v1/signals", content=big[: 1 << 20])

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        for _ in range(10):
            assert httpx.get(f"{api.url}/healthz", timeout=10).status_code == 200
    finally:
        stop.set()
        thread.join(30)


def test_a_report_stamped_in_the_future_does_not_count_its_gateway_live(
    api: ApiServer, module_db_url: str, tokens: Tokens
) -> None:
    """A report row stamped later than now (the control plane's clock set back since it
    was written, or a hostile row): on main its gateway was listed live until that time
    came (a year here), and every gateway dealt itself a smaller part of each replica."""
    engine = make_engine(module_db_url)
    try:
        later = datetime.now(UTC) + timedelta(days=365)
        AutoscaleStore(engine).record_signals("ghost-w0", (), later)
    finally:
        engine.dispose()
    with api.client(tokens.gateways["gw-a"]) as c:
        answer = c.post("/v1/signals", json={"gateway": "gw-a", "windows": []})
    assert answer.status_code == 202, answer.text
    assert "ghost-w0" not in answer.json()["gateways"]
    assert "gw-a-w0" in answer.json()["gateways"]
