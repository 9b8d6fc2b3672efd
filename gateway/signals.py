"""Posting the signal windows to the control plane (``POST /v1/signals``), for the
autoscaler.

Every ``interval`` the open windows are closed and posted with the gateway token, an
empty ``windows`` list included: the autoscaler tells an idle model (gateways report,
not this model) from a silent gateway (no report at all: hold, never scale down on
silence), so an idle gateway must keep reporting. At once when a request starts waiting
for a model with no ready replica (the autoscaler's scale-from-zero cue); a burst of
such requests is one post, then at most one per ``WAKE_GAP_S``. Never on the request
path: a post that fails is logged and its windows dropped (the next window is as good a
signal), and a control plane without the route yet (404) is named once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp
import structlog

from catalog.forms.servers import ServerList
from gateway.bodies import read_at_most
from gateway.stages.slotshare import members_of
from gateway.state import State

log = structlog.get_logger("gateway")

# The control plane takes at most 2,000 windows per report (autoscale.signals); a gateway
# serving more models posts several.
MAX_WINDOWS = 1_000
# Early posts for waiting requests: the first at once, the next no sooner than this.
WAKE_GAP_S = 0.5
# An answer (the live gateways' names) of more than this is not read as one.
MAX_ANSWER_BYTES = 1 << 18


class Signals:
    def __init__(
        self,
        state: State,
        servers: str | ServerList,
        token: str,
        interval_s: float,
        worker: int = 0,
    ) -> None:
        """``servers``: the follower's (one list: both stick to the same replica)."""
        self.state = state
        # Who posts is the token's name and this number, as the control plane counts it.
        self.worker = worker
        if isinstance(servers, str):
            servers = ServerList((servers.rstrip("/"),))
        self.servers = servers
        self.interval_s = interval_s
        self.session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=5),
        )
        self._absent_named = False
        self._failing = False
        self._last_post = -WAKE_GAP_S

    @property
    def url(self) -> str:
        return self.servers.current + "/v1/signals"

    async def close(self) -> None:
        await self.session.close()

    async def run(self) -> None:
        while True:
            wake = self.state.wake_signals
            due = self._last_post + self.interval_s - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), max(due, 0.0))
            if wake.is_set():
                gap = self._last_post + WAKE_GAP_S - time.monotonic()
                if gap > 0:
                    await asyncio.sleep(gap)
                self.state.wake_signals = asyncio.Event()
            await self.post_once()

    async def post_once(self) -> None:
        self._last_post = time.monotonic()
        windows = self.state.windows.close(self._last_post, time.time())
        for first in range(0, max(len(windows), 1), MAX_WINDOWS):
            await self._post(windows[first : first + MAX_WINDOWS])

    async def _post(self, windows: list[dict[str, Any]]) -> None:
        body = {"gateway": self.state.gateway_id, "worker": self.worker, "windows": windows}
        server, url = self.servers.current, self.url
        try:
            async with self.session.post(url, json=body) as resp:
                if resp.status == 404:
                    if not self._absent_named:
                        self._absent_named = True
                        log.info(
                            "gateway.signals_absent",
                            url=self.url,
                            detail="the control plane has no /v1/signals yet; windows are "
                            "dropped until it has",
                        )
                    return
                if resp.status >= 300:
                    # The control plane's problem names the field (a 403: the token's role).
                    detail = (await resp.content.read(2048)).decode("utf-8", "replace")
                    raise aiohttp.ClientResponseError(
                        resp.request_info,
                        (),
                        status=resp.status,
                        message=f"{resp.reason or ''}: {detail}",
                    )
                # The live gateways, this one named among them: its deal of the slots.
                raw = await read_at_most(resp.content, MAX_ANSWER_BYTES)
            self._failing = False
            self._members(raw)
        except (aiohttp.ClientError, TimeoutError) as exc:
            refused = isinstance(exc, aiohttp.ClientResponseError) and exc.status < 500
            if not refused:  # every replica would refuse alike; an outage is this one's
                self.servers.failed(server, f"{type(exc).__name__}: {exc}"[:300])
            if not self._failing:
                self._failing = True
                log.warning("gateway.signals_failed", url=self.url, error=f"{exc!r:.600}")

    def _members(self, raw: bytes) -> None:
        """The answer's ``gateways`` and ``gateway`` (who posted) into ``State.join``
        (gateway.stages.slotshare); an answer without them (a control plane before them)
        leaves the members known."""
        if len(raw) > MAX_ANSWER_BYTES:
            return
        try:
            answer = json.loads(raw)
        except (ValueError, RecursionError):  # (RecursionError: nested too deep)
            return
        if isinstance(answer, dict):
            members = members_of(answer.get("gateways"), answer.get("gateway"))
            if members is not None:
                self.state.join(members)
