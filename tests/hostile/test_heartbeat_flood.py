"""Floods of the heartbeat port of a real ``llmgw serve``, by a sender with no token:
``/healthz`` keeps answering, and SIGTERM still stops the server.

Before the listener had its own thread and bounds, a 64 KiB datagram of ``HB a b c``
lines (7,281 lines, each hashed and answered) cost the API's event loop ~45 ms, so
100 such datagrams a second left ``/healthz`` answering twice in 10-15 s; one TCP
connection sending the same lines did as much. Scaled down from the hostile review's
tests (tests/attack on its branch): a few seconds of flood, and a bound on each probe
(PROBE_TIMEOUT_S) that the old listener missed by far and the new one meets with
room on a busy machine.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.server import ApiServer, Tokens, running

pytestmark = pytest.mark.slow

GARBAGE = b"HB a b c\n" * (65507 // 9)  # the largest datagram, every line refused
# The old listener left /healthz 3.6 s a probe under this UDP flood (2 probes in 6 s);
# the new one answers in under 10 ms: 2 s is room enough for a busy CI machine.
PROBE_TIMEOUT_S = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _server(tmp_path: Path, sqlite_url: str) -> tuple[ApiServer, int]:
    port = _free_port()
    settings = tmp_path / "llmgw.toml"
    settings.write_text(f"[server]\nheartbeat_port = {port}\n")
    server = ApiServer(
        tmp_path, sqlite_url, tokens=Tokens.issue(), env={"LLMGW_SETTINGS": str(settings)}
    )
    return server, port


@contextlib.contextmanager
def _flooding(flood: Callable[[threading.Event], None]) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=flood, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def _udp_flood(port: int) -> Callable[[threading.Event], None]:
    def flood(stop: threading.Event) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0)
            while not stop.is_set():
                with contextlib.suppress(OSError):
                    s.sendto(GARBAGE, ("127.0.0.1", port))
                time.sleep(0.005)  # ~200 datagrams a second, 13 MB/s

    return flood


def _probe(url: str, count: int) -> None:
    """``count`` consecutive /healthz, each answered within PROBE_TIMEOUT_S."""
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        for _ in range(count):
            assert client.get(f"{url}/healthz").status_code == 200
            time.sleep(0.1)


def test_a_udp_flood_of_garbage_heartbeats_leaves_healthz_answering(
    tmp_path: Path, sqlite_url: str
) -> None:
    server, port = _server(tmp_path, sqlite_url)
    with running(server), _flooding(_udp_flood(port)):
        time.sleep(0.5)  # the flood under way (the probes below are what is judged)
        _probe(server.url, 15)
        # Not a single answer went back to the (forgeable) sender of garbage.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(1.0)
            s.sendto(b"HB a b c\n", ("127.0.0.1", port))
            with pytest.raises(TimeoutError):
                s.recv(65536)


def test_a_tcp_flood_on_one_connection_leaves_healthz_answering(
    tmp_path: Path, sqlite_url: str
) -> None:
    """The same lines on one connection: closed at the first refused line. A sender
    who reconnects for every burst costs one line's check each time."""
    server, port = _server(tmp_path, sqlite_url)

    def drain(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(1 << 20):
                pass

    def flood(stop: threading.Event) -> None:
        chunk = b"HB a b c\n" * 30000
        while not stop.is_set():
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                continue
            reader = threading.Thread(target=drain, args=(conn,), daemon=True)
            reader.start()
            with contextlib.suppress(OSError), conn:
                while not stop.is_set():
                    conn.sendall(chunk)  # until the server closes it (the old one never did)
            reader.join(10)

    with running(server), _flooding(flood):
        time.sleep(0.5)
        _probe(server.url, 15)


def test_sigterm_during_a_udp_flood(tmp_path: Path, sqlite_url: str) -> None:
    server, port = _server(tmp_path, sqlite_url)
    server.start()
    try:
        with _flooding(_udp_flood(port)):
            _probe(server.url, 3)
            status = server.stop(timeout=60)
    finally:
        server.stop()
    assert status == 0
