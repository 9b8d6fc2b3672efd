"""Issue 36 on a real gateway: connections held without a token no longer take it down.

810 connections sending a head with ``Content-Length: 1000000`` and then a byte a second
held the gateway's 800-connection cap for the whole attack (the gateway answered 401 at
once, then kept reading the body), and every other request and ``/healthz`` got 503; 800
unfinished heads renewed every 10 s did the same between header timeouts. Scaled down
here (a cap of 40 set by ``[gateway] max_connections``, 50 attackers, a byte every 0.2 s,
heads renewed every second), with ``bench.gateway.slowloris.attack`` (the same code as the
full-size script) while a client of the official OpenAI client asks the gateway for
completions of a model served by a real agent's sim engine.

The hostile review after it: connections each pipelining up to 20,000 ``GET /v1/models``
with no token (answered 401 each) and a 1 KiB receive buffer, never reading, held the
cap too (/healthz timed out, then 503, for 30 s): ``pipeline``, a new one from each
attacker every second, all held to the end.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionMessageParam

from bench.gateway.slowloris import attack
from tests.e2e.agents import eventually
from tests.e2e.gateways import gateway_cluster

pytestmark = pytest.mark.slow

CAP, ATTACKERS = 40, 50
ATTACK_PATH = {
    "body": "/v1/chat/completions",
    "heads": "/v1/chat/completions",
    "pipeline": "/v1/models",
}
ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Still there?"}]
CHAT = {
    "name": "chat",
    "source": "sim/chat",
    "scaling": {"min": 1},
    "context_length": 1024,
    "max_output": 64,
    "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
}


@pytest.mark.parametrize("mode", ["body", "heads", "pipeline"])
def test_connections_held_beyond_the_cap_leave_clients_and_healthz_answered(
    mode: str, tmp_path: Path, sqlite_url: str
) -> None:
    settings = tmp_path / "gateway.toml"
    settings.write_text(f"[gateway]\nmax_connections = {CAP}\n")
    with gateway_cluster(
        tmp_path, sqlite_url, ["n1"], [CHAT], ROUNDS, gateway_args=("--settings", str(settings))
    ) as (c, gw, t):
        c.agent("n1")
        eventually(lambda: gw.ready("chat", 1), "the model ready at the gateway")
        # Real clients retry a request whose connection closed unanswered (the OpenAI
        # client twice by default); once here, as bench.gateway.slowloris's clients do.
        client = gw.openai(t.client).with_options(max_retries=1)
        done = threading.Event()
        answered: list[str] = []
        failed: list[BaseException] = []

        def chat() -> None:
            while not done.is_set():
                try:
                    reply = client.chat.completions.create(model="chat", messages=HI, max_tokens=4)
                    answered.append(reply.choices[0].message.content or "")
                except Exception as exc:  # every failure is the test's verdict
                    failed.append(exc)

        chatting = threading.Thread(target=chat)
        chatting.start()
        try:
            fig = asyncio.run(
                attack(
                    gw.url, mode, attackers=ATTACKERS, seconds=5.0, token=t.client,
                    drip=0.2, renew=1.0, attack_path=ATTACK_PATH[mode],
                )
            )  # fmt: skip
        finally:
            done.set()
            chatting.join(60)
        assert fig.statuses and set(fig.statuses) == {200}, fig.statuses
        assert fig.health and set(fig.health) == {200}, fig.health
        assert answered and not failed, failed[:3]
        if mode == "pipeline":
            # What the attackers cannot tell (their answers unread, the server's end of
            # sending never reaches them), the gateway's log does.
            assert gw.logs("http.pipeline_full")
        else:
            assert fig.closed, "the attackers' connections were never closed"
