"""The allowance client: draws this gateway's chunks of its clients' shared limits.

Off the request path. Every ``TICK_S`` (sooner when a request takes a holding below
its low mark: ``Quotas.wake``) it asks ``Quotas.draws`` what to draw and give back, and
makes it one call, ``POST /v1/gateway/allowances`` on the control plane it follows
(the follower's server list: a failed server is left for the next, as the follower
does). The answer's grants are added to the holdings (``Quotas.granted``). A call that
fails leaves the holdings as they are: requests go on spending them, and once they are
spent are refused with 503 ``allowance_not_renewed`` (``Quotas.unrenewed``) until a
call answers again. A control plane without the route (an older release: 404) leaves
the gateway counting each limit on its own, as before, said once in the log.

A graceful stop gives back everything held (``close``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import structlog

from catalog.forms.allowance import MAX_DRAWS, AllowanceError, Draw, parse_granted
from catalog.forms.client_limits import NO_LIMITS
from catalog.forms.servers import ServerList
from gateway.bodies import read_at_most
from gateway.stages.quota import Quotas
from gateway.state import Client

log = structlog.get_logger("gateway")

PATH = "/v1/gateway/allowances"
# How often the holdings are looked at when nothing wakes the client.
TICK_S = 0.2
# A call's bound (an answer later than this is a failed call).
CALL_TIMEOUT_S = 5.0
# The longest answer read.
MAX_ANSWER_BYTES = 8 << 20
# The longest pause between two calls after failures.
MAX_PAUSE_S = 1.0


def _end_sleep(sleeping: asyncio.Future[None]) -> None:
    if not sleeping.done():
        sleeping.set_result(None)


class AllowanceClient:
    def __init__(self, quotas: Quotas, servers: ServerList, session: aiohttp.ClientSession) -> None:
        self.quotas = quotas
        self.servers = servers
        self.session = session
        # Woken (``Quotas.wake``: a holding fell below its low mark) since the last
        # round, and the sleep it ends, if one is under way.
        self._woken = False
        self._sleeping: asyncio.Future[None] | None = None
        quotas.wake = self._wake
        self._last = time.monotonic()
        self._absent = False
        # One call at a time (a credit is trusted from the sending of the call that
        # renewed it: two in flight would mix them up).
        self._calling = asyncio.Lock()

    async def prepare(self, clients: Mapping[str, Client]) -> None:
        """Draw now for limited client tokens new here (the follower awaits it before
        taking them)."""
        if self._absent or not self.quotas.shared:
            return
        limited = [(c.name, c.limits) for c in clients.values() if c.limits is not NO_LIMITS]
        if self.quotas.prepare(limited, time.monotonic()):
            await self.exchange()

    def _wake(self) -> None:
        self._woken = True
        sleeping = self._sleeping
        if sleeping is not None and not sleeping.done():
            sleeping.set_result(None)

    async def _sleep(self, pause: float) -> None:
        """Until ``pause`` has passed or a wake-up. A future and a timer: ``wait_for`` on
        an event made a task, a timer and a ``TimeoutError`` raised and caught five times
        a second, about 170,000 instructions a round under callgrind for a gateway with
        nothing to draw, a third of what an idle gateway ran."""
        if self._woken:
            return
        loop = asyncio.get_running_loop()
        sleeping = self._sleeping = loop.create_future()
        timer = loop.call_later(pause, _end_sleep, sleeping)
        try:
            await sleeping
        finally:
            timer.cancel()
            self._sleeping = None

    async def run(self) -> None:
        pause = TICK_S
        while True:
            await self._sleep(pause)
            self._woken = False
            if self._absent:
                return
            ok = await self.exchange()
            pause = TICK_S if ok else min(pause * 2, MAX_PAUSE_S)

    async def exchange(self) -> bool:
        """One round: plan, call, apply. False when the call failed."""
        async with self._calling:
            now = time.monotonic()
            draws = self.quotas.draws(now, now - self._last)
            self._last = now
            ok = True
            # (At most MAX_DRAWS a call, what the control plane reads: a gateway that
            # learns many limited tokens at once draws for each of them.)
            for start in range(0, len(draws), MAX_DRAWS):
                ok = await self._call(draws[start : start + MAX_DRAWS]) and ok
            return ok

    async def _call(self, draws: list[Draw]) -> bool:
        server = self.servers.current
        status = 0
        body = call_body(draws, self.quotas.gateway)
        try:
            async with self.session.post(
                server + PATH, json=body, timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
            ) as resp:
                raw = await read_at_most(resp.content, MAX_ANSWER_BYTES)
                if resp.status == 404 and not self._absent:
                    self._absent = True
                    self.quotas.shared = False
                    log.warning(
                        "gateway.allowances_absent",
                        server=server,
                        detail="the control plane grants no allowances (an older "
                        "release): each gateway counts every client's whole limit",
                    )
                    return True
                status = resp.status
                if status != 200:
                    raise AllowanceError(
                        f"answered {status}: {raw[:300].decode('utf-8', 'replace')}"
                    )
                answers = parse_granted(json.loads(raw))
        # (RecursionError: an answer nested past the parser's depth; uncaught, it ended
        # the allowance task for good, and every limited client was refused 503
        # allowance_not_renewed once its holdings were spent, until a restart.)
        except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as exc:
            reason = f"{PATH} on {server}: {type(exc).__name__}: {exc}"[:300]
            if self.quotas.renewable:
                log.warning("gateway.allowances_failed", server=server, error=reason)
            self.quotas.unrenewed(reason)
            if not isinstance(exc, AllowanceError) or status >= 500:
                # Unreachable, too slow or failing: the next server (as the follower).
                self.servers.failed(server, reason)
            return False
        if not self.quotas.renewable:
            log.info("gateway.allowances_renewed", server=server)
        self.quotas.granted(answers, time.monotonic())
        return True

    async def close(self) -> None:
        """Give back everything held (a graceful stop), within ``CALL_TIMEOUT_S``."""
        if self._absent or not self.quotas.shared:
            return
        async with self._calling:
            draws = self.quotas.release()
            if draws:
                await self._call(draws)


def call_body(draws: list[Draw], gateway: str | None) -> dict[str, Any]:
    """The body of one allowance call: the draws, and the gateway's id when it has one."""
    body: dict[str, Any] = {
        "draws": [
            {
                "client": d.client,
                "kind": d.kind,
                "want": d.want,
                "give_back": d.give_back,
                "credit": d.credit,
                "reserve": d.reserve,
            }
            for d in draws
        ]
    }
    if gateway:
        body["gateway"] = gateway
    return body
