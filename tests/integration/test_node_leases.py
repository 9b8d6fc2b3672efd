"""Node leases on both back ends: heartbeats renew a node's reported_at in one statement a
batch, never backwards, and a forgotten node's agent is asked for its full report; the
heartbeat listener's answers and bounds over a real socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, event

from llmgw.api.guards.tokens import TokenBook, issue_token
from llmgw.api.reports.heartbeat_listener import MAX_LINE, MAX_LINES, HeartbeatListener
from llmgw.api.reports.leases import LeaseBook
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.fleet.inventory import parse_node_report

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _store(engine: Engine, *names: str) -> SchedulerStore:
    store = SchedulerStore(engine)
    store.report([parse_node_report({"name": n, "gpus": 0}) for n in names], T0)
    return store


def _reported(store: SchedulerStore) -> dict[str, datetime]:
    return {n.name: n.reported_at for n in store.nodes()}


def test_a_batch_of_leases_is_one_statement_renews_forward_only_and_names_the_nodes_renewed(
    engine: Engine,
) -> None:
    store = _store(engine, "a", "b", "c")
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    later = T0 + timedelta(seconds=10, microseconds=7)
    renewed = store.renew_leases({"a": later, "b": T0 - timedelta(seconds=5), "gone": later})
    assert renewed == {"a", "b"}  # "gone" has no row
    assert [s for s in statements if "UPDATE nodes" in s] == [statements[-1]]
    assert _reported(store) == {"a": later, "b": T0, "c": T0}  # b's older time did not win


def test_a_heartbeat_is_taken_only_for_the_report_held_and_a_forgotten_node_is_asked_again(
    engine: Engine,
) -> None:
    store = _store(engine, "a", "b")
    book = LeaseBook(store, contextlib.nullcontext())
    first = book.accepted("a")
    second = book.accepted("a")
    b = book.accepted("b")
    at = T0 + timedelta(seconds=30)
    assert book.renew([("a", first), ("a", second), ("b", b), ("c", "x.1")], at) == [
        False,  # a report since replaced
        True,
        True,
        False,  # never reported here
    ]
    store.forget("b")
    assert book.flush() == 1
    assert _reported(store) == {"a": at}
    assert book.renew([("a", second), ("b", b)], at) == [True, False]  # b: send the report
    assert book.flush() == 1


async def _listening(
    store: SchedulerStore, max_connections: int = 10
) -> tuple[HeartbeatListener, LeaseBook, dict[str, str]]:
    issued = {n: issue_token(f"agent-{n}", "agent", [n]) for n in ("a", "b")}
    book = LeaseBook(store, contextlib.nullcontext())
    listener = HeartbeatListener(
        book, TokenBook([t.entry for t in issued.values()]), max_connections=max_connections
    )
    await listener.start("127.0.0.1", 0)
    return listener, book, {n: t.token for n, t in issued.items()}


@contextlib.asynccontextmanager
async def _connection(
    port: int,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()


async def _ask(port: int, *lines: bytes) -> list[bytes]:
    async with _connection(port) as (reader, writer):
        writer.write(b"".join(lines))
        return [await asyncio.wait_for(reader.readline(), 30) for _ in lines]


def test_the_listener_answers_each_nodes_heartbeat_with_its_own_credential(engine: Engine) -> None:
    store = _store(engine, "a", "b")

    async def scenario() -> None:
        listener, book, tokens = await _listening(store)
        try:
            held = book.accepted("a")
            answers = await _ask(
                listener.leases.port or 0,
                f"HB a {tokens['a']} {held}\n".encode(),
                f"HB a {tokens['a']} not-held\n".encode(),
                f"HB a {tokens['b']} {held}\n".encode(),  # b's token for a's node
            )
            assert answers == [
                b"OK a\n",
                b"REPORT a\n",
                b"DENIED a this token may not report this node\n",
            ]
            answers = await _ask(listener.leases.port or 0, f"HB b nonsense {held}\n".encode())
            assert answers == [b"DENIED b unknown token\n"]
        finally:
            await listener.stop()

    asyncio.run(scenario())
    assert store.renew_leases({}) == set()


def test_the_listener_bounds_lines_and_connections(engine: Engine) -> None:
    store = _store(engine, "a")

    async def scenario() -> None:
        listener, book, tokens = await _listening(store, max_connections=1)
        port = listener.leases.port or 0
        try:
            async with _connection(port) as (reader, writer):
                writer.write(b"x" * (MAX_LINE + 1))
                assert (await asyncio.wait_for(reader.readline(), 30)).startswith(b"BAD ")
                assert await asyncio.wait_for(reader.read(), 30) == b""  # closed
            async with _connection(port) as (reader, writer):
                writer.write(b"HB a\n")
                assert (await asyncio.wait_for(reader.readline(), 30)).startswith(b"BAD ")
            # One connection open: the next is answered BUSY and closed.
            async with _connection(port) as (reader, writer):
                held = book.accepted("a")
                writer.write(f"HB a {tokens['a']} {held}\n".encode())
                assert await asyncio.wait_for(reader.readline(), 30) == b"OK a\n"
                async with _connection(port) as (busy, _):
                    assert (await asyncio.wait_for(busy.readline(), 30)).startswith(b"BUSY ")
        finally:
            await listener.stop()

    asyncio.run(scenario())


def test_a_connection_left_silent_is_closed(engine: Engine) -> None:
    store = _store(engine, "a")

    async def scenario() -> None:
        book = LeaseBook(store, contextlib.nullcontext())
        listener = HeartbeatListener(book, TokenBook([]), idle_timeout_s=0.2)
        port = await listener.start("127.0.0.1", 0)
        try:
            async with _connection(port) as (reader, _):
                assert await asyncio.wait_for(reader.read(), 30) == b""
        finally:
            await listener.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("period", [0.05])
def test_the_writer_thread_writes_leases_until_stopped_and_once_more(
    engine: Engine, period: float
) -> None:
    import threading

    store = _store(engine, "a")
    book = LeaseBook(store, contextlib.nullcontext(), period_s=period)
    stopping = threading.Event()
    thread = book.start(stopping)
    held = book.accepted("a")
    at = T0 + timedelta(minutes=1)
    book.renew([("a", held)], at)
    stopping.set()
    thread.join(30)
    assert _reported(store) == {"a": at}


def test_heartbeats_as_datagrams_are_answered_to_their_sender_and_bounded(engine: Engine) -> None:
    store = _store(engine, "a")

    async def scenario() -> None:
        listener, book, tokens = await _listening(store)
        port = listener.leases.port or 0
        held = book.accepted("a")
        loop = asyncio.get_running_loop()
        answers: asyncio.Queue[bytes] = asyncio.Queue()

        class Client(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: object) -> None:
                answers.put_nowait(data)

        transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
        try:
            transport.sendto(f"HB a {tokens['a']} {held}\nHB a {tokens['a']} other\n".encode())
            assert await asyncio.wait_for(answers.get(), 30) == b"OK a\nREPORT a\n"
            # A bad or denied datagram is dropped unanswered (its sender may be forged):
            # the next answer is the next good datagram's.
            transport.sendto(b"x" * (MAX_LINE + 1))
            transport.sendto(f"HB a {tokens['b']} {held}\n".encode())
            transport.sendto(f"HB a {tokens['a']} {held}\n".encode())
            assert await asyncio.wait_for(answers.get(), 30) == b"OK a\n"
            assert listener.dropped == 2 and answers.empty()
            assert book.flush() == 1  # the OK renewed the lease
        finally:
            transport.close()
            await listener.stop()

    asyncio.run(scenario())
    assert _reported(store)["a"] > T0


def test_a_denied_line_closes_the_connection_with_the_rest_unread(engine: Engine) -> None:
    """An unauthenticated sender holds no connection: one DENIED line and it is closed
    (else a line every idle timeout would hold a slot for good, and agents get BUSY)."""
    store = _store(engine, "a")

    async def scenario() -> None:
        listener, book, tokens = await _listening(store)
        held = book.accepted("a")
        try:
            async with _connection(listener.leases.port or 0) as (reader, writer):
                writer.write(f"HB a nope {held}\nHB a {tokens['a']} {held}\n".encode())
                assert await asyncio.wait_for(reader.read(), 30) == b"DENIED a unknown token\n"
            assert book.heartbeats == 0 and not listener.open  # the good line was not read
        finally:
            await listener.stop()

    asyncio.run(scenario())


def test_a_connection_is_answered_at_most_max_lines_a_turn_and_in_order(engine: Engine) -> None:
    """A burst on one connection is answered MAX_LINES lines at a time, a turn of the
    loop each, so other connections are answered between; every line still in order."""
    store = _store(engine, "a")

    async def scenario() -> None:
        listener, book, tokens = await _listening(store)
        batches: list[int] = []
        answer = listener.answer

        def counted(lines: list[bytes]) -> tuple[bytes, bool]:
            batches.append(len(lines))
            return answer(lines)

        listener.answer = counted  # type: ignore[method-assign]
        held = book.accepted("a")
        lines = [f"HB a {tokens['a']} {held if i % 2 else 'old'}\n".encode() for i in range(700)]
        try:
            answers = await _ask(listener.leases.port or 0, *lines)
            assert answers == [b"REPORT a\n", b"OK a\n"] * 350
            assert max(batches) == MAX_LINES and sum(batches) == 700
        finally:
            await listener.stop()

    asyncio.run(scenario())


def test_a_datagram_is_answered_only_whole_well_formed_authenticated_and_no_larger(
    engine: Engine,
) -> None:
    """No reflection: a datagram of more than MAX_LINES lines, or with any line bad or
    denied, is dropped unanswered and renews nothing; an answer is never larger."""
    store = _store(engine, "a")

    async def scenario() -> None:
        listener, book, tokens = await _listening(store)
        held = book.accepted("a")
        good = f"HB a {tokens['a']} {held}\n".encode()
        assert listener.answer_datagram(good * MAX_LINES) == b"OK a\n" * MAX_LINES
        assert book.heartbeats == MAX_LINES
        for dropped in (
            good * (MAX_LINES + 1),
            good + b"HB a b c\n",
            b"HB a b c\n" * 7278,
            good + f"HB a {tokens['b']} {held}\n".encode(),
            b"\n",
        ):
            assert listener.answer_datagram(dropped) is None
        assert book.heartbeats == MAX_LINES  # nothing more renewed
        await listener.stop()

    asyncio.run(scenario())


def test_the_listener_thread_keeps_its_own_loop(engine: Engine) -> None:
    """The listener runs on a thread and loop of its own: while it is busy (here, held
    inside a token check), the caller's loop still runs and a heartbeat is queued, not
    lost; it is answered once the listener is free, and stopping closes its sockets."""
    import socket
    import threading

    from llmgw.api.reports.heartbeat_listener import ListenerThread

    store = _store(engine, "a")
    issued = issue_token("agent-a", "agent", ["a"])
    inside, release = threading.Event(), threading.Event()

    class SlowBook(TokenBook):
        def verify(self, token: str):  # type: ignore[no-untyped-def]
            inside.set()
            release.wait(30)
            return super().verify(token)

    book = LeaseBook(store, contextlib.nullcontext())
    thread = ListenerThread(HeartbeatListener(book, SlowBook([issued.entry])))
    port = thread.start("127.0.0.1", 0)
    held = book.accepted("a")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"HB a {issued.token} {held}\n".encode())
            assert inside.wait(30)

            async def api_turns() -> int:
                turns = 0
                for _ in range(100):
                    await asyncio.sleep(0)
                    turns += 1
                return turns

            assert asyncio.run(api_turns()) == 100  # this loop is not the listener's
            release.set()
            assert sock.recv(100) == b"OK a\n"
    finally:
        release.set()
        thread.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_line_never_ended_holds_no_connection_and_a_sender_without_a_token_gives_way(
    engine: Engine,
) -> None:
    """Attack (no token needed): a connection sending a byte of a line it never ends, once
    an idle timeout (up to MAX_LINE of them: 42 hours at 300 s), was never idle, and
    10,000 such connections (33 bytes a second) held every slot: every agent answered
    BUSY, sending full reports instead, the load the listener exists to spare. A
    connection is idle without a heartbeat answered, and a full listener makes room by
    closing the oldest connection no heartbeat was taken on yet."""
    store = _store(engine, "a")

    async def scenario() -> None:
        issued = issue_token("agent-a", "agent", ["a"])
        book = LeaseBook(store, contextlib.nullcontext())
        listener = HeartbeatListener(
            book, TokenBook([issued.entry]), max_connections=1, idle_timeout_s=0.5
        )
        port = await listener.start("127.0.0.1", 0)
        held = book.accepted("a")
        try:
            async with _connection(port) as (reader, writer):
                started = asyncio.get_running_loop().time()
                closed = asyncio.ensure_future(reader.read())
                while not closed.done() and asyncio.get_running_loop().time() - started < 5:
                    writer.write(b"H")
                    await asyncio.sleep(0.1)
                assert closed.done(), "dripped for 5 s, still open"
                # Closed: an end of file, or a reset when a drip crossed the close.
                with contextlib.suppress(ConnectionResetError):
                    assert await closed == b""
            async with _connection(port) as (silent, _):
                await asyncio.sleep(0.05)
                # The one slot is taken by a connection without a heartbeat: an agent's
                # takes its place.
                async with _connection(port) as (reader, writer):
                    writer.write(f"HB a {issued.token} {held}\n".encode())
                    assert await asyncio.wait_for(reader.readline(), 30) == b"OK a\n"
                assert await asyncio.wait_for(silent.read(), 30) == (
                    b"BUSY too many heartbeat connections; send full reports\n"
                )
        finally:
            await listener.stop()

    asyncio.run(scenario())
