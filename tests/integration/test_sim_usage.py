"""The sim engine's usage, read by the official OpenAI client from a real sim process:
the last chunk of a stream asked with ``include_usage`` and the cached prompt tokens, as a
gateway counting tokens and a prefix router checking its guesses read them from vLLM."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from tests.integration.sim_process import sim_engine


@pytest.fixture(scope="module")
def engine() -> Iterator[OpenAI]:
    with sim_engine("--block-size", "4") as port:
        yield OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)


SYSTEM = "you are a careful assistant who answers about clusters and their replicas " * 2


def test_a_stream_with_include_usage_gives_the_sdk_its_usage(engine: OpenAI) -> None:
    stream = engine.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "count my tokens please"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (4, 5)
    assert all(c.usage is None for c in chunks[:-1])


def test_a_resent_history_is_reported_as_cached_prompt_tokens(engine: OpenAI) -> None:
    def ask(history: str) -> tuple[int, int]:
        answer = engine.chat.completions.create(
            model="m", messages=[{"role": "user", "content": history}], max_tokens=2
        )
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        cached = answer.usage.prompt_tokens_details.cached_tokens
        assert cached is not None
        return answer.usage.prompt_tokens, cached

    first_total, first_cached = ask(SYSTEM + "first question")
    assert first_cached == 0
    total, cached = ask(SYSTEM + "first question and then a second one")
    # Every whole block of four words the first prompt held was reused.
    assert cached == first_total // 4 * 4 and total > first_total
