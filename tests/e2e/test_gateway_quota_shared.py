"""A client's limit held across gateways, end to end: a real `llmgw serve`, a real sim
agent, two real `llmgw gateway`s following it, tokens limited with the real `llmgw token`,
and the official OpenAI client taking turns between the gateways (a round-robin load
balancer).

Each gateway draws the client's allowance from the control plane in chunks, so the two
together serve what one limit allows plus at most the chunks they hold and one request's
reservation (docs/operator/tenants.md), where each counting on its own served twice
the limit; a gateway SIGKILLed loses what it held and the bound still holds; with the
control plane SIGKILLed a gateway serves what it holds, then refuses 503
``allowance_not_renewed``. The bounds are on tokens counted, never on time: the time
the run took only widens the allowance (the bucket's refill) it is measured against.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from catalog.forms.allowance import CHUNK_SHARE
from gateway.stages import admission
from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, gateway_cluster
from tests.e2e.test_gateway import ROUNDS, chat

pytestmark = pytest.mark.slow

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "How much may I use?"}]
MAX_TOKENS = 20
# What one request reserves: its prompt by the gateway's estimate, and its max_tokens.
RESERVED = (
    admission.estimate(admission.parse_request({"model": "chat", "messages": HI}, admission.CHAT))
    + MAX_TOKENS
)
# Refusals in a row, through both gateways, that end a run: the client is at its limit.
AT_LIMIT = 8


@dataclass
class Shared:
    cluster: Cluster
    gateways: list[GatewayProc]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Shared]:
    workdir = tmp_path_factory.mktemp("shared")
    db = workdir / "llmgw.db"
    shutil.copy(sqlite_template, db)
    with gateway_cluster(workdir, f"sqlite:///{db}", ["n1"], [chat(1, fallbacks=())], ROUNDS) as (
        c,
        gw,
        extra,
    ):
        second = GatewayProc(workdir, c.server.url, extra.gateway_b, admin=c.tokens.reader)
        second.argv[second.argv.index("gw-test")] = "gw-test-2"
        try:
            second.start()
            c.agent("n1")
            for g in (gw, second):
                eventually(partial(g.ready, "chat", 1), "chat ready at the gateway")
            yield Shared(c, [gw, second])
        finally:
            second.stop()


def _limited(s: Shared, name: str, tpm: int, ways: int = 2) -> list[openai.OpenAI]:
    token = s.cluster.cli.json("token", "new", name, "--role", "client", "--tpm", str(tpm))["token"]
    clients = [g.openai(token) for g in s.gateways[:ways]]

    def taken() -> bool:
        try:
            for client in clients:
                client.models.list()
        except openai.AuthenticationError:
            return False
        return True

    eventually(taken, f"{name} taken by both gateways")
    return clients


@dataclass
class Run:
    served: int = 0
    answered: int = 0
    refused: int = 0
    codes: frozenset[str] = frozenset()


def _until_refused(clients: list[openai.OpenAI], run: Run, turn: int = 0) -> int:
    """Requests taking turns between ``clients`` until ``AT_LIMIT`` in a row are refused;
    the engines' usage of every answer counted. The next turn."""
    in_a_row = 0
    while in_a_row < AT_LIMIT:
        client = clients[turn % len(clients)]
        turn += 1
        try:
            answer = client.chat.completions.create(
                model="chat", messages=HI, max_tokens=MAX_TOKENS
            )
        except openai.RateLimitError as exc:
            in_a_row += 1
            run.refused += 1
            assert isinstance(exc.body, dict)
            run.codes |= {str(exc.body["code"])}
            continue
        in_a_row = 0
        assert answer.usage is not None
        run.served += answer.usage.total_tokens
        run.answered += 1
    return turn


def _bound(tpm: int, seconds: float, gateways: int) -> float:
    """One bucket's allowance over the run, plus each gateway's chunks, plus one
    request's reservation whatever the number of gateways (docs/operator/tenants.md)."""
    return tpm * (1 + seconds / 60) + gateways * CHUNK_SHARE * tpm + RESERVED


def test_two_gateways_together_serve_one_limit_within_the_chunks_outstanding(
    shared: Shared,
) -> None:
    tpm = 1000
    clients = _limited(shared, "app-shared", tpm)
    started = time.monotonic()
    run = Run()
    _until_refused(clients, run)
    seconds = time.monotonic() - started
    # Each gateway counting the whole limit on its own served about twice it.
    assert run.served <= _bound(tpm, seconds, 2), (run, seconds)
    assert run.codes == {"rate_limit_tokens"}
    assert run.served >= tpm * 0.8  # the limit itself was there to use
    # Both gateways served and refused: the limit is one, drawn by both. (A log line is
    # written once its answer is sent: the last refusals' are waited for.)
    for g in shared.gateways:

        def both(g: GatewayProc = g) -> bool:
            lines = [x for x in g.logs("gateway.request") if x.get("client") == "app-shared"]
            return {x["status"] for x in lines} >= {200, 429}

        eventually(both, "the gateway's answers and refusals logged")


def test_a_gateway_killed_mid_window_loses_what_it_held_and_the_bound_holds(
    shared: Shared,
) -> None:
    tpm = 1000
    clients = _limited(shared, "app-killed", tpm)
    started = time.monotonic()
    run = Run()
    turn = _until_refused(clients, run)
    killed = shared.gateways[1]
    assert killed.proc is not None
    killed.proc.send_signal(signal.SIGKILL)
    killed.proc.wait(30)
    _until_refused(clients[:1], run, turn)
    seconds = time.monotonic() - started
    held = CHUNK_SHARE * tpm + RESERVED  # the most the killed one held (or owed)
    assert run.served <= _bound(tpm, seconds, 2) + held, (run, seconds)


def test_through_a_control_plane_outage_a_gateway_serves_what_it_holds_then_refuses(
    shared: Shared,
) -> None:
    tpm = 60_000
    gw = shared.gateways[0]
    client = _limited(shared, "app-outage", tpm, ways=1)[0]
    for _ in range(5):  # it has drawn this client's chunks
        client.chat.completions.create(model="chat", messages=HI, max_tokens=MAX_TOKENS)
    eventually(lambda: gw.logs("gateway.request")[-1].get("status") == 200, "logged")
    server = shared.cluster.server.proc
    assert server is not None
    server.send_signal(signal.SIGKILL)
    server.wait()
    served = 0
    refusal: openai.APIStatusError | None = None
    # Counting on its own, it would serve the whole 60,000 a minute on: ~1,500 answers.
    for _ in range(400):
        try:
            answer = client.chat.completions.create(
                model="chat", messages=HI, max_tokens=MAX_TOKENS
            )
        except openai.APIStatusError as exc:
            refusal = exc
            break
        assert answer.usage is not None
        served += answer.usage.total_tokens
    assert refusal is not None, f"served {served} tokens with no control plane"
    # What it held (at most 5% of the limit; what settlements gave back under their
    # reservations is spent again from it) and at most one request on credit.
    assert served <= CHUNK_SHARE * tpm + RESERVED
    assert refusal.status_code == 503
    assert isinstance(refusal.body, dict) and refusal.body["code"] == "allowance_not_renewed"
    assert "could not be renewed from the control plane" in refusal.message
    assert 1 <= int(refusal.response.headers["retry-after"]) <= 60
    line = eventually(
        lambda: [
            x
            for x in gw.logs("gateway.allowances_failed")
            if "/v1/gateway/allowances" in str(x.get("error"))
        ],
        "the failed renewal logged",
    )
    assert line
