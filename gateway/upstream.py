"""The engines' side: the pooled connections to every replica, and token counting.

The connections are ``gateway.enginepool``'s (a keep-alive HTTP/1.1 client on asyncio
protocols with httptools' parser). It replaced aiohttp's client, which had been chosen
first by ``python -m bench.gateway.choice`` (httpx added about 1.2 ms a request and fell
over at 16 clients; a hand-written client was faster but needed chunked decoding and
streaming of its own). httptools gives both, and a profile under load put a quarter of
the gateway's CPU in aiohttp's request path: see ``enginepool`` for the figures' source.

A failure before the first byte of an answer (``Unreachable``: refused, reset, timed
out, or a 5xx) may be retried elsewhere; the caller decides.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

from gateway.enginepool import Answer, BrokenAnswer, EnginePool, Unreachable
from gateway.stages import admission

__all__ = ["Answer", "BrokenAnswer", "Unreachable", "Upstream"]

TOKENIZE_CACHE = 4096
# The longest wait for an engine's count: past it, the documented estimate.
TOKENIZE_TIMEOUT_S = 5.0
# The most of a /tokenize answer read (its token ids: about 1 MB for 128k tokens); past
# it, the estimate. Unbounded, a broken engine's endless answer filled memory for 5 s.
TOKENIZE_MAX_BYTES = 16 * 1024 * 1024
# A prompt or a /tokenize answer longer than this is hashed, encoded or decoded in a
# worker thread (as a request's body is: gateway.server).
INLINE_BYTES = 256 * 1024
# The most of a 5xx's body read (and dropped) to keep its connection; past it, closed.
DRAIN_5XX = 64 * 1024


class Upstream:
    def __init__(self, connect_timeout_s: float, read_timeout_s: float, cache_s: float) -> None:
        self.pool = EnginePool(connect_timeout_s, read_timeout_s)
        self.cache_s = cache_s
        # (model, digest of the text) -> (tokens, expires)
        self._counts: dict[tuple[str, bytes], tuple[int, float]] = {}
        # Endpoints that answered /tokenize with 404: counted by the estimate.
        self._no_tokenizer: set[str] = set()

    async def close(self) -> None:
        await self.pool.close()

    async def open(
        self, url: str, body: bytes, auth: bytes = b"", auth_note: str = "", previous: bytes = b""
    ) -> Answer:
        """POST ``body``; the answer with its status and headers read, not its body.
        ``auth``: the engine's key as a header line (``Replica.auth``), or empty.

        ``Unreachable`` for a refused, reset or timed-out connection, a 5xx (whose
        body is read and dropped), or a 401: the engine refused the gateway, not the
        client (whose token the gateway took), so the client is never told its key is
        wrong; the reason says which secret (``auth_note``). An engine that refuses
        ``auth`` is asked once more with ``previous`` (the key before a rotation of the
        gateway's copy, ``Replica.auth_previous``), when there is one.
        """
        answer = await self.pool.post(url, body, auth)
        if answer.status == 401 and previous:
            await _drop(answer)
            answer = await self.pool.post(url, body, previous)
        if answer.status >= 500 or answer.status == 401:
            await _drop(answer)
            if answer.status == 401:
                raise Unreachable(
                    "answered 401: the engine refused the gateway's request: "
                    + (
                        auth_note
                        or "its profile gives the engine no key (env VLLM_API_KEY: "
                        "{secret: NAME}) for the gateway to send"
                    ),
                    answer.status,
                )
            raise Unreachable(f"answered {answer.status}", answer.status)
        return answer

    async def count(
        self, endpoint: str, model: str, req: admission.Request, auth: bytes = b""
    ) -> tuple[int, str]:
        """The prompt's tokens by the engine's ``/tokenize``, cached; else the estimate.

        Returns the count and how it was made (for the refusal's words).
        """
        if endpoint in self._no_tokenizer:
            return admission.estimate(req), "an estimate: the engine has no /tokenize"
        # A long prompt's digest and request, and a long answer's decoding, in a worker
        # thread: vLLM answers with every token's id (about 14 MB for an 8 MiB prompt; a
        # hostile engine up to TOKENIZE_MAX_BYTES), and decoding it on the event loop
        # took 0.2 to 0.4 s of its CPU a request.
        large = len(req.text) > INLINE_BYTES
        digest = await asyncio.to_thread(_digest, req.text) if large else _digest(req.text)
        key = (model, digest)
        now = time.monotonic()
        hit = self._counts.get(key)
        if hit is not None and hit[1] > now:
            return hit[0], "by the engine's tokenizer"
        asked = {"content": req.text, "prompt": req.text, "model": model}
        payload = await asyncio.to_thread(_encode, asked) if large else _encode(asked)
        data: Any = None
        try:
            async with asyncio.timeout(TOKENIZE_TIMEOUT_S):
                answer = await self.pool.post(endpoint + "/tokenize", payload, auth)
                try:
                    raw = await answer.read(TOKENIZE_MAX_BYTES)
                finally:
                    answer.release()
            if answer.status == 404:
                self._no_tokenizer.add(endpoint)
                return admission.estimate(req), "an estimate: the engine has no /tokenize"
            if answer.status == 200:
                data = (
                    await asyncio.to_thread(json.loads, raw)
                    if len(raw) > INLINE_BYTES
                    else json.loads(raw)
                )
        except (Unreachable, BrokenAnswer, TimeoutError, ValueError, RecursionError):
            data = None
        tokens = _tokens(data)
        if tokens is None:
            return admission.estimate(req), "an estimate: the engine's /tokenize failed"
        # vLLM counts the chat template with ``messages``; with plain text it does not:
        # add the template's share as the bound does.
        if req.kind == admission.CHAT:
            tokens += (
                admission.TEMPLATE_TOKENS + admission.TEMPLATE_TOKENS_PER_MESSAGE * req.messages
            )
        tokens += req.token_ids
        if len(self._counts) >= TOKENIZE_CACHE:
            self._counts.clear()
        self._counts[key] = (tokens, now + self.cache_s)
        return tokens, "by the engine's tokenizer"


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "replace")).digest()


def _encode(value: dict[str, str]) -> bytes:
    return json.dumps(value).encode()


def _tokens(data: Any) -> int | None:
    """The count of a /tokenize answer: ``count``, else the ids' number; None for none.
    A ``count`` is the engine's word: one past ``admission.MAX_INT`` (an engine's int32;
    JSON gives Python integers of up to 4,300 digits) is no count, as one not a whole
    number is: its digits went into the refusal's message (a 4 KB
    ``context_length_exceeded``), the reservation and the log line."""
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if type(count) is int and 0 <= count <= admission.MAX_INT:
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


async def _drop(answer: Answer) -> None:
    """Read a refused answer's body and drop it: a short one to keep the connection, no
    more of a long one (a broken engine's endless error would fill memory and delay the
    retry). Released however this ends, a cancelled caller included: it was left open,
    and one paused past the high-water mark was never closed."""
    drained = 0
    try:
        async for chunk in answer.chunks():
            drained += len(chunk)
            if drained > DRAIN_5XX:
                break
    except BrokenAnswer:
        pass
    finally:
        answer.release()
