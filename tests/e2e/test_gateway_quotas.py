"""A client token's limits end to end: a real `llmgw serve`, a real sim agent, a real
`llmgw gateway`, tokens issued and limited with the real `llmgw token`, and the official
OpenAI client.

A throttled client's requests are refused 429 naming the limit, with ``Retry-After`` and
OpenAI's ``x-ratelimit-*`` headers (present on every answer, going down as the client
uses its minute); the SDK's own retries wait as told and succeed. A stream's tokens
settle to the engine's usage: the usage event the gateway asks for is cut out when the
client did not ask for it and kept when it did, and the counts land in
``llmgw_gateway_tokens_total``. Limits changed with `llmgw token limits` take effect on
the running gateway.

Waits are on conditions, never on fixed sleeps; the one timing assertion is a lower
bound (the SDK waited at least what Retry-After said), which load cannot break.
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.agents import eventually
from tests.e2e.cli import Cli
from tests.e2e.gateways import gateway_cluster
from tests.e2e.test_gateway import ROUNDS, chat

pytestmark = pytest.mark.slow

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "How much may I use?"}]
# tokens a minute: 10 a second come back; a request below reserves its prompt (about
# 25 tokens by the estimate) and its max_tokens.
TPM = 600
MAX_TOKENS = 100


def tokens_total(text: str, client: str, kind: str) -> float:
    found = re.search(
        rf'llmgw_gateway_tokens_total{{client="{client}",kind="{kind}",model="chat"}} (\S+)',
        text,
    )
    return float(found.group(1)) if found else 0.0


def test_a_limited_client_is_throttled_retries_as_told_and_its_tokens_settle_to_usage(
    tmp_path: Path, sqlite_url: str
) -> None:
    with gateway_cluster(tmp_path, sqlite_url, ["n1"], [chat(1, fallbacks=())], ROUNDS) as (
        c,
        gw,
        _,
    ):
        c.agent("n1")
        eventually(lambda: gw.ready("chat", 1), "chat ready at the gateway")
        cli = Cli(tmp_path, sqlite_url)
        issued = cli.json(
            "token", "new", "app-1", "--role", "client", "--rpm", "120", "--tpm", str(TPM)
        )
        token = issued["token"]
        client = gw.openai(token)

        def taken() -> bool:
            try:
                client.models.list()
            except openai.AuthenticationError:
                return False
            return True

        eventually(taken, "the new token taken by the gateway")

        # Every answer carries OpenAI's headers, and they go down as the minute is used.
        seen: list[tuple[int, int]] = []
        refused: openai.RateLimitError | None = None
        refused_at = 0.0
        for _ in range(20):
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="chat", messages=HI, max_tokens=MAX_TOKENS
                )
            except openai.RateLimitError as exc:
                refused, refused_at = exc, time.monotonic()
                break
            h = raw.headers
            assert h["x-ratelimit-limit-requests"] == "120"
            assert h["x-ratelimit-limit-tokens"] == str(TPM)
            assert h["x-ratelimit-reset-requests"] and h["x-ratelimit-reset-tokens"]
            seen.append(
                (int(h["x-ratelimit-remaining-requests"]), int(h["x-ratelimit-remaining-tokens"]))
            )
        assert refused is not None, f"never throttled: {seen}"
        # (Requests come back at 2 a second, faster than these answers take: only the
        # tokens' figure must go down here.)
        assert len(seen) >= 2 and all(r <= 120 for r, _ in seen)
        assert all(b[1] < a[1] for a, b in itertools.pairwise(seen))
        # The refusal: 429 in OpenAI's shape naming the limit, when to retry, and the
        # headers again.
        assert refused.status_code == 429 and isinstance(refused.body, dict)
        assert refused.body["code"] == "rate_limit_tokens"
        assert f"tpm of {TPM} tokens a minute" in refused.message
        retry_after = int(refused.response.headers["retry-after"])
        assert 1 <= retry_after <= 60
        assert refused.response.headers["x-ratelimit-limit-tokens"] == str(TPM)

        # The SDK's own retries honour Retry-After and succeed.
        patient = openai.OpenAI(base_url=gw.url + "/v1", api_key=token, timeout=60, max_retries=5)
        answer = patient.chat.completions.create(model="chat", messages=HI, max_tokens=MAX_TOKENS)
        assert answer.choices[0].message.content
        # Served within what the refusal said, give or take the machine: Retry-After is
        # the latest the request fits when nothing else is used, not a ban. It may fit
        # sooner: the tokens an answer reserved beyond its usage come back when it
        # settles, just after its last byte, and a refusal made before that counts them
        # as spent (CI: served 2.1 s after a Retry-After of 4). Counted from the refusal.
        assert time.monotonic() - refused_at <= retry_after + 30

        def statuses() -> list[int]:
            return [x["status"] for x in gw.logs("gateway.request") if x.get("client") == "app-1"]

        # (The log line is written once the answer is sent: waited for.)
        eventually(lambda: statuses()[-2:] == [429, 200], "the retried request's log line")

        # A stream: its tokens settle to the engine's own usage. Not asked for, the usage
        # event the gateway asked for is cut out; asked for, it is kept.
        before = gw.get("/metrics").text
        chunks = list(
            patient.chat.completions.create(model="chat", messages=HI, max_tokens=5, stream=True)
        )
        assert chunks and all(ch.usage is None for ch in chunks)
        assert all(ch.choices for ch in chunks)
        line = eventually(lambda: _stream_line(gw.logs("gateway.request")), "the stream's line")
        assert line["completion_tokens"] == 5 and line["cached_tokens"] is not None
        asked = list(
            patient.chat.completions.create(
                model="chat",
                messages=HI,
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage = asked[-1].usage
        assert usage is not None and usage.completion_tokens == 5 and asked[-1].choices == []
        assert sum(1 for ch in asked if ch.usage is not None) == 1

        # (Counted once the answer is sent: waited for.)
        def counted() -> str | None:
            text = gw.get("/metrics").text
            grown = tokens_total(text, "app-1", "completion") - tokens_total(
                before, "app-1", "completion"
            )
            return text if grown >= 10 else None

        after = eventually(counted, "both streams counted")
        assert (
            tokens_total(after, "app-1", "completion") - tokens_total(before, "app-1", "completion")
            == 5 + usage.completion_tokens
        )
        assert (
            tokens_total(after, "app-1", "prompt") - tokens_total(before, "app-1", "prompt")
            == line["prompt_tokens"] + usage.prompt_tokens
        )
        details = usage.prompt_tokens_details
        assert details is not None and details.cached_tokens is not None
        assert tokens_total(after, "app-1", "cached") >= details.cached_tokens

        # Limits changed with `token limits` apply on the running gateway.
        done = cli("token", "limits", "app-1", "--rpm", "1", "--tpm", "none", "--actor", "ops")
        assert done.returncode == 0, done.stderr

        def lowered() -> bool:
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="chat", messages=HI, max_tokens=2
                )
            except openai.RateLimitError as exc:
                return exc.response.headers.get("x-ratelimit-limit-requests") == "1"
            return raw.headers.get("x-ratelimit-limit-requests") == "1"

        eventually(lowered, "the new rpm in force at the gateway")
        with pytest.raises(openai.RateLimitError) as caught:
            for _ in range(3):
                client.chat.completions.create(model="chat", messages=HI, max_tokens=2)
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["code"] == "rate_limit_requests"
        assert "x-ratelimit-limit-tokens" not in caught.value.response.headers

        # An unlimited client's answers carry no such headers.
        plain = cli.json("token", "new", "app-2", "--role", "client")["token"]
        other = gw.openai(plain)
        eventually(lambda: _takes(other), "the unlimited token taken")
        raw = other.chat.completions.with_raw_response.create(
            model="chat", messages=HI, max_tokens=2
        )
        assert "x-ratelimit-limit-requests" not in raw.headers


def _stream_line(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    # (The answered one: the SDK retries a 429 on its own, which has a line too; with the
    # allowance shared, a request just after one admitted on credit may wait for the
    # gateway's next chunk.)
    streams = [
        x
        for x in lines
        if x.get("stream") and x.get("client") == "app-1" and x.get("status") == 200
    ]
    return streams[-1] if streams else None


def _takes(client: openai.OpenAI) -> bool:
    try:
        client.models.list()
    except openai.AuthenticationError:
        return False
    return True
