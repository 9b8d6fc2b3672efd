"""The sim engine's OpenAI-compatible routes, in process (the e2e tests use the real client)."""

from __future__ import annotations

import json

from starlette.testclient import TestClient

from agent.sim import create_app, synthetic

client = TestClient(create_app("sim-chat"))
ASK = {"model": "sim-chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def test_the_same_prompt_gets_the_same_synthetic_answer() -> None:
    assert synthetic("hello", 4) == synthetic("hello", 4)
    assert synthetic("hello", 8) != synthetic("goodbye", 8)


def test_a_chat_completion_answers_in_the_openai_shape() -> None:
    body = client.post("/v1/chat/completions", json=ASK).json()
    assert body["object"] == "chat.completion" and body["model"] == "sim-chat"
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": " ".join(synthetic("hello", 4))}
    assert body["usage"] == {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}


def test_a_streamed_completion_is_server_sent_chunks_ending_with_done() -> None:
    with client.stream("POST", "/v1/chat/completions", json={**ASK, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [x[len("data: ") :] for x in r.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == " ".join(synthetic("hello", 4))
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_another_model_name_is_refused_in_the_openai_error_shape() -> None:
    r = client.post("/v1/chat/completions", json={**ASK, "model": "gpt-4"})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "this engine serves 'sim-chat', not 'gpt-4'"


def test_a_malformed_request_is_refused() -> None:
    assert client.post("/v1/chat/completions", content=b"{").status_code == 400
    assert client.post("/v1/chat/completions", json={**ASK, "max_tokens": 0}).status_code == 400
    too_long = b'{"messages": "' + b"x" * (1 << 20) + b'"}'
    assert client.post("/v1/chat/completions", content=too_long).status_code == 413


def test_health_and_the_model_list_answer() -> None:
    assert client.get("/health").status_code == 200
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["sim-chat"]


def test_an_unknown_path_or_method_answers_json_as_vllm_does() -> None:
    """vLLM's server (FastAPI) answers these with a JSON ``detail``; the sim too, though
    it is built on Starlette alone."""
    unknown = client.get("/v1/nothing")
    assert (unknown.status_code, unknown.json()) == (404, {"detail": "Not Found"})
    wrong = client.get("/v1/chat/completions")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
    assert "POST" in wrong.headers["allow"]
