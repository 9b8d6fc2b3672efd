"""Bodies and the connection cap of the guarded protocol, on real uvicorn servers.

Issue 36: 810 connections sending a head with ``Content-Length: 1000000`` and then a
byte a second held the 800-connection cap for as long as they liked (the application
answered 401 at once, the connection stayed open to read the body), and 800 unfinished
heads held it for the header timeout, again and again: every other client and
``/healthz`` got 503. Now an answer before the body closes the connection, a body must
keep up with a minimum rate within a total time, and when the cap is full a new
connection takes the place of the oldest one with no request being served. Scaled down:
a cap of 40, 50 attackers (810 and 800 in the issue) renewing what the server closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop
from structlog.testing import capture_logs

from httpguard import HeadLimits
from tests.unit.httpguard.serving import guarded_server

CAP = 40
ATTACKERS = 50
BOUND = 30.0


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/healthz`` and ``/open`` answer at once; ``/echo`` reads the body and answers its
    size; ``/locked`` answers 401 without reading the body, as the gateway does to a
    request without a token; ``/hold`` answers once ``release`` is set."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    status, body = 200, b"ok"
    if path == "/echo":
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = str(size).encode()
    elif path == "/locked":
        status, body = 401, b"no token"
    elif path == "/hold":
        await RELEASE.wait()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


RELEASE = asyncio.Event()


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The status line and the head's remaining lines of one answer (lower case)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
    status, _, rest = head.partition(b"\r\n")
    return status, rest.lower()


async def _get(port: int, path: str = "/healthz", *, retry: bool = False) -> bytes:
    """The status line of a GET on a new connection. ``retry``: once more if the
    connection is closed before any answer, as real clients do (the OpenAI client, a
    load balancer's health check): a new connection arriving in the same instant as
    more attackers than the cap can be the oldest that sent nothing yet."""
    for attempt in (1, 2):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
            status, _ = await _answer(reader)
            return status
        except (ConnectionError, asyncio.IncompleteReadError):
            if not retry or attempt == 2:
                raise
        finally:
            writer.close()
    raise AssertionError("unreachable")


def _run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 120))


def test_an_answer_given_before_the_body_closes_the_connection() -> None:
    async def main() -> None:
        async with guarded_server(app, coalesce=True) as sock:
            port = sock.getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /locked HTTP/1.1\r\nhost: t\r\ncontent-length: 1000000\r\n\r\nx")
            status, head = await _answer(reader)
            assert status == b"HTTP/1.1 401 Unauthorized"
            assert b"connection: close" in head
            # The client keeps dripping its body: the server still closes.
            started = time.monotonic()
            closed = asyncio.ensure_future(reader.read())
            while not closed.done() and time.monotonic() - started < BOUND:
                with contextlib.suppress(ConnectionError):
                    writer.write(b"x")
                await asyncio.wait([closed], timeout=0.2)
            assert closed.done(), "still open, reading a body nobody wants"
            assert closed.result() == b"no token"  # the answer's body, then the end
            writer.close()

    _run(main)


async def _drip(port: int, every: float, piece: bytes) -> tuple[bytes, float]:
    """A body of 10 MB sent ``piece`` by ``piece``: the answer's status line and when it came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 10000000\r\n\r\n")
    started = time.monotonic()
    answer = asyncio.ensure_future(_answer(reader))
    while not answer.done() and time.monotonic() - started < BOUND:
        with contextlib.suppress(ConnectionError):
            writer.write(piece)
        await asyncio.wait([answer], timeout=every)
    writer.close()
    assert answer.done(), f"no answer within {BOUND:g}s"
    return answer.result()[0], time.monotonic() - started


def test_a_body_behind_the_minimum_rate_is_answered_408_and_closed() -> None:
    # A byte every 0.1 s: far under 1,000 bytes a second once the first 0.5 s are over.
    # The total time (60 s) is beyond the bound: only the rate can end it.
    limits = HeadLimits(header_timeout_s=0.5, body_min_rate=1000, body_timeout_s=60.0)

    async def main() -> None:
        async with guarded_server(app, limits, coalesce=False) as sock:
            status, _ = await _drip(sock.getsockname()[1], 0.1, b"x")
            assert status == b"HTTP/1.1 408 Request Timeout"

    _run(main)


def test_a_body_that_keeps_up_but_takes_longer_than_the_total_is_answered_408() -> None:
    # 500 bytes every 0.1 s is far over 1 byte a second: only the total time (2 s) ends it.
    limits = HeadLimits(header_timeout_s=0.5, body_min_rate=1, body_timeout_s=2.0)

    async def main() -> None:
        async with guarded_server(app, limits, coalesce=True) as sock:
            status, after = await _drip(sock.getsockname()[1], 0.1, b"x" * 500)
            assert status == b"HTTP/1.1 408 Request Timeout"
            assert after > 1.9, f"answered after {after:.1f}s, before the total time"

    _run(main)


def test_a_slow_body_that_keeps_up_with_the_rate_is_read_whole() -> None:
    # 3,000 bytes in pieces of 200 every 0.1 s (2,000 bytes a second, slower than the
    # client could): far over 100 a second after 5 s, however late the pieces go out.
    limits = HeadLimits(header_timeout_s=5.0, body_min_rate=100, body_timeout_s=60.0)

    async def main() -> None:
        async with guarded_server(app, limits, coalesce=True) as sock:
            reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            writer.write(b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: 3000\r\n\r\n")
            for _ in range(15):
                writer.write(b"x" * 200)
                await asyncio.sleep(0.1)
            status, head = await _answer(reader)
            assert status == b"HTTP/1.1 200 OK"
            assert b"connection: close" not in head
            assert await reader.readexactly(4) == b"3000"
            # Kept alive: the next request on the same connection is answered.
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (await _answer(reader))[0] == b"HTTP/1.1 200 OK"
            writer.close()

    _run(main)


async def _attack(port: int, opening: bytes, drip: bytes, stop: asyncio.Event) -> None:
    """One attacker: a connection sending ``opening`` then ``drip`` every 0.2 s, opened
    again 0.2 s after the server closes it (a client opening connections as fast as it
    can is a connection flood, which no server answers: it takes the place of the
    newest connections before they send their first byte, as it does with nginx)."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        try:
            writer.write(opening)
            while not stop.is_set() and not reader.at_eof():
                writer.write(drip)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(65536), 0.2)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
        await asyncio.sleep(0.2)


async def _served_during(port: int, opening: bytes, drip: bytes) -> list[bytes]:
    """What other clients (``/healthz`` and a request) were answered while ``ATTACKERS``
    attackers, more than the cap, held and renewed their connections."""
    stop = asyncio.Event()
    attackers = [
        asyncio.ensure_future(_attack(port, opening, drip, stop)) for _ in range(ATTACKERS)
    ]
    answers: list[bytes] = []
    try:
        await asyncio.sleep(1.0)  # the cap is full by now: 50 attackers, 40 places
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            answers.append(await _get(port, "/healthz", retry=True))
            answers.append(await _get(port, "/open", retry=True))
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*attackers)
    return answers


def test_a_body_slowloris_beyond_the_cap_leaves_other_clients_and_healthz_answered() -> None:
    async def main() -> None:
        async with guarded_server(app, HeadLimits(max_connections=CAP), coalesce=True) as sock:
            opening = b"POST /locked HTTP/1.1\r\nhost: t\r\ncontent-length: 1000000\r\n\r\n"
            answers = await _served_during(sock.getsockname()[1], opening, b"x")
            assert answers and set(answers) == {b"HTTP/1.1 200 OK"}, set(answers)

    _run(main)


def test_unfinished_heads_beyond_the_cap_leave_other_clients_and_healthz_answered() -> None:
    async def main() -> None:
        # The header timeout (10 s) is longer than the attack: only making room helps.
        async with guarded_server(app, HeadLimits(max_connections=CAP), coalesce=False) as sock:
            answers = await _served_during(sock.getsockname()[1], b"GET / HTTP/1.1\r\n", b"x")
            assert answers and set(answers) == {b"HTTP/1.1 200 OK"}, set(answers)

    _run(main)


def test_requests_being_served_are_never_closed_to_make_room() -> None:
    async def main() -> None:
        RELEASE.clear()
        async with guarded_server(app, HeadLimits(max_connections=CAP), coalesce=True) as sock:
            port = sock.getsockname()[1]
            held = []
            for _ in range(CAP):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /hold HTTP/1.1\r\nhost: t\r\n\r\n")
                held.append((reader, writer))
            await asyncio.sleep(0.5)  # every request is in the application
            # Every place holds a request being served: nothing gives way to a new one.
            assert await _get(port) == b"HTTP/1.1 503 Service Unavailable"
            RELEASE.set()
            for reader, writer in held:
                assert (await _answer(reader))[0] == b"HTTP/1.1 200 OK"
                writer.close()

    _run(main)


def test_the_guards_own_answers_carry_the_servers_request_ids() -> None:
    """A server that names its answers (the gateway) names the ones httpguard gives before
    the application sees a request too: a 431 for an oversized head and a 408 for a head
    that stalls each carry a fresh ``x-request-id``, and the log line names it."""
    ids = iter(f"rid-{i}" for i in range(100))
    limits = HeadLimits(header_timeout_s=0.3)

    async def app(scope: Any, receive: Any, send: Any) -> None:  # never reached
        raise AssertionError(scope)

    async def scenario() -> tuple[bytes, bytes]:
        async with guarded_server(app, limits, coalesce=True, request_id=lambda: next(ids)) as sock:
            port = sock.getsockname()[1]

            async def ask(raw: bytes) -> bytes:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(raw)
                answer = await asyncio.wait_for(reader.read(), 30)
                writer.close()
                return answer

            large = await ask(b"GET / HTTP/1.1\r\nx-big: " + b"a" * 200_000 + b"\r\n\r\n")
            stalled = await ask(b"GET / HTTP/1.1\r\nhost: x\r\n")
            return large, stalled

    with capture_logs() as logs:
        large, stalled = asyncio.run(scenario())
    assert large.startswith(b"HTTP/1.1 431") and b"\r\nx-request-id: rid-0\r\n" in large
    assert stalled.startswith(b"HTTP/1.1 408") and b"\r\nx-request-id: rid-1\r\n" in stalled
    named = {entry.get("request_id") for entry in logs}
    assert {"rid-0", "rid-1"} <= named


def test_a_connection_not_reading_its_answer_gives_way_before_an_older_half_sent_head() -> None:
    """The hostile review after issue 36: a request whose answer waits on a client that
    never reads counted as being served, and such connections held the cap. Now one the
    server cannot write to gives way first, before even an older unfinished head."""
    BIG = b"x" * (8 << 20)
    sent = asyncio.Event()

    async def big(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = BIG if scope["path"] == "/big" else b"ok"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
        if body is BIG:
            sent.set()  # in the transport's buffer, most of it: writes paused

    async def main() -> None:
        async with guarded_server(big, HeadLimits(max_connections=2), coalesce=False) as sock:
            port = sock.getsockname()[1]
            loop = asyncio.get_running_loop()
            # The oldest: an unfinished head.
            half_r, half_w = await asyncio.open_connection("127.0.0.1", port)
            half_w.write(b"GET /healthz HTTP/1.1\r\n")
            await half_w.drain()
            # A client with a 1 KiB receive buffer asking for 8 MiB and reading none of it.
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            raw.setblocking(False)
            await loop.sock_connect(raw, ("127.0.0.1", port))
            await loop.sock_sendall(raw, b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
            await asyncio.wait_for(sent.wait(), BOUND)
            with capture_logs() as logs:
                assert await _get(port) == b"HTTP/1.1 200 OK"
            assert [e["kind"] for e in logs if e["event"] == "http.connection_reclaimed"] == [
                "unread"
            ]
            # The older unfinished head was left alone: it completes and is answered.
            half_w.write(b"host: t\r\n\r\n")
            assert (await _answer(half_r))[0] == b"HTTP/1.1 200 OK"
            half_w.close()
            raw.close()

    _run(main)


def test_a_request_served_behind_a_pipeline_is_told_its_client_is_gone() -> None:
    """uvicorn marks only its newest request gone when the connection is lost: with
    requests pipelined behind it, the one being served went on writing its answer to
    the closed transport (under uvloop an exception: an ``api.error`` traceback per
    connection). Now it is told, the rest of its answer is dropped, and one throttled
    line says so."""
    release = asyncio.Event()
    raised: list[BaseException] = []
    started = asyncio.Event()

    async def held(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        started.set()
        await release.wait()
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(20):
                await send({"type": "http.response.body", "body": b"x" * 65536, "more_body": True})
                await asyncio.sleep(0.01)
            await send({"type": "http.response.body", "body": b""})
        except BaseException as exc:
            raised.append(exc)
            raise

    async def main() -> None:
        async with guarded_server(held, coalesce=False) as sock:
            port = sock.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /a HTTP/1.1\r\nhost: t\r\n\r\n" * 3)
            await asyncio.wait_for(started.wait(), BOUND)
            # (The server reads no more while requests are queued: it learns that the
            # client is gone when it writes.)
            writer.transport.abort()
            release.set()
            while not raised and not [e for e in logs if e["event"] == "http.pipeline_dropped"]:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the application's remaining sends

    with capture_logs() as logs:
        uvloop.run(asyncio.wait_for(main(), 60))
    assert not raised, raised
    dropped = [e for e in logs if e["event"] == "http.pipeline_dropped"]
    assert len(dropped) == 1 and dropped[0]["queued"] == 2, dropped
