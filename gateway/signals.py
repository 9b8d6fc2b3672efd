"""Posting the signal windows to the control plane (``POST /v1/signals``), for the
autoscaler.

Every ``interval`` the open windows are closed and posted with the gateway token; at
once when a request starts waiting for a model with no ready replica (the autoscaler's
scale-from-zero cue). Never on the request path: a post that fails is logged and its
windows dropped (the next window is as good a signal), and a control plane without the
route yet (404) is named once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import structlog

from gateway.state import State

log = structlog.get_logger("gateway")


class Signals:
    def __init__(self, state: State, server: str, token: str, interval_s: float) -> None:
        self.state = state
        self.url = server.rstrip("/") + "/v1/signals"
        self.interval_s = interval_s
        self.session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=5),
        )
        self._absent_named = False
        self._failing = False

    async def close(self) -> None:
        await self.session.close()

    async def run(self) -> None:
        while True:
            wake = self.state.wake_signals
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.interval_s)
            if wake.is_set():
                self.state.wake_signals = asyncio.Event()
            await self.post_once()

    async def post_once(self) -> None:
        windows = self.state.windows.close(time.monotonic(), time.time())
        if not windows:
            return
        body = {"gateway": self.state.gateway_id, "windows": windows}
        try:
            async with self.session.post(self.url, json=body) as resp:
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
                    raise aiohttp.ClientResponseError(
                        resp.request_info, (), status=resp.status, message=resp.reason or ""
                    )
            self._failing = False
        except (aiohttp.ClientError, TimeoutError) as exc:
            if not self._failing:
                self._failing = True
                log.warning("gateway.signals_failed", url=self.url, error=f"{exc!r:.200}")
