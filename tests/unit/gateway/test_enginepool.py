"""The gateway's connections to engines (``gateway.enginepool``) against real sockets.

Each test runs a small scripted engine on 127.0.0.1 (an asyncio server whose handler
says exactly what bytes go back), because what matters here is what an engine does on
the wire: keep-alive, chunked answers, idle closes, stalls, endless or broken heads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gateway.enginepool import HIGH_WATER, BrokenAnswer, EnginePool, Unreachable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
JSON = b'{"ok":true}'
WHOLE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n" + JSON


async def _request(reader: asyncio.StreamReader) -> bytes | None:
    """One request (head and Content-Length body), or None at the end of the stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


class Engine:
    """A scripted engine: ``handler(reader, writer, connection_number)`` per connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer, self.connections)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                self.closed += 1
                writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while await _request(reader) is not None:
        writer.write(WHOLE)
        await writer.drain()


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))


def test_answers_whole_and_chunked_over_one_kept_alive_connection() -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await _request(reader)) is not None:
            if b'"stream":true' in request:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for event in (b"data: a\n\n", b"data: [DONE]\n\n"):
                    writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    await writer.drain()
                    await asyncio.sleep(0.01)
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(WHOLE)
            await writer.drain()

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            pool = EnginePool(2, 5)
            for _ in range(3):
                answer = await pool.post(url + "/v1/chat/completions", b"{}")
                assert (answer.status, await answer.read()) == (200, JSON)
                assert answer.headers["content-type"] == "application/json"
                answer.release()
            answer = await pool.post(url + "/v1/chat/completions", b'{"stream":true}')
            pieces = [chunk async for chunk in answer.chunks()]
            assert b"".join(pieces) == b"data: a\n\ndata: [DONE]\n\n"
            assert answer.complete
            answer.release()
            assert scripted.connections == 1, "a complete answer's connection is reused"
            await pool.close()

    run(main())


def test_a_refused_connection_and_a_bad_endpoint_are_unreachable() -> None:
    async def main() -> None:
        pool = EnginePool(2, 5)
        with pytest.raises(Unreachable, match="connection refused"):
            await pool.post("http://127.0.0.1:1/v1/chat/completions", b"{}")
        for bad in ("ftp://engine/v1", "http://127.0.0.1:99999/v1", "http:///v1"):
            with pytest.raises(Unreachable, match="endpoint"):
                await pool.post(bad, b"{}")
        await pool.close()

    run(main())


def test_a_kept_alive_connection_closed_under_a_request_is_retried_once_on_a_new_one() -> None:
    # What engines do after 5 s idle (uvicorn, llama.cpp): read the next request and
    # close without a word. The engine never handled it; a new connection answers.
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(WHOLE)
        await writer.drain()
        await _request(reader)  # the second request on this connection: closed unanswered

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            pool = EnginePool(2, 5)
            for _ in range(2):
                answer = await pool.post(url + "/v1/completions", b"{}")
                assert await answer.read() == JSON
                answer.release()
            assert scripted.connections == 2
            await pool.close()

    run(main())


def test_a_new_connection_closed_without_an_answer_is_not_retried() -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            pool = EnginePool(2, 5)
            with pytest.raises(Unreachable, match="closed before an answer"):
                await pool.post(url + "/v1/completions", b"{}")
            assert scripted.connections == 1
            await pool.close()

    run(main())


def test_an_idle_connection_the_engine_closed_is_not_used_again() -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(WHOLE)
        await writer.drain()  # then closed at once, idle

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            pool = EnginePool(2, 5)
            for _ in range(3):
                answer = await pool.post(url + "/v1/completions", b"{}")
                assert await answer.read() == JSON
                answer.release()
                await asyncio.sleep(0.05)
            assert scripted.connections == 3
            await pool.close()

    run(main())


def test_idle_connections_are_closed_before_the_engine_would() -> None:
    async def main() -> None:
        scripted = Engine(keep_alive)
        async with scripted as url:
            pool = EnginePool(2, 5, idle_s=0.2)
            answer = await pool.post(url + "/v1/completions", b"{}")
            await answer.read()
            answer.release()
            for _ in range(50):
                if scripted.closed:
                    break
                await asyncio.sleep(0.05)
            assert scripted.closed == 1, "the idle connection was not closed by the gateway"
            await pool.close()

    run(main())


def test_a_silent_engine_times_out_before_and_after_its_head() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        if n == 2:  # the head, then nothing
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nabc")
            await writer.drain()
        await asyncio.sleep(10)

    async def main() -> None:
        scripted = Engine(silent)
        async with scripted as url:
            pool = EnginePool(2, 0.3)
            with pytest.raises(Unreachable, match="timed out"):
                await pool.post(url + "/v1/completions", b"{}")
            answer = await pool.post(url + "/v1/completions", b"{}")
            with pytest.raises(BrokenAnswer, match="timed out"):
                await answer.read()
            answer.close()
            await pool.close()

    run(main())


def test_an_answer_that_breaks_off_is_a_broken_answer_and_its_connection_is_dropped() -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b")
        await writer.drain()

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            pool = EnginePool(2, 5)
            answer = await pool.post(url + "/v1/completions", b"{}")
            with pytest.raises(BrokenAnswer, match="middle of the answer"):
                await answer.read()
            assert not answer.complete
            answer.release()  # not complete: closed, not pooled
            answer = await pool.post(url + "/v1/completions", b"{}")
            answer.close()
            assert scripted.connections == 2
            await pool.close()

    run(main())


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (b"HTTP/1.1 200 OK\r\nx-long: " + b"a" * (200 * 1024) + b"\r\n\r\n", "head over"),
        (b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * 20_000 + b"\r\n", "head over"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not HTTP/1.1"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\n", "not HTTP/1.1"),
    ],
    ids=["endless-header", "many-headers", "not-http", "two-lengths"],
)
def test_a_hostile_engines_answer_is_refused_with_a_reason(reply: bytes, words: str) -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(5)

    async def main() -> None:
        async with Engine(engine) as url:
            pool = EnginePool(2, 5)
            with pytest.raises(Unreachable, match=words):
                await pool.post(url + "/v1/completions", b"{}")
            await pool.close()

    run(main())


def test_a_fast_engine_is_paused_while_its_reader_does_not_read() -> None:
    # A slow client must not make the gateway hold a fast engine's whole answer.
    total = 8 * 1024 * 1024

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        block = b"x" * 65536
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()

    async def main() -> None:
        async with Engine(engine) as url:
            pool = EnginePool(2, 5)
            answer = await pool.post(url + "/v1/completions", b"{}")
            await asyncio.sleep(0.5)  # the engine writes as fast as it may
            held = answer._conn.buffered
            assert held <= HIGH_WATER + 256 * 1024, f"{held} bytes held unread"
            assert len(await answer.read()) == total  # reading resumes it
            answer.release()
            await pool.close()

    run(main())
