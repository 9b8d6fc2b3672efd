"""Engines started with a key, end to end: a real `llmgw serve`, an agent that starts sim
engines with the key its profile names (``env: {LLMGW_SIM_API_KEY: {secret: NAME}}``,
resolved from the agent's ``--secrets-dir``), a real `llmgw gateway` that sends the same
secret from its own ``--secrets-dir``, and the official OpenAI client.

An engine on a node's address is reachable by anyone on the network; with a key, only
the gateway (and its quotas, its queue, its ledger) reaches it. Before, the gateway sent
no key: every request to such an engine was refused, and the client read the engine's
401 as its own token refused."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = pytest.mark.slow

ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
KEY = "k3y-of-the-engines"


def model(name: str, secret: str) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"sim/{name}",
        "scaling": {"min": 1, "max": 1},
        "profiles": [
            {
                "name": "sim",
                "engine": "sim",
                "gpu_class": "SIM",
                "args": ["--max-model-len", "3000"],
                "env": {"LLMGW_SIM_API_KEY": {"secret": secret}},
            }
        ],
    }


# keyed: both sides hold the secret alike; unheld: the gateway has no such secret;
# differing: the gateway's copy is not the agents'.
MODELS = [model("keyed", "engine-key"), model("unheld", "absent-key"), model("differing", "drift")]

Setup = tuple[GatewayProc, GatewayTokens, Cluster]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("gwkeys")
    shutil.copy(sqlite_template, work / "llmgw.db")
    agent_secrets, gateway_secrets = work / "agent-secrets", work / "gateway-secrets"
    for d in (agent_secrets, gateway_secrets):
        d.mkdir(mode=0o700)
    (agent_secrets / "engine-key").write_text(KEY + "\n")
    (gateway_secrets / "engine-key").write_text(KEY + "\n")
    (agent_secrets / "absent-key").write_text("held-by-the-agents-only\n")
    (agent_secrets / "drift").write_text("the-agents-copy\n")
    (gateway_secrets / "drift").write_text("the-gateways-older-copy\n")
    with gateway_cluster(
        work,
        f"sqlite:///{work / 'llmgw.db'}",
        ["n1"],
        MODELS,
        ROUNDS,
        gateway_args=("--secrets-dir", str(gateway_secrets)),
    ) as (c, gw, tokens):
        c.agent("n1", "--secrets-dir", str(agent_secrets), gpus="SIM:4")
        eventually(
            lambda: all(gw.ready(n, 1) for n in ("keyed", "unheld", "differing")),
            "every model ready at the gateway",
        )
        yield gw, tokens, c


def endpoint(c: Cluster, name: str) -> str:
    (p,) = [p for p in c.placements() if p["model"] == name]
    return str(p["endpoint"])


def test_a_keyed_engine_answers_the_gateway_and_refuses_anyone_else(setup: Setup) -> None:
    gw, tokens, c = setup
    answer = gw.openai(tokens.client).chat.completions.create(
        model="keyed", messages=[{"role": "user", "content": "hello"}], max_tokens=3
    )
    assert answer.choices[0].message.content
    # Straight to the engine, around the gateway: refused without the key, with a
    # client's token, and with a key that is not the engine's; its health check is open.
    url = endpoint(c, "keyed")
    body = {"model": "keyed", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for headers in ({}, {"authorization": f"Bearer {tokens.client}"}, {"authorization": "k"}):
        direct = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
        assert direct.status_code == 401, direct.text
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    keyed = httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert keyed.status_code == 200, keyed.text


def test_the_agent_asks_a_keyed_engine_what_it_runs_with_the_key(setup: Setup) -> None:
    # The agent reads a ready engine's context (/v1/models on the sim, as on vLLM) with
    # the key it started it with: without it the engine's 401 left the context unknown.
    _, _, c = setup
    eventually(
        lambda: c.states()[("keyed", 0)].get("effective_context_length") == 3000,
        "the keyed engine's context read by its agent",
    )


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("unheld", "this gateway has no usable key for it (secret 'absent-key'"),
        ("differing", "it does not take this gateway's key (secret 'drift'): the agents'"),
    ],
)
def test_a_key_the_gateway_lacks_or_holds_wrong_is_named_never_the_clients_token(
    setup: Setup, name: str, said: str
) -> None:
    gw, tokens, _ = setup
    with pytest.raises(openai.APIStatusError) as caught:
        gw.openai(tokens.client).chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hello"}], max_tokens=3
        )
    # Not a 401: the client's token was good; the engine refused the gateway.
    assert caught.value.status_code == 503, caught.value
    message = str(caught.value.body)
    assert "answered 401: the engine refused the gateway's request" in message
    assert said in message
    assert "gateway-secrets" not in message  # no path of the gateway's reaches a client


def test_the_gateway_logs_where_it_looked_for_a_key_it_cannot_send(setup: Setup) -> None:
    gw, _, _ = setup
    unsent = {x["model"]: x for x in gw.logs("gateway.engine_key_unsent")}
    assert set(unsent) == {"unheld"}, unsent
    why = unsent["unheld"]["why"]
    assert "secret 'absent-key' is on neither the file" in why
    assert "LLMGW_SECRET_ABSENT_KEY" in why and "[gateway] secrets_dir" in why
