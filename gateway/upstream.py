"""The engines' side: one pooled aiohttp client for every replica, and token counting.

aiohttp's client was measured against httpx and a hand-written pooled client on asyncio
streams (``python -m bench.gateway_choice``): httpx added about 1.2 ms per request at
concurrency 1 and fell over at 16 (30 ms p50); the hand-written client was about 0.1 ms
faster than aiohttp's, but would need its own chunked decoding, streaming and error
handling to be correct. aiohttp's keeps connections alive per host, streams, and tells a
refused or reset connection from a slow one, which is what retries are decided by.

A failure before the first byte of an answer (``Unreachable``: refused, reset, timed
out, or a 5xx) may be retried elsewhere; the caller decides.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Any

import aiohttp

from gateway import admission

# Headers of an engine's answer that are the connection's, not the answer's.
HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "date",
        "server",
        "upgrade",
        "proxy-connection",
    }
)
TOKENIZE_CACHE = 4096


class Unreachable(Exception):
    """The replica did not answer usefully before its first byte: retry elsewhere."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class Upstream:
    def __init__(self, connect_timeout_s: float, read_timeout_s: float, cache_s: float) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=connect_timeout_s,
                sock_connect=connect_timeout_s,
                sock_read=read_timeout_s,
            ),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Content-Type"),
        )
        self.cache_s = cache_s
        # (model, digest of the text) -> (tokens, expires)
        self._counts: dict[tuple[str, bytes], tuple[int, float]] = {}
        # Endpoints that answered /tokenize with 404: counted by the estimate.
        self._no_tokenizer: set[str] = set()

    async def close(self) -> None:
        await self.session.close()

    async def open(self, url: str, body: bytes) -> aiohttp.ClientResponse:
        """POST ``body``; the response with its status and headers read, not its body.

        ``Unreachable`` for a refused, reset or timed-out connection, or a 5xx (whose
        body is read and dropped).
        """
        try:
            resp = await self.session.post(
                url, data=body, headers={"Content-Type": "application/json"}
            )
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise Unreachable(_reason(exc)) from None
        except TimeoutError:
            raise Unreachable("timed out") from None
        if resp.status >= 500:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await resp.read()
            resp.release()
            raise Unreachable(f"answered {resp.status}", resp.status)
        return resp

    async def count(self, endpoint: str, model: str, req: admission.Request) -> tuple[int, str]:
        """The prompt's tokens by the engine's ``/tokenize``, cached; else the estimate.

        Returns the count and how it was made (for the refusal's words).
        """
        if endpoint in self._no_tokenizer:
            return admission.estimate(req), "an estimate: the engine has no /tokenize"
        key = (model, hashlib.blake2b(req.text.encode("utf-8", "replace")).digest())
        now = time.monotonic()
        hit = self._counts.get(key)
        if hit is not None and hit[1] > now:
            return hit[0], "by the engine's tokenizer"
        try:
            async with self.session.post(
                endpoint + "/tokenize",
                json={"content": req.text, "prompt": req.text, "model": model},
                timeout=aiohttp.ClientTimeout(total=5),
            ) as resp:
                if resp.status == 404:
                    self._no_tokenizer.add(endpoint)
                    return admission.estimate(req), "an estimate: the engine has no /tokenize"
                data: Any = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
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


def _tokens(data: Any) -> int | None:
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"connection refused ({exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "connection closed before an answer"
    return f"{type(exc).__name__}: {exc}"[:200]
