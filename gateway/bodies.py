"""Reading an answer's body whole, to a bound.

``StreamReader.read(n)`` returns what has come so far (at most ``n`` bytes), not ``n``
bytes or the whole body: an answer that comes in parts (a large one, a slow network, an
engine that writes its lines as it makes them) was read as its first part, and a
``/metrics`` cut after ``num_requests_running`` said nothing of those waiting.
"""

from __future__ import annotations

import aiohttp


async def read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The whole body when it is at most ``limit`` bytes, else its first ``limit + 1``
    (the caller refuses it); the session's timeout bounds how long it comes."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        part = await content.read(limit + 1 - size)
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)
