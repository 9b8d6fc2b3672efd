"""The agent's client given the control plane's replicas: it moves on when one fails it.

Real sockets on loopback: a port nobody listens on (a killed replica), a socket that
accepts connections but never answers (a frozen one: SIGSTOP leaves the kernel
accepting), a server that answers 503, and one that answers.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agent.client import ControlPlane, Refused, Unreachable
from catalog.forms.servers import ServerList


class _Answers(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = json.dumps([] if self.status == 200 else {"detail": "no"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Unavailable(_Answers):
    status = 503


class _Forbidden(_Answers):
    status = 403


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def answering() -> Iterator[str]:
    yield from _serve(_Answers)


@pytest.fixture
def unavailable() -> Iterator[str]:
    yield from _serve(_Unavailable)


@pytest.fixture
def forbidding() -> Iterator[str]:
    yield from _serve(_Forbidden)


@pytest.fixture
def dead() -> str:
    with socket.socket() as s:  # a port that was free a moment ago: nobody listens
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def frozen() -> Iterator[str]:
    """Listens and accepts into the backlog, never reads or answers (a SIGSTOPped server)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


@pytest.mark.parametrize("failing", ["dead", "frozen", "unavailable"])
def test_a_call_moves_to_the_next_replica_when_the_current_one_fails(
    failing: str, answering: str, request: pytest.FixtureRequest
) -> None:
    bad = str(request.getfixturevalue(failing))
    moves: list[tuple[str, str, str]] = []
    servers = ServerList((bad, answering), lambda *m: moves.append(m))
    # The full timeout is the last server's; the frozen one gets FAILOVER_TIMEOUT_S.
    client = ControlPlane(servers, "t", timeout=60)
    assert client.placements("n1") == []
    assert client.url == answering
    assert [(old, new) for old, new, _ in moves] == [(bad, answering)]
    # Sticky: the next call goes to the replica that answered, the failed one is not retried.
    assert client.placements("n1") == [] and len(moves) == 1


def test_when_every_replica_fails_the_call_is_unreachable(dead: str, unavailable: str) -> None:
    client = ControlPlane(ServerList((dead, unavailable)), "t", timeout=5)
    with pytest.raises(Unreachable, match="HTTP 503"):
        client.placements("n1")


def test_a_refusal_is_not_a_reason_to_move(forbidding: str, answering: str) -> None:
    """Every replica shares the tokens and the rules: each would refuse alike."""
    servers = ServerList((forbidding, answering))
    with pytest.raises(Refused):
        ControlPlane(servers, "t").placements("n1")
    assert servers.current == forbidding and servers.switches == 0
