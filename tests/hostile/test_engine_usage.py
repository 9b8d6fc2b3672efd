"""A hostile engine's ``usage`` (an engine runs code that came with its model) charges its
tenant at most what the request could have used (gateway.stages.plausible): not its
tokens-per-minute limit for years, not its place on the model's fair-queuing clock for
good, not the usage ledger. A scripted engine on a real socket, the real ``GatewayApp``
served as ``llmgw gateway`` serves it, real quotas, queue, ledger and metrics.

And a ``/tokenize`` count from an engine does not make a kilobytes-long refusal."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from aiohttp import web
from structlog.testing import capture_logs

from catalog.definition.parse import parse_model
from catalog.forms.client_limits import ClientLimits
from gateway.proxy import Proxy
from gateway.server import GatewayApp
from gateway.settings import GatewaySettings
from gateway.stages import admission, plausible
from gateway.state import Client, State
from gateway.table import build
from gateway.upstream import Upstream
from tests.unit.gateway.local_app import served
from tests.unit.gateway.test_answer_bounds import HEAD, Script, chunk, event
from tests.unit.gateway.test_enginepool import Engine, _request, run
from tests.unit.httpguard.serving import guarded_server

# The most gateway.usage reads of one count (12 digits).
MOST = 10**12 - 1
WINDOW = 4096
TPM = 100_000
TOKENS = {"alice": "alice-token", "mallory": "mallory-token"}


def chat_model(**profile: Any) -> Any:
    return parse_model(
        {
            "name": "chat",
            "source": "org/chat",
            "context_length": WINDOW,
            "profiles": [
                {"name": "sim", "engine": "sim", "gpu_class": "SIM", "weight": 1, **profile}
            ],
        }
    )


@asynccontextmanager
async def gateway(script: Script, **profile: Any) -> AsyncIterator[tuple[str, State]]:
    """A gateway (the model ``chat``, one ready replica: the scripted engine; two client
    tokens limited to TPM tokens a minute) at the URL yielded, and its state."""
    async with Engine(script) as url:
        state = State("gw-test")
        rows = [
            {"model": "chat", "replica": 0, "state": "ready", "endpoint": url, "profile": "sim"}
        ]
        state.install(build([chat_model(**profile)], rows, 1))
        state.clients = {
            hashlib.sha256(token.encode()).hexdigest(): Client(name, None, ClientLimits(tpm=TPM))
            for name, token in TOKENS.items()
        }
        state.synced = True
        config = GatewaySettings(server="http://cp", token="t", attempts=1)
        upstream = Upstream(2, 10, 1)
        app = GatewayApp(state, Proxy(state, upstream, config), config)
        try:
            async with guarded_server(app, coalesce=True) as sock:
                host, port = sock.getsockname()[:2]
                yield f"http://{host}:{port}", state
        finally:
            await upstream.close()


def whole(counts: dict[str, int]) -> bytes:
    body = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "chat",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
            "usage": counts,
        }
    ).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(body) + body


def streamed(counts: dict[str, int]) -> bytes:
    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    tail = {"choices": [], "usage": counts}
    return (
        HEAD
        + chunk(event("hi"))
        + chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
        + chunk(b"data: " + json.dumps(tail).encode() + b"\n\n")
        + chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )


LIE = {"prompt_tokens": MOST, "completion_tokens": MOST, "total_tokens": 2 * MOST}
HONEST = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}


async def ask(
    url: str, client: str, content: str, *, stream: bool = False, max_tokens: int | None = 50
) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "chat",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(
            url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {TOKENS[client]}"},
        )
        await answer.aread()
        return answer


def implausible(state: State) -> float:
    found = state.metrics.registry.get_sample_value(
        "llmgw_gateway_usage_implausible_total", {"model": "chat"}
    )
    return found or 0.0


def test_an_engines_absurd_usage_is_charged_at_most_what_the_request_could_use() -> None:
    # One answer claiming twice 10^12 - 1 tokens was settled against its client's
    # tokens-per-minute limit (every model's requests draw from it): the client was
    # refused 429 for years (what it owed refills at TPM tokens a minute), and the
    # ledger summed the claim. Now it is charged its prompt's bound and its max_tokens.
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await _request(reader)) is not None:
            writer.write(whole(LIE if b"lie" in request else HONEST))
            await writer.drain()

    async def main() -> None:
        async with gateway(engine) as (url, state):
            with capture_logs() as logs:
                answer = await ask(url, "mallory", "lie")
            assert answer.status_code == 200, answer.text
            # The client's next request is admitted: its limit was charged what the
            # request could have used, not 2 x 10^12 tokens.
            again = await ask(url, "mallory", "hello")
            assert again.status_code == 200, again.text
            left = int(again.headers["x-ratelimit-remaining-tokens"])
            assert left >= TPM - 2 * (plausible.PROMPT_SLACK + 200 + 50), left
            rows = [r for r in state.ledger.take() if r["client"] == "mallory"]
            assert sum(r["completion_tokens"] for r in rows) == 50 + 1
            assert 0 < sum(r["prompt_tokens"] for r in rows) <= WINDOW
            assert implausible(state) == 1
            said = [e for e in logs if e["event"] == "gateway.usage_implausible"]
            assert len(said) == 1, logs
            assert said[0]["model"] == "chat" and said[0]["replica"] == "chat/0"
            assert said[0]["reported_completion"] == MOST
            assert said[0]["charged_completion"] == 50
            assert said[0]["charged_prompt"] <= plausible.PROMPT_SLACK + 200

    run(main())


def test_a_streams_absurd_usage_event_is_charged_at_most_the_models_window() -> None:
    # The same lie in a stream's usage event, the client asking no max_tokens: its
    # completion is charged at most the model's window (it has no max_output).
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await _request(reader)) is not None:
            writer.write(streamed(LIE if b"lie" in request else HONEST))
            await writer.drain()

    async def main() -> None:
        async with gateway(engine) as (url, state):
            answer = await ask(url, "mallory", "lie", stream=True, max_tokens=None)
            assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
            assert '"usage"' not in answer.text  # (the client did not ask for it)
            again = await ask(url, "mallory", "hello", stream=True)
            assert again.status_code == 200, again.text
            rows = [r for r in state.ledger.take() if r["client"] == "mallory"]
            assert sum(r["completion_tokens"] for r in rows) == WINDOW + 1
            assert sum(r["prompt_tokens"] for r in rows) <= plausible.PROMPT_SLACK + 200
            assert implausible(state) == 1

    run(main())


def test_an_engines_absurd_usage_does_not_put_its_client_last_on_the_fair_queue() -> None:
    # The model's queue (one slot) orders clients by the tokens they were served: a
    # queued request answered with an absurd usage put its client 2 x 10^12 tokens
    # behind every other on the model's clock, so its every later request waited behind
    # all of theirs. Now the clock is charged the same capped figure as its limits.
    release = asyncio.Event()
    holding = asyncio.Event()

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await _request(reader)) is not None:
            if b"hold" in request:
                holding.set()
                await release.wait()
            writer.write(whole(LIE if b"lie" in request else HONEST))
            await writer.drain()

    async def main() -> None:
        async with gateway(engine, slots=1) as (url, state):
            first = asyncio.create_task(ask(url, "alice", "hold"))
            await holding.wait()
            queued = asyncio.create_task(ask(url, "mallory", "lie"))
            while not (q := state.queues.get("chat")) or q.length < 1:
                await asyncio.sleep(0.01)
            release.set()
            assert (await first).status_code == 200
            assert (await queued).status_code == 200
            behind = q.vt.get("mallory", q.clock) - q.clock
            assert behind <= plausible.PROMPT_SLACK + 200 + 50, behind
            assert implausible(state) == 1

    run(main())


def test_a_tokenize_count_past_any_prompt_makes_no_kilobytes_long_refusal() -> None:
    # A prompt over the window by its byte bound is counted by the engine's /tokenize:
    # a count of 4,000 digits (JSON has no bound; Python reads 4,300) went into the
    # refusal's message (context_length_exceeded, 4 KB), the reservation and the log
    # line. Now a count past an engine's int32 is no count: the estimate is used.
    async def tokenize(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text='{"count": 1' + "0" * 4000 + "}", content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/tokenize", tokenize)
        upstream = Upstream(2, 30, 60)
        text = "word " * 2_000  # 10,000 bytes: over the window by its bound, not estimated
        req = admission.parse_request(
            {"model": "chat", "messages": [{"role": "user", "content": text}]}, admission.CHAT
        )
        m = build([chat_model()], [], 1).models["chat"]
        try:
            async with served(app) as url:
                tokens, how = await upstream.count(url, "chat", req)
        finally:
            await upstream.close()
        assert tokens <= admission.MAX_INT and "estimate" in how, (len(str(tokens)), how)
        try:
            admission.fits(req, m, tokens, how)
        except admission.Refusal as refusal:
            assert len(refusal.message) < 400, len(refusal.message)
        # And a count in bounds that does not fit is refused in a message of its size.
        try:
            admission.fits(req, m, admission.MAX_INT, "by the engine's tokenizer")
        except admission.Refusal as refusal:
            assert str(admission.MAX_INT) in refusal.message and len(refusal.message) < 400
        else:
            raise AssertionError("not refused")

    run(main())
