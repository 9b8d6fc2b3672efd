"""An engine's answer toward the client is bounded in size (``max_answer_bytes``) and time
(``max_answer_s``), and a stream passed on is SSE: a scripted engine on a real socket, the
real ``GatewayApp`` served by httpguard's protocol as ``llmgw gateway`` serves it (so a
stream takes the relay path), and the official OpenAI client."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.proxy import Proxy
from gateway.server import GatewayApp
from gateway.settings import GatewaySettings
from gateway.state import Client, State
from gateway.table import build
from gateway.upstream import Upstream
from tests.unit.gateway.test_admission_routing import model
from tests.unit.gateway.test_enginepool import Engine, _request, run
from tests.unit.httpguard.serving import guarded_server

TOKEN = "client-token"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
BODY = {"model": "chat", "messages": HI, "stream": True}
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"delta": {"content": text}}]}).encode() + b"\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@asynccontextmanager
async def gateway(script: Script, **settings: Any) -> AsyncIterator[str]:
    """A gateway (one model, one ready replica: the scripted engine) at the URL yielded."""
    async with Engine(script) as url:
        state = State("gw-test")
        rows = [{"model": "chat", "replica": 0, "state": "ready", "endpoint": url}]
        state.install(build([model("chat")], rows, 1))
        state.clients = {hashlib.sha256(TOKEN.encode()).hexdigest(): Client("c", None)}
        state.synced = True
        config = GatewaySettings(server="http://cp", token="t", attempts=1, **settings)
        upstream = Upstream(2, 10, 1)
        app = GatewayApp(state, Proxy(state, upstream, config), config)
        try:
            async with guarded_server(app, coalesce=True) as sock:
                host, port = sock.getsockname()[:2]
                yield f"http://{host}:{port}"
        finally:
            await upstream.close()


async def events(url: str) -> list[dict[str, Any]]:
    """A stream's events as the OpenAI client reads them (an error event, which it
    raises, last)."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0)
    got: list[dict[str, Any]] = []
    try:
        stream = await client.chat.completions.create(model="chat", messages=HI, stream=True)
        async for ev in stream:
            got.append(ev.model_dump())
    except openai.APIError as exc:
        got.append({"error": exc.body, "message": exc.message})
    await client.close()
    return got


async def raw_stream(url: str) -> bytes:
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream(
            "POST",
            url + "/v1/chat/completions",
            json=BODY,
            headers={"authorization": f"Bearer {TOKEN}"},
        ) as answer,
    ):
        assert answer.status_code == 200
        return b"".join([part async for part in answer.aiter_bytes()])


def test_a_malformed_event_mid_stream_ends_it_with_an_error_event_not_garbage() -> None:
    # An engine's bytes that are not SSE reached the client verbatim. Now the stream's
    # well-formed events pass, then one error event ends it; nothing of the garbage.
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await _request(reader) is not None:
            writer.write(HEAD + chunk(event("one")) + chunk(event("two")))
            await writer.drain()
            await asyncio.sleep(0.05)  # (the relay path: pieces as they come)
            writer.write(chunk(event("three")))
            writer.write(chunk(b"<html>502 Bad Gateway</html>\n" + event("four")))
            writer.write(chunk(event("five")) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        async with gateway(engine) as url:
            raw = await raw_stream(url)
            assert b"<html>" not in raw and b"four" not in raw and b"five" not in raw
            assert raw.startswith(event("one") + event("two") + event("three")), raw
            assert raw.endswith(b"\n\n") and b'"code":"malformed_stream"' in raw, raw
            got = await events(url)
            texts = [e["choices"][0]["delta"]["content"] for e in got if "choices" in e]
            assert texts == ["one", "two", "three"]
            assert "not server-sent events" in got[-1]["message"], got[-1]

    run(main())


def test_a_stream_not_sse_from_its_start_is_a_failure_before_the_first_byte() -> None:
    # Nothing was sent yet: not garbage passed on with a 200, but the model's 503
    # naming why (another replica, when there is one, is tried).
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await _request(reader) is not None:
            writer.write(HEAD + chunk(b"<html>an error page</html>\n\n") + b"0\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        async with gateway(engine) as url:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=TOKEN, max_retries=0)
            with pytest.raises(openai.APIStatusError) as refused:
                await client.chat.completions.create(model="chat", messages=HI, stream=True)
            assert refused.value.status_code == 503
            assert "not server-sent events" in refused.value.message
            await client.close()

    run(main())


def test_a_stream_over_max_answer_bytes_ends_with_an_error_event_at_the_bound() -> None:
    # 2.8 GB in 20 s passed through: an answer has no end of its own. At the bound the
    # stream ends with an error event, and the engine's connection is closed.
    limit = 64 * 1024
    closed = asyncio.Event()

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(HEAD)
        try:
            while True:
                writer.write(chunk(event("x" * 1000)))
                await writer.drain()
                await asyncio.sleep(0)
        except ConnectionError:
            closed.set()

    async def main() -> None:
        async with gateway(engine, max_answer_bytes=limit) as url:
            raw = await raw_stream(url)
            body, _, error = raw.rpartition(b"\ndata: ")
            assert limit - 2048 < len(body) <= limit
            assert json.loads(error)["error"]["code"] == "answer_too_large", error
            assert b"max_answer_mb" in error
            await asyncio.wait_for(closed.wait(), 20)

    run(main())


def test_a_whole_answer_over_max_answer_bytes_is_cut_or_refused() -> None:
    big = b'{"data": "' + b"x" * (3 << 20) + b'"}'

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await _request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
            writer.write(b"content-length: %d\r\n\r\n%s" % (len(big), big))
            await writer.drain()

    async def main() -> None:
        body = {**BODY, "stream": False}
        auth = {"authorization": f"Bearer {TOKEN}"}
        # Past the bytes held before answering (1 MiB): the answer is cut short, and
        # the client sees a failure, not a complete 200.
        async with (
            gateway(engine, max_answer_bytes=2 << 20) as url,
            httpx.AsyncClient(timeout=30) as http,
        ):
            with pytest.raises(httpx.RemoteProtocolError):
                await http.post(url + "/v1/chat/completions", json=body, headers=auth)
        # Within them: nothing was sent, so it is refused whole, naming the bound.
        async with (
            gateway(engine, max_answer_bytes=256 << 10) as url,
            httpx.AsyncClient(timeout=30) as http,
        ):
            answer = await http.post(url + "/v1/chat/completions", json=body, headers=auth)
            assert answer.status_code == 502
            assert answer.json()["error"]["code"] == "answer_too_large"

    run(main())


def test_a_stream_past_max_answer_time_ends_with_an_error_event() -> None:
    # The read timeout bounds a silence; an engine that sends an event every 100 ms
    # never trips it. The answer's total time is bounded.
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(HEAD)
        while True:
            writer.write(chunk(event("x")))
            await writer.drain()
            await asyncio.sleep(0.1)

    async def main() -> None:
        async with gateway(engine, max_answer_s=1.0) as url:
            raw = await raw_stream(url)
            _, _, error = raw.rpartition(b"\ndata: ")
            assert json.loads(error)["error"]["code"] == "answer_timeout", error
            assert b"max_answer_time" in error and raw.count(b"data: ") > 2

    run(main())
