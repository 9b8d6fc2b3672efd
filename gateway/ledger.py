"""Flushing the usage ledger to the control plane (``POST /v1/usage``), off the request path.

Every ``interval`` (``[gateway] usage_flush``, 1 s by default, at most 60 s) the counts
of ``gateway.stages.ledger`` are taken as one flush with an id of its own and posted;
the control plane appends each row as a ``usage.recorded`` event under that id
(events.write.usage), so a flush sent again after a lost answer is recorded once. A
flush that fails (the control plane out of reach, a 5xx) is kept, id and rows, and sent
again first at the next tick; meanwhile new counts go on merging in the ledger (one
flush at most is outstanding). A flush the control plane refuses (4xx: it names the
field) is dropped and named in the log (``gateway.usage_refused``): sending it again
would be refused again.

A graceful stop (SIGTERM) flushes everything after the requests in flight have ended
(``final``). What a SIGKILLed gateway had counted and not flushed is lost: at most
``interval`` of its traffic (the counts are taken at the start of each tick, a tick
every ``interval``), plus the flush then on its way if the control plane had not
recorded it yet, and whatever it held while the control plane was out of reach.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp
import structlog

from catalog.forms.servers import ServerList
from gateway.stages.ledger import Ledger

log = structlog.get_logger("gateway")

# The control plane takes at most this many rows a flush (llmgw.api.routes.usage); a
# larger one is posted in parts, each with its own id.
MAX_ROWS = 1_000
# How many times a stop tries to deliver what it holds, ``STOP_PAUSE_S`` apart.
STOP_TRIES = 3
STOP_PAUSE_S = 0.5


class Flusher:
    def __init__(
        self,
        ledger: Ledger,
        servers: str | ServerList,
        token: str,
        interval_s: float,
        *,
        worker: int = 0,
        gateway_id: str = "",
    ) -> None:
        self.ledger = ledger
        if isinstance(servers, str):
            servers = ServerList((servers.rstrip("/"),))
        self.servers = servers
        self.interval_s = interval_s
        self.worker = worker
        self.gateway_id = gateway_id
        self.session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=5),
        )
        # Flushes taken and not yet recorded, oldest first: (id, rows).
        self.pending: list[tuple[str, list[dict[str, Any]]]] = []
        self.flushed_rows = 0
        self._failing = False
        self._absent_named = False

    @property
    def url(self) -> str:
        return self.servers.current + "/v1/usage"

    async def close(self) -> None:
        await self.session.close()

    async def run(self) -> None:
        # A tick every ``interval`` from the start of the last one: the counts are taken
        # at most that far apart, however long a post takes.
        last = time.monotonic()
        while True:
            await asyncio.sleep(max(last + self.interval_s - time.monotonic(), 0.0))
            last = time.monotonic()
            await self.flush_once()

    async def flush_once(self) -> bool:
        """One tick: what is outstanding, oldest first, or else what was counted since the
        last; whether everything taken is now recorded. (Counts made while a flush was
        outstanding wait for the next tick: never more than one flush a tick, however
        busy the gateway.)"""
        if not self.pending:
            self._take()
        while self.pending:
            flush, rows = self.pending[0]
            if not await self._post(flush, rows):
                return False
            self.pending.pop(0)
            self.flushed_rows += len(rows)
        return True

    async def final(self) -> None:
        """A graceful stop (no request in flight any more): everything counted, delivered
        (``STOP_TRIES`` tries); what could not be is named in the log with its counts."""
        for attempt in range(STOP_TRIES):
            while await self.flush_once():
                if not len(self.ledger):
                    log.info(
                        "gateway.usage_flushed",
                        rows=self.flushed_rows,
                        requests=self.ledger.recorded,
                        detail="every finished request's usage is in the control plane's ledger",
                    )
                    return
            if attempt + 1 < STOP_TRIES:
                await asyncio.sleep(STOP_PAUSE_S)
        self._take()
        lost = sum(r["requests"] for _, rows in self.pending for r in rows)
        log.error(
            "gateway.usage_lost",
            requests=lost,
            rows=sum(len(rows) for _, rows in self.pending),
            detail="the control plane could not be reached at the stop; these requests' "
            "usage is not in the ledger (their log lines, gateway.request, have it)",
        )

    def _take(self) -> None:
        if self.ledger.dropped:
            log.warning(
                "gateway.usage_dropped",
                requests=self.ledger.dropped,
                detail="the ledger held its most keys while the control plane was out of "
                "reach; these requests' usage was not counted",
            )
        rows = self.ledger.take()
        for first in range(0, len(rows), MAX_ROWS):
            self.pending.append((os.urandom(16).hex(), rows[first : first + MAX_ROWS]))

    async def _post(self, flush: str, rows: list[dict[str, Any]]) -> bool:
        """Whether the control plane has the flush (recorded now or before, or refused
        for good and dropped)."""
        # (Who posted is the token's name and worker; the gateway's own id is named in
        # its log lines, not sent: any --id it runs with must not get a flush refused.)
        body = {
            "worker": self.worker,
            "flush": flush,
            "rows": rows,
        }
        server, url = self.servers.current, self.url
        started = time.monotonic()
        try:
            async with self.session.post(url, json=body) as resp:
                if resp.status < 300:
                    if self._failing:
                        log.info("gateway.usage_recovered", url=url)
                    self._failing = False
                    log.debug(
                        "gateway.usage_posted",
                        gateway=self.gateway_id,
                        flush=flush,
                        rows=len(rows),
                        ms=round((time.monotonic() - started) * 1e3, 1),
                    )
                    return True
                detail = (await resp.content.read(2048)).decode("utf-8", "replace")
                if resp.status == 404 and not self._absent_named:
                    self._absent_named = True
                    log.warning(
                        "gateway.usage_absent",
                        url=url,
                        detail="the control plane has no /v1/usage yet: usage is dropped "
                        "until it has (upgrade it)",
                    )
                if resp.status < 500:
                    log.error(
                        "gateway.usage_refused",
                        url=url,
                        status=resp.status,
                        flush=flush,
                        requests=sum(r["requests"] for r in rows),
                        detail=detail,
                    )
                    return True
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status, message=detail[:600]
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.servers.failed(server, f"{type(exc).__name__}: {exc}"[:300])
            if not self._failing:
                self._failing = True
                log.warning(
                    "gateway.usage_failed",
                    url=url,
                    error=f"{exc!r:.600}",
                    detail="kept, and sent again at the next flush",
                )
            return False
