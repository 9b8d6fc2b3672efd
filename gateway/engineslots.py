"""What a replica's engine says of its slots: llama.cpp's ``GET /props`` ``total_slots``.

A replica's slots (the requests its engine answers at once, which the gateway's queue
counts against) come from, in this order (``gateway.table.build``):

1. the profile's ``slots``: the operator's word, reviewed in the catalog. It may hold
   the gateway below what the engine runs on purpose (slots shared with clients that
   do not come through the gateway, or fewer requests at once for a better TTFT), and
   it is the only source for an engine that says nothing;
2. what the engine says on ``/props`` (``total_slots``), for an engine that says it
   (llama.cpp's server): what it really runs, including when no ``--parallel`` was
   given and llama.cpp chose a count itself;
3. the engine's own flag in the profile's args (``--parallel``, ``--max-num-seqs``,
   ``--slots``): what it was told to run; in force until ``/props`` answers, and
   when it never does;
4. else not known: the replica is never full, and the gateway never holds a request
   back for it.

The edge: one ``GET /props`` per replica (its key and endpoint) when it first appears
ready in a table with a profile that sets no ``slots``, with a short timeout and a
bounded read; a failure is tried again a few times (``RETRIES_S``), then the args stay
in force (``gateway.engine_slots_unknown``, once). What it learns goes into the next
table (``State.engine_slots``; the follower builds with it). Nothing here is on the
request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import structlog

from gateway.bodies import read_at_most
from gateway.state import State
from gateway.table import MAX_SLOTS

log = structlog.get_logger("gateway")

# /props carries the chat template: tens of KB. More than this is not an answer.
MAX_PROPS_BYTES = 1 << 20
TIMEOUT_S = 5.0
# The pauses before a second, third and fourth attempt; then the args stay in force.
RETRIES_S = (1.0, 5.0, 30.0)

Where = tuple[str, str]  # (replica key, endpoint)


def total_slots(body: Any) -> int:
    """A ``/props`` answer's ``total_slots``; 0 when it says none (absent, not a whole
    number, or outside 1..``MAX_SLOTS``: an engine that says so has no limit to count)."""
    if not isinstance(body, dict):
        return 0
    value = body.get("total_slots")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_SLOTS:
        return 0
    return value


class EngineSlots:
    """Asks the engines the table names (``Table.ask_props``) and installs what they say
    (``reinstall``: the follower builds the table again with ``State.engine_slots``)."""

    def __init__(
        self, state: State, reinstall: Callable[[], None], timeout_s: float = TIMEOUT_S
    ) -> None:
        self.state = state
        self.reinstall = reinstall
        self.timeout_s = timeout_s
        self.session: aiohttp.ClientSession | None = None
        self._failures: dict[Where, int] = {}
        self._next: dict[Where, float] = {}

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def run(self) -> None:
        while True:
            changed = self.state.changed  # replaced at each install: taken before checking
            await self.check()
            now = time.monotonic()
            pending = [t for t in self._next.values() if t != math.inf]
            wait = max(min(pending) - now, 0.05) if pending else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait)

    async def check(self) -> None:
        """Ask every replica due, and install a table with what they said."""
        wanted = self.state.table.ask_props
        known = self.state.engine_slots
        for where in [w for w in known if w not in wanted]:
            del known[where]
        for where in [w for w in self._next if w not in wanted]:
            self._next.pop(where, None)
            self._failures.pop(where, None)
        now = time.monotonic()
        due = sorted(w for w in wanted if w not in known and self._next.get(w, 0.0) <= now)
        if not due:
            return
        answers = await asyncio.gather(*(self.ask(where) for where in due))
        learned = False
        for where, (count, error) in zip(due, answers, strict=True):
            if count:
                known[where] = count
                self._next.pop(where, None)
                self._failures.pop(where, None)
                learned = True
                log.info(
                    "gateway.engine_slots", replica=where[0], total_slots=count, source="/props"
                )
                continue
            tries = self._failures[where] = self._failures.get(where, 0) + 1
            if error and tries <= len(RETRIES_S):
                self._next[where] = time.monotonic() + RETRIES_S[tries - 1]
                continue
            self._next[where] = math.inf
            log.warning(
                "gateway.engine_slots_unknown",
                replica=where[0],
                reason=error or "its /props says no total_slots",
                using="the profile's args (--parallel), else no limit",
            )
        if learned:
            self.reinstall()

    async def ask(self, where: Where) -> tuple[int, str]:
        """The replica's ``total_slots`` (0 if none), and what went wrong ("" if nothing
        did, including an answer that says no slots: not worth asking again)."""
        if self.session is None:
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        keys: list[dict[str, str]] = [{}]
        model = where[0].rpartition("/")[0]
        for r in self.state.table.ready.get(model, ()):
            # The replica at that endpoint: a newer table may hold the key elsewhere,
            # under another profile (another key), since the pair was taken. The key
            # before a rotation is asked with when the engine refuses the new one.
            if r.key == where[0] and r.endpoint == where[1] and r.auth:
                keys = [_header(r.auth)] + ([_header(r.auth_previous)] if r.auth_previous else [])
        try:
            for headers in keys:
                async with self.session.get(where[1] + "/props", headers=headers) as resp:
                    raw = await read_at_most(resp.content, MAX_PROPS_BYTES)
                    status = resp.status
                if status != 401:
                    break
            if status != 200:
                return 0, f"GET /props answered {status}"
            if len(raw) > MAX_PROPS_BYTES:
                return 0, f"GET /props answered more than {MAX_PROPS_BYTES} bytes"
            return total_slots(json.loads(raw)), ""
        except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as exc:
            return 0, f"GET /props: {type(exc).__name__}: {exc}"[:300]


def _header(line: bytes) -> dict[str, str]:
    """The header of an engine key's line (``authorization: Bearer KEY\r\n``)."""
    return {"authorization": line.decode("ascii").split(": ", 1)[1].strip()}
