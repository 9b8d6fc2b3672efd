"""Headers a client chooses: a Content-Length no real client sends, a body never finished.

Both used to reach code that raised: `int()` of a Content-Length of more than 4,300
digits (valid HTTP when they are leading zeros, which the HTTP parser reads as the
small number they are) was a 500 with a traceback on the lean node-report path and on
every route that reads a body; a client that went away mid-body was logged as a server
error with its traceback.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.api.guards.bodies import declared_length
from tests.api.server import ApiServer, Tokens, running
from tests.support import definition

ZEROS = b"0" * 5_000


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as server:
        yield server


def _exchange(api: ApiServer, request: bytes) -> bytes:
    """Send ``request`` as it is on a new connection; the status line answered."""
    host, port = api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def _request(method: str, path: str, token: str, length: bytes, body: bytes) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: llmgw\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\n".encode()
        + b"Content-Length: "
        + length
        + b"\r\n\r\n"
        + body
    )


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (b"46", 46),
        (b"0046", 46),
        (ZEROS + b"46", 46),
        (b"0", 0),
        (b"9" * 40, 10**18),  # more than any limit, never converted whole
        ("²".encode("latin-1"), None),  # str.isdigit takes it; int() does not
        (b"4 6", None),
        (b"", None),
        (b"-1", None),
    ],
)
def test_a_content_length_is_read_as_a_count_or_not_at_all(value: bytes, read: int | None) -> None:
    assert declared_length(value) == read
    assert declared_length(value.decode("latin-1")) == read


def test_a_report_whose_length_has_thousands_of_leading_zeros_is_taken_not_a_500(
    api: ApiServer, tokens: Tokens
) -> None:
    body = json.dumps({"name": "node-0", "gpu_class": "A100", "gpus": 8}).encode()
    status = _exchange(
        api,
        _request("PUT", "/v1/nodes/node-0", tokens.agent, ZEROS + str(len(body)).encode(), body),
    )
    assert status == b"HTTP/1.1 200 OK"
    with api.client(tokens.reader) as reader:
        listed = reader.get("/v1/nodes").json()
    assert [n["gpus"] for n in listed if n["name"] == "node-0"] == [8]


def test_a_catalog_body_whose_length_has_thousands_of_leading_zeros_is_taken_not_a_500(
    api: ApiServer, tokens: Tokens
) -> None:
    body = json.dumps(definition("zeros-7b")).encode()
    status = _exchange(
        api,
        _request(
            "POST", "/v1/catalog/models", tokens.operator, ZEROS + str(len(body)).encode(), body
        ),
    )
    assert status == b"HTTP/1.1 201 Created"


def test_a_client_that_leaves_mid_body_is_logged_as_gone_not_as_a_server_error(
    api: ApiServer, tokens: Tokens
) -> None:
    body = json.dumps({"name": "node-1", "gpus": 0}).encode()
    host, port = api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        # Twice the body announced, half of it sent, then the connection closed.
        conn.sendall(
            _request("PUT", "/v1/nodes/node-1", tokens.agent, b"%d" % (2 * len(body)), body)
        )
    deadline = time.monotonic() + 60
    while not api.logs("api.client_gone") and time.monotonic() < deadline:
        time.sleep(0.05)

    (gone,) = api.logs("api.client_gone")
    assert gone["path"] == "/v1/nodes/node-1" and gone["level"] == "info"
    assert api.logs("api.error") == []
    assert "Traceback" not in api.log_text()
    with api.client(tokens.reader) as reader:
        assert reader.get("/healthz").status_code == 200
