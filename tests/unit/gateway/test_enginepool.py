"""The gateway's connections to engines (``gateway.enginepool``) against real sockets.

Each test runs a small scripted engine on 127.0.0.1 (an asyncio server whose handler
says exactly what bytes go back), because what matters here is what an engine does on
the wire: keep-alive, chunked answers, idle closes, stalls, endless or broken heads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import struct
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvloop

from gateway.enginepool import HIGH_WATER, BrokenAnswer, EnginePool, Unreachable
from gateway.stages import admission
from gateway.upstream import Upstream

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


# --- A hostile or broken engine, a caller that goes away: what must not break. ---


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_callers_cancelled_at_every_await_leave_no_connection_open(loop: str) -> None:
    # What the gateway does when clients hang up: the request's task is cancelled
    # wherever it is (connecting, waiting for the head, draining a 5xx, streaming).
    # Every connection must then be closed at once, not at the read timeout (5 min by
    # default) or never (a paused one whose reader is gone).
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await _request(reader)) is not None:
            if b"503" in request:  # an error whose body is big and slow
                writer.write(b"HTTP/1.1 503 Busy\r\ncontent-length: 9000000\r\n\r\n")
                writer.write(b"x" * (HIGH_WATER * 2))
                await writer.drain()
                await reader.read()  # until the gateway closes it
            elif b"stream" in request:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                for _ in range(100):
                    writer.write(b"8\r\ndata: a\n\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.001)
                writer.write(b"0\r\n\r\n")
            else:
                await asyncio.sleep(0.002 * (n % 3))
                writer.write(WHOLE)
            await writer.drain()

    async def caller(upstream: Upstream, url: str, body: bytes) -> None:
        answer = None
        try:
            answer = await upstream.open(url, body)
            async for _ in answer.chunks():
                pass
        except Unreachable:
            pass
        finally:  # as ``proxy._send`` does
            if answer is not None and not answer.closed:
                answer.release() if answer.complete else answer.close()

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            upstream = Upstream(2, 60, 1)
            before = _open_fds()
            bodies = [b'{"503"}', b'{"stream"}', b"{}"]
            for i in range(600):
                task = asyncio.ensure_future(caller(upstream, url + "/v1", bodies[i % 3]))
                await asyncio.sleep(0.0005 * (i % 7))
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await upstream.close()
            for _ in range(100):
                if scripted.closed == scripted.connections:
                    break
                await asyncio.sleep(0.02)
            assert scripted.closed == scripted.connections, (
                f"{scripted.connections - scripted.closed} engine connections left open"
            )
            assert _open_fds() <= before + 1

    if loop == "uvloop":
        uvloop.run(asyncio.wait_for(main(), 60))
    else:
        asyncio.run(asyncio.wait_for(main(), 60))


def test_a_5xx_with_an_endless_body_is_not_read_into_memory() -> None:
    # The body of a 5xx is dropped: reading all of it would let a broken engine fill
    # the gateway's memory (and delay the retry elsewhere by as long as it takes).
    total = 64 * 1024 * 1024
    sent = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        nonlocal sent
        await _request(reader)
        writer.write(b"HTTP/1.1 500 Oops\r\ncontent-length: %d\r\n\r\n" % total)
        block = b"x" * 65536
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()
            sent += len(block)

    async def main() -> None:
        async with Engine(engine) as url:
            upstream = Upstream(2, 5, 1)
            with pytest.raises(Unreachable, match="answered 500"):
                await upstream.open(url + "/v1", b"{}")
            assert sent < total // 2, f"{sent} bytes of a 500's body read"
            await upstream.close()

    run(main())


def test_a_timeout_on_a_kept_alive_connection_is_not_retried() -> None:
    # The stale-connection retry is for a connection closed under the request (the
    # engine never saw it). A silent one did see it: sending it again would run it twice.
    requests = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        nonlocal requests
        while await _request(reader) is not None:
            requests += 1
            if requests > 1:
                await asyncio.sleep(10)  # works on it, silently, past the read timeout
            writer.write(WHOLE)
            await writer.drain()

    async def main() -> None:
        async with Engine(engine) as url:
            pool = EnginePool(2, 0.3)
            answer = await pool.post(url + "/v1", b"{}")
            await answer.read()
            answer.release()
            with pytest.raises(Unreachable, match="timed out"):
                await pool.post(url + "/v1", b"{}")
            assert requests == 2, "the engine was sent the request twice"
            await pool.close()

    run(main())


@pytest.mark.parametrize("split", [False, True], ids=["one-read", "two-reads"])
def test_bytes_after_a_complete_answer_are_nobodys(split: bool) -> None:
    # An engine that sends more than its answer (a length too short, an answer twice):
    # the extra bytes are neither the answer's nor the next request's.
    extra = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nsta"

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        first = n == 1  # (bytes that come after the next request cannot be told apart)
        while await _request(reader) is not None:
            if first:
                writer.write(WHOLE if split else WHOLE + extra)
                await writer.drain()
                if split:
                    await asyncio.sleep(0.05)
                    writer.write(extra)
                first = False
            else:
                writer.write(WHOLE)
            await writer.drain()

    async def main() -> None:
        async with Engine(engine) as url:
            pool = EnginePool(2, 5)
            answer = await pool.post(url + "/v1", b"{}")
            if split:
                await asyncio.sleep(0.1)
            assert await answer.read() == JSON
            answer.release()
            for _ in range(2):
                answer = await pool.post(url + "/v1", b"{}")
                assert (answer.status, await answer.read()) == (200, JSON)
                answer.release()
            await pool.close()

    run(main())


def test_interim_1xx_answers_are_skipped_and_101_is_refused() -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await _request(reader) is not None:
            if n == 1:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)  # the gateway sees the 100 alone
                writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + WHOLE)
            else:
                writer.write(b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            pool = EnginePool(2, 5)
            answer = await pool.post(url + "/v1", b"{}")
            assert (answer.status, await answer.read()) == (200, JSON)
            assert "link" not in answer.headers
            answer.release()
            answer = await pool.post(url + "/v1", b"{}")  # kept alive through the 1xx
            assert (answer.status, await answer.read()) == (200, JSON)
            answer.release()
            assert scripted.connections == 1
            pool._idle.clear()
            with pytest.raises(Unreachable):
                await pool.post(url + "/v1", b"{}")
            await pool.close()

    run(main())


@pytest.mark.parametrize("endless", [False, True], ids=["trailers", "endless-trailer"])
def test_trailers_are_not_headers_and_are_bounded(endless: bool) -> None:
    # A trailer is not a header: one named content-type replaced the answer's. And
    # httptools holds a trailer's value whole, as a header's: an endless one was
    # buffered without bound (the head's bound counted bytes before the body only).
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await _request(reader) is not None:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"transfer-encoding: chunked\r\n\r\nb\r\n" + JSON + b"\r\n0\r\n"
            )
            if not endless:
                writer.write(b"content-type: text/html\r\nx-checksum: 1\r\n\r\n")
            else:
                writer.write(b"x-endless: ")
                for _ in range(64):
                    writer.write(b"a" * 65536)
                    await writer.drain()
                await asyncio.sleep(10)
            await writer.drain()

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            pool = EnginePool(2, 5)
            answer = await pool.post(url + "/v1", b"{}")
            if endless:
                with pytest.raises(BrokenAnswer, match="head over"):
                    await answer.read()
                answer.close()
            else:
                assert await answer.read() == JSON
                assert answer.headers["content-type"] == "application/json"
                assert "x-checksum" not in answer.headers
                answer.release()
                answer = await pool.post(url + "/v1", b"{}")  # reused after trailers
                assert await answer.read() == JSON
                answer.release()
                assert scripted.connections == 1
            await pool.close()

    run(main())


@pytest.mark.parametrize(
    "endpoint",
    [
        "{url}/v1\r\nx-injected: 1\r\n\r\nGET /",
        "{url}/v 1",
        "{url}/v1\x00",
        "{url}/v1\x0b",
        "{url}/v\x7f1",
        "http://engine\x00.local:{port}/v1",
        "http://engine local:{port}/v1",
    ],
    ids=["crlf", "space", "nul", "vt", "del", "host-nul", "host-space"],
)
def test_an_endpoint_that_cannot_be_written_as_a_request_is_refused(endpoint: str) -> None:
    # Endpoints come from the control plane: one with a byte that cannot be in a
    # request-target or a host is refused as such, not written (urlsplit drops CR and
    # LF, leaving a space) nor failed on as the gateway's own error (a NUL in a host
    # made getaddrinfo raise ValueError, which is not an Unreachable).
    async def main() -> None:
        scripted = Engine(keep_alive)
        async with scripted as url:
            pool = EnginePool(2, 5)
            port = url.rsplit(":", 1)[1]
            with pytest.raises(Unreachable, match="endpoint"):
                await pool.post(endpoint.format(url=url, port=port), b"{}")
            assert scripted.connections == 0
            await pool.close()

    run(main())


def test_userinfo_is_not_sent_and_an_answer_finished_twice_touches_nobody_elses() -> None:
    heads: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await _request(reader)) is not None:
            heads.append(request)
            writer.write(WHOLE)
            await writer.drain()

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as plain:
            pool = EnginePool(2, 5)
            url = plain.replace("http://", "http://user:secret@")
            first = await pool.post(url + "/v1", b"{}")
            await first.read()
            first.release()
            assert first.closed
            second = await pool.post(url + "/v1", b"{}")  # the same connection
            first.close()  # a second finish of the first: not the second's connection
            assert not second.closed
            assert await second.read() == JSON
            second.release()
            third = await pool.post(url + "/v1", b"{}")
            third.release()
            assert scripted.connections == 1
            assert not any(b"secret" in head or b"user" in head for head in heads)
            await pool.close()

    run(main())


def test_a_connection_idle_past_idle_s_is_not_taken_though_not_yet_swept() -> None:
    # The sweep runs every idle_s / 2: a connection may sit idle up to 1.5 idle_s
    # (6 s) before it closes it, past the engines' 5 s. Taking it then is the race
    # IDLE_S is there to avoid.
    async def main() -> None:
        scripted = Engine(keep_alive)
        async with scripted as url:
            pool = EnginePool(2, 5, idle_s=60)
            answer = await pool.post(url + "/v1", b"{}")
            await answer.read()
            answer.release()
            (conn,) = pool._idle[answer._conn.target.key]
            conn.idle_since -= 61  # as if released 61 s ago, the sweep not yet run
            answer = await pool.post(url + "/v1", b"{}")
            assert await answer.read() == JSON
            answer.release()
            assert scripted.connections == 2
            await pool.close()

    run(main())


def test_an_endless_tokenize_answer_is_not_read_into_memory() -> None:
    # /tokenize is read whole; an endless answer (a broken engine) was read for as
    # long as the 5 s bound allowed: gigabytes on a fast link. Now it is an estimate.
    total = 256 * 1024 * 1024
    sent = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        nonlocal sent
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        block = b"[" + b"1," * 32767 + b"1"
        while sent < total - len(block):
            writer.write(block)
            await writer.drain()
            sent += len(block)

    async def main() -> None:
        async with Engine(engine) as url:
            upstream = Upstream(2, 5, 1)
            req = admission.parse_request(
                {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, admission.CHAT
            )
            tokens, how = await upstream.count(url, "m", req)
            assert how == "an estimate: the engine's /tokenize failed"
            assert tokens == admission.estimate(req)
            assert sent < total // 2, f"{sent} bytes of /tokenize read"
            await upstream.close()

    run(main())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_engines_with_a_verified_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The https path (no test had it): verified against the CAs the default context
    # loads (SSL_CERT_FILE here), refused unverified, kept alive when verified.
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip

    async def main(trusted: bool) -> None:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        connections = 0

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await keep_alive(reader, writer, connections)
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
        url = f"https://localhost:{server.sockets[0].getsockname()[1]}/v1"
        pool = EnginePool(2, 5)
        if not trusted:
            with pytest.raises(Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
                await pool.post(url, b"{}")
        else:
            for _ in range(2):
                answer = await pool.post(url, b"{}")
                assert (answer.status, await answer.read()) == (200, JSON)
                answer.release()
            assert connections == 1
        await pool.close()
        server.close()

    run(main(trusted=False))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    run(main(trusted=True))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_body_ended_by_a_reset_is_broken_not_complete(loop: str) -> None:
    # A body with no length ends with the connection: a clean close (FIN) ends it, a
    # reset (RST: the engine crashed, or was killed) breaks it. Taken as complete, the
    # truncated JSON went to the client as a 200.
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"partial":')
        await writer.drain()
        await asyncio.sleep(0.1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def main() -> None:
        async with Engine(engine) as url:
            pool = EnginePool(2, 5)
            answer = await pool.post(url + "/v1", b"{}")
            with pytest.raises(BrokenAnswer, match="middle of the answer"):
                await answer.read()
            assert not answer.complete
            answer.close()
            await pool.close()

    if loop == "uvloop":
        uvloop.run(asyncio.wait_for(main(), 30))
    else:
        run(main())


def test_an_answer_before_the_whole_request_was_sent_does_not_pool_its_connection() -> None:
    # An engine may answer from the head alone (a 413, a cached answer) and never read
    # the body. Pooled, that connection put the next request behind the unread body: it
    # waited out the read timeout. Go's client closes such a connection too.
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(WHOLE)
        await writer.drain()
        await asyncio.sleep(10)  # reads no more

    async def main() -> None:
        scripted = Engine(engine)
        async with scripted as url:
            pool = EnginePool(2, 1)
            answer = await pool.post(url + "/v1", b"x" * (32 << 20))
            assert await answer.read() == JSON
            answer.release()
            answer = await pool.post(url + "/v1", b"{}")
            assert await answer.read() == JSON
            answer.release()
            assert scripted.connections == 2
            await pool.close()

    run(main())


class _CountingLoop:
    """The running loop, counting the timers made through it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.timers = 0

    def call_at(self, when: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        self.timers += 1
        return self._loop.call_at(when, callback)

    def __getattr__(self, name: str) -> object:
        return getattr(self._loop, name)


def test_the_read_timer_is_one_per_connection_and_times_each_request_from_its_send() -> None:
    # Making and cancelling a timer per request was 1.3% of the gateway's CPU: the timer
    # stays armed across requests. A request must still time out read_timeout after
    # its own send, not after an earlier request's.
    requests = 0

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        nonlocal requests
        while await _request(reader) is not None:
            requests += 1
            if requests == 21:
                await asyncio.sleep(10)  # silent
            writer.write(WHOLE)
            await writer.drain()

    async def main() -> None:
        async with Engine(engine) as url:
            pool = EnginePool(2, 0.5)
            counting = _CountingLoop(pool.loop)
            pool.loop = counting  # type: ignore[assignment]
            for _ in range(20):
                answer = await pool.post(url + "/v1", b"{}")
                assert await answer.read() == JSON
                answer.release()
            assert counting.timers <= 2, f"{counting.timers} timers for 20 requests"
            await asyncio.sleep(0.3)  # most of the first request's timeout
            sent = pool.loop.time()
            with pytest.raises(Unreachable, match="timed out"):
                await pool.post(url + "/v1", b"{}")
            assert pool.loop.time() - sent >= 0.45, "timed out from an earlier request's send"
            await pool.close()

    run(main())


def test_relay_hands_pieces_to_the_sink_until_it_refuses_then_piece_takes_over() -> None:
    events = [b"data: %d\n\n" % i for i in range(8)]

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.005)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await _request(reader)

    async def main() -> None:
        async with Engine(engine) as url:
            pool = EnginePool(2, 5)
            answer = await pool.post(url + "/v1", b"{}")
            got: list[bytes] = []
            offered = 0

            def sink(piece: bytes) -> bool:
                nonlocal offered
                offered += 1
                if offered == 4:
                    return False  # refused: left for piece()
                got.append(piece)
                return True

            await answer.relay(sink)
            assert not answer.complete, "returned at the refusal, not at the end"
            refused = await answer.piece()
            assert refused is not None
            got.append(refused)
            await answer.relay(sink)  # the rest
            assert await answer.piece() is None
            assert b"".join(got) == b"".join(events)
            assert answer.complete
            answer.release()
            await pool.close()

    run(main())


def test_a_tokenize_answer_nested_past_the_parsers_depth_is_an_estimate() -> None:
    # Attack: an engine answers /tokenize with JSON nested 100,000 deep (within its
    # bound): json.loads raised RecursionError, which count() did not catch, and every
    # request of the model counted on that engine failed instead of being estimated.
    body = b"[" * 100_000 + b"]" * 100_000

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    async def main() -> None:
        async with Engine(engine) as url:
            upstream = Upstream(2, 5, 1)
            req = admission.parse_request(
                {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, admission.CHAT
            )
            tokens, how = await upstream.count(url, "m", req)
            assert how == "an estimate: the engine's /tokenize failed"
            assert tokens == admission.estimate(req)
            await upstream.close()

    run(main())
