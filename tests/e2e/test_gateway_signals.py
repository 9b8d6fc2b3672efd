"""What a real `llmgw gateway` posts to a real `llmgw serve` (``POST /v1/signals``), and
that the control plane stores it: the contract the autoscaler is built on.

- An idle gateway keeps reporting (empty ``windows``), so the autoscaler can tell an
  idle model (scale it down) from a silent gateway (hold).
- A request that starts waiting for a model with no ready replica is posted at once:
  the window with ``waiting`` is stored before the request gives up, with the
  gateway's interval set to ten minutes.
- The gateway posts with its own token (role ``gateway``); a client token is refused.

No agents: nothing ever becomes ready here, which is what the waiting path needs. The
windows of served traffic (replica keys, p99s) are checked in test_autoscale_cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import select

from autoscale.store import reports_t, windows_t
from events.database.connection import make_engine
from tests.e2e.agents import eventually
from tests.e2e.gateways import GatewayProc, gateway_cluster

pytestmark = pytest.mark.slow

ZERO = {
    "name": "zero",
    "source": "sim/zero",
    "scaling": {"min": 0, "max": 1},
    "slo": {"ttft_p99": "1s"},
    "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM", "startup_timeout": "3s"}],
}


def _rows(db_url: str, table: Any) -> list[dict[str, Any]]:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(select(table)).mappings()]
    finally:
        engine.dispose()


def test_an_idle_gateway_keeps_reporting_and_a_waiting_request_is_posted_at_once(
    tmp_path: Path, sqlite_url: str
) -> None:
    (tmp_path / "idle.toml").write_text('[gateway]\nsignals_interval = "0.3s"\n')
    (tmp_path / "wake.toml").write_text('[gateway]\nsignals_interval = "10m"\n')
    idle_args = ("--settings", str(tmp_path / "idle.toml"))
    with gateway_cluster(tmp_path, sqlite_url, [], [ZERO], [], gateway_args=idle_args) as (
        c,
        _gw,
        t,
    ):
        # Idle: empty reports, one per interval, from the gateway's token: who posted is the
        # token's name (gw-1) and the worker (0), not the gateway's --gateway-id (gw-test).
        eventually(
            lambda: len([r for r in _rows(c.server.db_url, reports_t) if r["windows"] == 0]) >= 3,
            "three empty reports from the idle gateway",
        )
        reports = _rows(c.server.db_url, reports_t)
        assert {r["gateway"] for r in reports} == {"gw-1-w0"}
        assert all(r["windows"] == 0 for r in reports)

        wake = GatewayProc(
            tmp_path, c.server.url, t.gateway_b, "--gateway-id", "gw-wake",
            "--settings", str(tmp_path / "wake.toml"), admin=c.tokens.reader,
        ).start()  # fmt: skip
        try:
            eventually(lambda: "zero" in wake.routing()["models"], "gw-wake knows zero")
            client = wake.openai(t.client)
            with pytest.raises(openai.APIStatusError) as refused:
                client.chat.completions.create(
                    model="zero", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            gave_up = datetime.now(UTC)
            # Held up to the profile's startup_timeout, then 503 with Retry-After.
            assert refused.value.status_code == 503
            assert refused.value.response.headers["retry-after"]
            assert "zero" in refused.value.message
            woke = [
                w
                for w in _rows(c.server.db_url, windows_t)
                if w["gateway"] == "gw-2-w0" and w["model"] == "zero" and w["waiting"] == 1
            ]
            # Posted when the request started waiting, not at the next interval (10 min).
            assert len(woke) == 1, woke
            assert woke[0]["received_at"].replace(tzinfo=UTC) < gave_up
            assert woke[0]["inflight_max"] == 1 and woke[0]["errors"] == 0
        finally:
            wake.stop()
        # Its last report, on SIGTERM: the request finished, a failure among one request.
        last = [
            w
            for w in _rows(c.server.db_url, windows_t)
            if w["gateway"] == "gw-2-w0" and w["requests"] == 1
        ]
        assert len(last) == 1 and last[0]["errors"] == 1, last

        # A client token may not post signals: the control plane names the role it needs.
        with c.server.client(t.client) as raw:
            answer = raw.post("/v1/signals", json={"gateway": "x", "windows": []})
        assert answer.status_code == 403, answer.text
        assert "gateway token" in answer.text
