"""The gateway's ASGI app, answer by answer: what every answer carries and what a refusal
says, driven through the real ``GatewayApp`` (its State, Proxy and engine pool) in
process; the engine side is ``test_proxy_stream``'s."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from structlog.testing import capture_logs

from gateway.proxy import Proxy
from gateway.server import GatewayApp
from gateway.settings import GatewaySettings
from gateway.state import Client, State
from gateway.table import build
from gateway.upstream import Upstream
from tests.unit.gateway.test_admission_routing import model

CLIENT = "client-token"
LIMITED = "limited-token"
READER = "reader-token"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _app(*, synced: bool = True, max_body_bytes: int = 8 << 20) -> tuple[GatewayApp, Upstream]:
    state = State("gw-test")
    # "chat" has replicas starting but none ready: a request to it waits, so the tests
    # here use models that refuse before that.
    state.install(
        build([model("chat", aliases=["assistant"], max_output=100), model("other")], [], 1)
    )
    state.clients = {
        _digest(CLIENT): Client("c", None),
        _digest(LIMITED): Client("limited", ("other",)),
    }
    state.readers = {_digest(READER): "reader"}
    state.synced = synced
    settings = GatewaySettings(
        server="http://cp", token="t", max_body_bytes=max_body_bytes, max_wait_s=0.0
    )
    upstream = Upstream(2, 5, 1)
    return GatewayApp(state, Proxy(state, upstream, settings), settings), upstream


async def _call(
    app: GatewayApp,
    method: str,
    path: str,
    body: bytes = b"",
    token: str | None = CLIENT,
) -> Answer:
    headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    sent: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # (the client never goes away here)
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    assert start["type"] == "http.response.start"
    got = {k.decode(): v.decode() for k, v in start["headers"]}
    return Answer(start["status"], got, b"".join(m.get("body", b"") for m in sent[1:]))


def _run(test: Callable[[GatewayApp], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        app, upstream = _app(**kw)
        try:
            await test(app)
        finally:
            await upstream.close()

    asyncio.run(main())


CHAT = "/v1/chat/completions"
HI = b'"messages": [{"role": "user", "content": "hi"}]'


def test_every_answer_carries_an_x_request_id_refusals_included_and_the_log_line_has_it() -> None:
    # The docs promise an x-request-id on each answer; refusals had none, although
    # their log line had one: a client quoting a refusal could not be found in the log.
    async def test(app: GatewayApp) -> None:
        answers = {
            "no key": await _call(app, "POST", CHAT, b"{}", token=None),
            "bad key": await _call(app, "POST", CHAT, b"{}", token="wrong"),
            "not json": await _call(app, "POST", CHAT, b"{"),
            "unknown model": await _call(app, "POST", CHAT, b'{"model": "nope", ' + HI + b"}"),
            "not allowed": await _call(
                app, "POST", CHAT, b'{"model": "chat", ' + HI + b"}", token=LIMITED
            ),
            "max_tokens": await _call(
                app, "POST", CHAT, b'{"model": "chat", "max_tokens": 1000, ' + HI + b"}"
            ),
            "too large": await _call(app, "POST", CHAT, b" " * 2048),
            "no replica": await _call(app, "POST", CHAT, b'{"model": "other", ' + HI + b"}"),
            "method": await _call(app, "GET", CHAT),
            "method other": await _call(app, "DELETE", "/v1/models"),
            "no route": await _call(app, "GET", "/nowhere"),
            "models": await _call(app, "GET", "/v1/models"),
            "model": await _call(app, "GET", "/v1/models/nope"),
            "healthz": await _call(app, "GET", "/healthz", token=None),
            "metrics no token": await _call(app, "GET", "/metrics", token=None),
            "metrics": await _call(app, "GET", "/metrics", token=READER),
            "routing client": await _call(app, "GET", "/routing"),
        }
        statuses = {name: a.status for name, a in answers.items()}
        assert statuses == {
            "no key": 401,
            "bad key": 401,
            "not json": 400,
            "unknown model": 404,
            "not allowed": 403,
            "max_tokens": 400,
            "too large": 413,
            "no replica": 503,
            "method": 405,
            "method other": 405,
            "no route": 404,
            "models": 200,
            "model": 404,
            "healthz": 200,
            "metrics no token": 401,
            "metrics": 200,
            "routing client": 403,
        }
        ids = {name: a.headers.get("x-request-id") for name, a in answers.items()}
        missing = [name for name, rid in ids.items() if not rid]
        assert not missing, f"answers without an x-request-id: {missing}"
        assert len(set(ids.values())) == len(ids), "each answer its own id"

    with capture_logs() as logs:
        _run(test, max_body_bytes=1024)
    # A refused inference request's log line names the id its answer carried.
    logged = [line["request_id"] for line in logs if line["event"] == "gateway.request"]
    assert len(logged) == 8


def test_a_refused_requests_answer_and_its_log_line_share_one_id() -> None:
    async def test(app: GatewayApp) -> None:
        with capture_logs() as logs:
            answer = await _call(app, "POST", CHAT, b'{"model": "nope", ' + HI + b"}")
        (line,) = [x for x in logs if x["event"] == "gateway.request"]
        assert answer.status == 404 and line["request_id"] == answer.headers["x-request-id"]

    _run(test)


def test_an_alias_refused_403_names_only_what_the_client_asked_for() -> None:
    # "assistant" maps to "chat": a token not allowed it must not learn the mapping
    # from the refusal (it said "model 'assistant (chat)'").
    async def test(app: GatewayApp) -> None:
        for path, body in [
            (CHAT, b'{"model": "assistant", ' + HI + b"}"),
            ("/v1/models/assistant", b""),
        ]:
            method = "POST" if body else "GET"
            answer = await _call(app, method, path, body, token=LIMITED)
            assert answer.status == 403, answer.body
            assert b"assistant" in answer.body
            assert b"chat" not in answer.body.replace(b"chat/completions", b""), answer.body

    _run(test)


def test_a_huge_integer_is_a_clean_400_naming_its_field_not_pythons_limit() -> None:
    # A 5,000-digit max_tokens answered with json.loads' words about
    # sys.set_int_max_str_digits; a 400-digit one was carried into the arithmetic and
    # the refusal's text. Integers the gateway reads are bounded, any integer's length
    # too, and the refusal is OpenAI's shape naming the field.
    huge = b"1" + b"0" * 5000

    async def test(app: GatewayApp) -> None:
        cases = [
            (b'{"model": "chat", "max_tokens": ' + huge + b", " + HI + b"}", "max_tokens"),
            (b'{"model": "chat", "max_tokens": ' + huge[:400] + b", " + HI + b"}", "max_tokens"),
            (
                b'{"model": "chat", "max_completion_tokens": 2147483648, ' + HI + b"}",
                "max_completion_tokens",
            ),
            (b'{"model": "chat", "seed": -' + huge + b", " + HI + b"}", "seed"),
            (
                b'{"model": "chat", "prompt": [[1, ' + huge + b"]]}",
                "prompt",
            ),
            (b'{"model": "chat", "prompt": [1, 2147483648]}', "prompt"),
            (b'{"model": "chat", "prompt": [-1]}', "prompt"),
        ]
        for body, field in cases:
            path = "/v1/completions" if b"prompt" in body else CHAT
            answer = await _call(app, "POST", path, body)
            assert answer.status == 400, (field, answer.body[:200])
            error = json.loads(answer.body)["error"]
            assert error["param"] == field and error["code"] == "invalid_value", error
            assert field in error["message"] and len(error["message"]) < 300, error
            assert "set_int_max_str_digits" not in error["message"]
            assert error["type"] == "invalid_request_error"
        # The largest allowed still passes admission (refused only by max_output here).
        answer = await _call(
            app, "POST", CHAT, b'{"model": "chat", "max_tokens": 2147483647, ' + HI + b"}"
        )
        assert answer.status == 400 and b"max_tokens_exceeded" in answer.body

    _run(test)
