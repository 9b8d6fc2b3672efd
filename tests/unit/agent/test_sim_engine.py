"""The sim engine's OpenAI-compatible routes, in process (the e2e tests use the real client)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from agent.sim import PrefixCache, create_app, synthetic

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
    assert body["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 4,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


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
    assert all("usage" not in c for c in chunks), "usage only when the client asks for it"


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


def _stream(app_client: TestClient, body: dict[str, object]) -> list[dict[str, object]]:
    with app_client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = [x[len("data: ") :] for x in r.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_a_stream_asked_for_usage_ends_with_a_usage_chunk_as_openai_streams_do() -> None:
    """``stream_options.include_usage``: one last chunk with no choices and the usage,
    before ``[DONE]`` (what a gateway needs to count a stream's tokens exactly)."""
    asked = {**ASK, "stream": True, "stream_options": {"include_usage": True}}
    *text_chunks, last = _stream(client, asked)
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    assert last["usage"] == {
        "prompt_tokens": 1,
        "completion_tokens": 4,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert all("usage" not in c for c in text_chunks)
    not_asked = {**ASK, "stream": True, "stream_options": {"include_usage": False}}
    assert all("usage" not in c for c in _stream(client, not_asked))


def test_malformed_stream_options_are_refused() -> None:
    for options in ("yes", ["include_usage"], {"include_usage": "true"}):
        r = client.post(
            "/v1/chat/completions", json={**ASK, "stream": True, "stream_options": options}
        )
        assert r.status_code == 400, options
        assert "stream_options" in r.json()["error"]["message"]


def _cached(app_client: TestClient, content: str) -> int:
    ask = {**ASK, "messages": [{"role": "user", "content": content}]}
    usage = app_client.post("/v1/chat/completions", json=ask).json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert isinstance(cached, int)
    return cached


def _words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def test_a_prompt_sent_again_reports_its_whole_blocks_as_cached() -> None:
    engine = TestClient(create_app("sim-chat", block_size=4))
    assert _cached(engine, _words(10)) == 0  # nothing seen yet
    assert _cached(engine, _words(10)) == 8  # two whole blocks of four; 2 words recomputed
    # A longer prompt with the same start (a conversation resending its history).
    assert _cached(engine, _words(10) + " next turn here") == 8  # its third block is new
    assert _cached(engine, _words(10) + " next turn here") == 12
    # The same words after a different first block: nothing matches (blocks are chained).
    assert _cached(engine, "other " + _words(10)) == 0


def test_the_last_prompt_word_is_always_computed() -> None:
    engine = TestClient(create_app("sim-chat", block_size=4))
    assert _cached(engine, _words(8)) == 0
    assert _cached(engine, _words(8)) == 7  # both blocks held, the last word recomputed


def test_the_cache_holds_at_most_its_capacity_least_recently_used_evicted() -> None:
    engine = TestClient(create_app("sim-chat", prefix_cache_blocks=2, block_size=4))
    _cached(engine, _words(9, "a"))  # two blocks of a: full
    _cached(engine, _words(9, "b"))  # two blocks of b evict both of a
    assert _cached(engine, _words(9, "a")) == 0
    assert _cached(engine, _words(9, "a")) == 8


def test_no_cache_reports_nothing_cached() -> None:
    engine = TestClient(create_app("sim-chat", prefix_cache_blocks=0))
    _cached(engine, _words(100))
    assert _cached(engine, _words(100)) == 0


@given(
    st.lists(st.lists(st.sampled_from("abc"), min_size=0, max_size=40), min_size=1, max_size=8),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=12),
)
def test_cached_words_are_a_prefix_of_whole_blocks_never_the_whole_prompt(
    prompts: list[list[str]], block: int, capacity: int
) -> None:
    cache = PrefixCache(capacity, block)
    seen: list[list[str]] = []
    for words in prompts:
        cached = cache.prefill(words)
        assert 0 <= cached <= max(len(words) - 1, 0)
        assert cached % block == 0 or cached == len(words) - 1
        if cached:
            # Only a prefix some earlier prompt shared can be cached.
            assert any(p[:cached] == words[:cached] for p in seen)
        seen.append(words)
    assert len(cache._blocks) <= max(capacity, 0)
