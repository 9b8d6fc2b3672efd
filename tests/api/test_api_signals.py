"""POST /v1/signals (a gateway's windows) and GET /v1/autoscale on a real server.

Who may post, what is refused (hostile bodies included) and that nothing of a refused
body is stored; the health check answers while a large body is refused.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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
        }
    ]
}


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
