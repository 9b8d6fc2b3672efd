"""The sim engine bounds request heads as the API does (httpguard): 431, and 408 on a stall."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from tests.integration.sim_process import BOUND, sim_engine


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, int]]:
    with sim_engine("--header-timeout", "1") as port:
        yield "127.0.0.1", port


def _exchange(where: tuple[str, int], request: bytes) -> bytes:
    with socket.create_connection(where, timeout=BOUND) as conn:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(request)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := conn.recv(65536):
                answer += chunk
    return answer.split(b"\r\n", 1)[0]


def test_a_1_mib_header_is_answered_431_by_the_sim(sim: tuple[str, int]) -> None:
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    assert _exchange(sim, big) == b"HTTP/1.1 431 Request Header Fields Too Large"
    many = b"".join(b"X-%d: v\r\n" % i for i in range(10_000))
    assert _exchange(sim, b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n").startswith(
        b"HTTP/1.1 431"
    )


def test_a_half_sent_request_to_the_sim_is_closed_after_its_header_timeout(
    sim: tuple[str, int],
) -> None:
    assert _exchange(sim, b"GET /health HTTP/1.1\r\nHost: x\r\n") == b"HTTP/1.1 408 Request Timeout"
