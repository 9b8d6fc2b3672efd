"""The most a request's token counts are charged (gateway.stages.plausible), branch by
branch: the prompt's bound by the body's bytes or the window, the completion's by
max_tokens, max_output or the window, the choices asked, embeddings."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.stages import admission, plausible
from gateway.stages.plausible import MAX_TOKENS, PROMPT_SLACK, Most, held, most, surely
from gateway.table import Replica, build
from tests.unit.gateway.test_admission_routing import model


def bound(
    body: dict[str, Any],
    kind: str = admission.CHAT,
    context: int | None = None,
    **fields: Any,
) -> Most:
    raw = json.dumps(body).encode()
    req = admission.parse_request(body, kind, raw)
    m = build([model("m", **fields)], [], 1).models["m"]
    replica = Replica("m/0", "m", "http://h:0", 1.0, "sim", 0, context=context)
    return most(req, body, len(raw), m, replica)


def chat(content: Any = "hello", **more: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **more}


def test_a_text_prompt_is_bounded_by_its_bytes_and_the_window() -> None:
    body = chat("x" * 10_000, max_tokens=7)
    raw = len(json.dumps(body).encode())
    template = admission.TEMPLATE_TOKENS + admission.TEMPLATE_TOKENS_PER_MESSAGE
    assert bound(body) == Most(raw + template + PROMPT_SLACK, 7)
    assert bound(body, context_length=4096) == Most(4096, 7)
    # The larger of the catalog's window and the replica's: the one that served.
    assert bound(body, context=8192, context_length=4096) == Most(8192, 7)
    # The glance (``surely``) says within only within both bounds.
    req = admission.parse_request(body, admission.CHAT)
    m = build([model("m", context_length=4096)], [], 1).models["m"]
    r = Replica("m/0", "m", "http://h:0", 1.0, "sim", 0)
    assert surely(req, raw, m, r, prompt=4096, completion=7)
    assert not surely(req, raw, m, r, prompt=4097, completion=7)
    assert not surely(req, raw, m, r, prompt=10, completion=8)
    wide = build([model("m")], [], 1).models["m"]
    assert surely(req, raw, wide, r, prompt=raw, completion=7)
    assert not surely(req, raw, wide, r, prompt=raw + 1, completion=7)


def test_a_prompt_with_media_is_bounded_by_the_window_only() -> None:
    parts = [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
        {"type": "video_url", "video_url": {"url": "http://x/y.mp4"}},
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
    ]
    for part in parts:
        body = chat([{"type": "text", "text": "what is it"}, part], max_tokens=5)
        assert bound(body, context_length=32_768) == Most(32_768, 5)
        assert bound(body) == Most(MAX_TOKENS, 5)


def test_the_completion_is_bounded_by_max_tokens_else_max_output_else_the_window() -> None:
    assert bound(chat(max_completion_tokens=9, max_tokens=99)).completion == 9
    assert bound(chat(), max_output=512, context_length=4096).completion == 512
    assert bound(chat(), context_length=4096).completion == 4096
    assert bound(chat()).completion == MAX_TOKENS
    # Each choice is counted: n (and best_of) multiply; a nonsense n does not.
    assert bound(chat(max_tokens=10, n=3)).completion == 30
    assert bound({"model": "m", "prompt": "hi", "max_tokens": 10, "n": 2, "best_of": 4},
                 admission.COMPLETIONS).completion == 40  # fmt: skip
    for n in ("3", 0, -2, True, 2**40, 2.5):
        assert bound(chat(max_tokens=10, n=n)).completion == 10


def test_an_embeddings_request_is_charged_no_completion() -> None:
    got = bound(
        {"model": "m", "input": "hi"}, admission.EMBEDDINGS, capabilities={"embeddings": True}
    )
    assert got.completion == 0 and got.prompt > 0


def test_held_counts_keep_cached_within_the_prompt() -> None:
    assert held(10**12, 10**12, 10**12, Most(100, 50)) == (100, 100, 50)
    assert held(10, 4, 3, Most(100, 50)) == (10, 4, 3)
    assert plausible.MAX_TOKENS == admission.MAX_INT


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(max_size=40),
    max_tokens=st.one_of(st.none(), st.integers(1, 300)),
    n=st.one_of(st.none(), st.integers(1, 4)),
    kind=st.sampled_from([admission.CHAT, admission.COMPLETIONS, admission.EMBEDDINGS]),
    image=st.booleans(),
    context_length=st.sampled_from([0, 16, 4096]),
    context=st.one_of(st.none(), st.sampled_from([8, 8192])),
    prompt=st.one_of(st.integers(0, 300), st.integers(0, 3_000)),
    completion=st.integers(0, 1_000),
)
def test_the_glance_says_within_only_when_the_counts_are_within_the_bounds(
    *,
    text: str,
    max_tokens: int | None,
    n: int | None,
    kind: str,
    image: bool,
    context_length: int,
    context: int | None,
    prompt: int,
    completion: int,
) -> None:
    body: dict[str, Any] = {"model": "m"}
    if kind == admission.CHAT:
        parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if image:
            parts.append({"type": "image_url", "image_url": {"url": "http://x/y.png"}})
        body["messages"] = [{"role": "user", "content": parts}]
    else:
        body["prompt" if kind == admission.COMPLETIONS else "input"] = text or "x"
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if n is not None:
        body["n"] = n
    raw = json.dumps(body).encode()
    req = admission.parse_request(body, kind, raw)
    fields = {"capabilities": {"embeddings": True, "vision": True}}
    m = build([model("m", context_length=context_length, **fields)], [], 1).models["m"]
    replica = Replica("m/0", "m", "http://h:0", 1.0, "sim", 0, context=context)
    bounds = most(req, body, len(raw), m, replica)
    if surely(req, len(raw), m, replica, prompt=prompt, completion=completion):
        assert prompt <= bounds.prompt and completion <= bounds.completion
