"""engine-check's verdicts: from what an engine answered, one line a claim."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import Catalog
from catalog.definition.parse import parse_model
from engine_check.claims import (
    CONFIRMED,
    REFUSED,
    UNCHECKED,
    Answer,
    Verdict,
    exit_status,
    judge_context,
    judge_embeddings,
    judge_tools,
)
from engine_check.probe import MAX_ANSWER, Target, check, post


def chat(message: dict[str, Any]) -> Answer:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", **message}}]}
    return Answer(200, body, json.dumps(body))


def test_a_tool_call_to_the_tool_given_confirms_tools() -> None:
    call = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    verdict = judge_tools(chat({"content": None, "tool_calls": [call]}))
    assert verdict.outcome == CONFIRMED
    assert verdict.detail == """called get_weather with '{"city":"Paris"}' as asked"""


def test_prose_a_wrong_tool_or_an_error_refuses_tools_quoting_the_engine() -> None:
    prose = judge_tools(chat({"content": "xq zz the"}))
    assert prose.outcome == REFUSED
    assert prose.detail == (
        "answered without tool_calls to a prompt that needs get_weather: content 'xq zz the'"
    )
    other = {"type": "function", "function": {"name": "rm_rf", "arguments": "{}"}}
    assert judge_tools(chat({"tool_calls": [other]})).detail == (
        'called ["rm_rf"], not the get_weather it was given'
    )
    # A grammar makes random weights call the right tool with nonsense: not confirmed.
    nonsense = {
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"xq"}'},
    }
    assert judge_tools(chat({"tool_calls": [nonsense]})).detail == (
        """called get_weather with '{"city":"xq"}', not with the city the prompt names (Paris)"""
    )
    broken = {"type": "function", "function": {"name": "get_weather", "arguments": "{"}}
    assert judge_tools(chat({"tool_calls": [broken]})).outcome == REFUSED
    error = '{"error":{"code":500,"message":"tools param requires --jinja flag"}}'
    refused = judge_tools(Answer(500, json.loads(error), error))
    assert refused.outcome == REFUSED
    assert refused.detail == f"no chat completion; the engine answered HTTP 500: {error}"
    gone = judge_tools(Answer(None, None, "http://10.0.0.7:8000/v1/chat/completions: refused"))
    assert gone.detail.endswith("no answer: http://10.0.0.7:8000/v1/chat/completions: refused")


def test_embeddings_want_a_vector_of_numbers() -> None:
    good = {"data": [{"embedding": [0.1, -2, 3e-5]}]}
    assert judge_embeddings(Answer(200, good, "")).detail == "/v1/embeddings answered 3 numbers"
    bodies: tuple[dict[str, list[Any]], ...] = (
        {"data": []},
        {"data": [{"embedding": [True]}]},
        {"data": [{"embedding": []}]},
    )
    for body in bodies:
        assert judge_embeddings(Answer(200, body, json.dumps(body))).outcome == REFUSED
    missing = judge_embeddings(Answer(404, None, "Not Found"))
    assert missing.detail == "/v1/embeddings: the engine answered HTTP 404: Not Found"


def test_context_names_the_arithmetic() -> None:
    detail = "--ctx-size 2048 / --parallel 4 = 512"
    short = judge_context(1024, 512, detail, "/props of the engine")
    assert (short.outcome, short.detail) == (
        REFUSED,
        "--ctx-size 2048 / --parallel 4 = 512 < context_length 1024 (/props of the engine): "
        "a request may use 512 tokens",
    )
    assert judge_context(512, 512, detail, "x").outcome == CONFIRMED
    assert judge_context(512, None, "", "x").outcome == UNCHECKED


def test_only_a_refusal_fails_the_check() -> None:
    assert exit_status([]) == 0
    assert exit_status([Verdict("vision", UNCHECKED, "")]) == 0
    assert exit_status([Verdict("tools", CONFIRMED, ""), Verdict("x", REFUSED, "")]) == 1


def test_whatever_an_engine_says_reaches_a_terminal_escaped() -> None:
    hostile = chat({"content": "\x1b]0;owned\x07\x1b[2J\nfake line\r"})
    line = judge_tools(hostile).line()
    assert "\x1b" not in line and "\n" not in line and "\r" not in line and "\x07" not in line


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["choices", "message", "tool_calls", "function", "name", "data", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=15,
)


@given(status=st.one_of(st.none(), st.integers(100, 599)), body=JSON)
def test_any_answer_gets_a_verdict_and_a_printable_line(status: int | None, body: Any) -> None:
    answer = Answer(status, body, json.dumps(body))
    for verdict in (judge_tools(answer), judge_embeddings(answer)):
        assert verdict.outcome in (CONFIRMED, REFUSED)
        assert verdict.line().isprintable()


# -- the requests, against a real HTTP server -------------------------------------------


@pytest.fixture
def engine() -> Iterator[tuple[str, dict[str, bytes]]]:
    answers: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = answers.get(self.path, b'{"error": "not found"}')
            self.send_response(200 if self.path in answers else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answers
    finally:
        server.shutdown()


def test_oversized_and_deeply_nested_answers_are_refused_not_parsed(
    engine: tuple[str, dict[str, bytes]],
) -> None:
    url, answers = engine
    target = Target(url, "m", "test")
    answers["/v1/chat/completions"] = b"[" * 100_000 + b"]" * 100_000
    deep = post(target, "/v1/chat/completions", {})
    assert deep.status == 200 and deep.body is None
    assert judge_tools(deep).outcome == REFUSED
    answers["/v1/chat/completions"] = b" " * (MAX_ANSWER + 10)
    big = post(target, "/v1/chat/completions", {})
    assert big.text == f"an answer of more than {MAX_ANSWER} bytes"


def test_a_model_is_checked_for_what_it_claims_and_nothing_else(
    engine: tuple[str, dict[str, bytes]],
) -> None:
    url, answers = engine
    answers["/v1/embeddings"] = json.dumps({"data": [{"embedding": [0.5, 0.25]}]}).encode()
    definition = {
        "name": "m",
        "source": "/m.gguf",
        "context_length": 1024,
        "capabilities": {"embeddings": True, "vision": True},
        "profiles": [{"name": "cpu", "engine": "llamacpp"}],
    }
    model = Catalog.build([parse_model(definition)]).resolve("m")
    assert model is not None
    verdicts = check(
        model,
        Target(url, "m", "test", direct=False),
        engine="llamacpp",
        reported=(512, "--ctx-size 2048 / --parallel 4 = 512"),
    )
    assert [(v.claim, v.outcome) for v in verdicts] == [
        ("embeddings", CONFIRMED),
        ("vision", UNCHECKED),
        ("context_length", REFUSED),
    ]
