"""Reading the engines' own counts of the requests they serve, for borrowing idle slots.

The edge of gateway.stages.borrow: every ``POLL_S`` (``IDLE_POLL_S`` while this gateway
has no request in flight or waiting for the model), one ``GET`` per ready replica whose
slots are known, whose engine says its count and of whose slots this process is dealt
less than all: llama.cpp's ``/slots`` (the slots ``is_processing``), vLLM's and the sim's
``/metrics`` (``num_requests_running`` plus ``num_requests_waiting``); a replica newly
read is read every ``POLL_S`` until its readings span ``SPAN_S``. A short timeout
and a bounded read; a replica that fails is left unread (its limit is its deal) for
``FAILED_PAUSE_S``. What it reads goes into ``State.readings`` and the limits in force
(``State.relend``); the queue is pumped when one rose. Nothing here is on the request
path: a request never waits for a reading.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import aiohttp
import structlog

from gateway.stages.borrow import IDLE_POLL_S, KEPT, POLL_S, SPAN_S, Reading, others
from gateway.state import State
from gateway.table import Replica

log = structlog.get_logger("gateway")

TIMEOUT_S = 1.0
# /slots carries each slot's sampling parameters: a few KB a slot. More is not an answer.
MAX_BYTES = 1 << 20
# A replica whose count could not be read is asked again after this.
FAILED_PAUSE_S = 30.0
# The engines whose count is read, and where.
PATHS = {"llamacpp": "/slots", "vllm": "/metrics", "sim": "/metrics"}
_METRICS = (b"vllm:num_requests_running", b"vllm:num_requests_waiting")


def busy_of(engine: str, raw: bytes) -> int | None:
    """The requests an engine says it serves (running and waiting), or None when its
    answer says no such thing."""
    if engine == "llamacpp":
        try:
            slots = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(slots, list):
            return None
        busy = 0
        for slot in slots:
            if not isinstance(slot, dict):
                return None
            # (``state`` in older builds: 0 idle, 1 processing)
            if slot.get("is_processing") is True or slot.get("state") not in (None, 0):
                busy += 1
        return busy
    total, found = 0.0, False
    for line in raw.splitlines():
        if line.startswith(_METRICS):
            try:
                value = float(line.rsplit(None, 1)[1])
            except (IndexError, ValueError):
                return None
            if not math.isfinite(value) or value < 0:
                return None
            total += value
            found = True
    return int(total) if found else None


class EngineLoad:
    """Reads the replicas due and installs what they say (see the module)."""

    def __init__(self, state: State, timeout_s: float = TIMEOUT_S) -> None:
        self.state = state
        self.timeout_s = timeout_s
        self.session: aiohttp.ClientSession | None = None
        self._paused: dict[str, float] = {}  # replica key -> when to try it again
        self._last: dict[str, Reading] = {}
        self._first: dict[str, tuple[Reading, ...]] = {}  # a replica's first reading

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(POLL_S)

    def due(self, now: float) -> list[Replica]:
        """The replicas to read now (the module's rule)."""
        state = self.state
        out = []
        for model, replicas in state.table.ready.items():
            q = state.queues.get(model)
            active = bool(q is not None and q.length) or any(
                (load := state.loads.get(r.key)) is not None and load.inflight > 0 for r in replicas
            )
            every = POLL_S if active else IDLE_POLL_S
            for r in replicas:
                mine = state.deal.get(r.key)
                if mine is None or mine >= r.slots or r.engine not in PATHS:
                    continue
                if self._paused.get(r.key, 0.0) > now:
                    continue
                last = self._last.get(r.key)
                # (a replica newly read is read at POLL_S until its readings span SPAN_S)
                kept = state.readings.get(r.key)
                pace = every if kept and kept[-1].at - kept[0].at >= SPAN_S else POLL_S
                if last is None or now - last.at >= pace - 0.01:
                    out.append(r)
        return out

    async def check(self) -> None:
        now = time.monotonic()
        live = {r.key for rs in self.state.table.ready.values() for r in rs}
        for key in [k for k in self._last if k not in live]:
            del self._last[key]
            self._first.pop(key, None)
        for key in [k for k in self._paused if k not in live]:
            del self._paused[key]
        due = self.due(now)
        if not due:
            return
        found = await asyncio.gather(*(self.read(r) for r in due))
        state = self.state
        live = {r.key for rs in state.table.ready.values() for r in rs}
        for r, reading in zip(due, found, strict=True):
            if r.key not in live:
                continue
            if reading is None:
                self._last.pop(r.key, None)
                self._first.pop(r.key, None)
                state.readings.pop(r.key, None)
                self._paused[r.key] = time.monotonic() + FAILED_PAUSE_S
                continue
            self._last[r.key] = reading
            kept = (*state.readings.get(r.key, self._first.pop(r.key, ())), reading)
            if len(kept) < 2:
                self._first[r.key] = kept
            else:
                state.readings[r.key] = kept[-KEPT:]
        if state.relend(time.monotonic()):
            for hook in state.installed:
                hook()

    async def read(self, r: Replica) -> Reading | None:
        """The other gateways' requests at ``r``'s engine now, or None (logged once a
        replica) when its count could not be read."""
        if self.session is None:
            self.session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        headers: dict[str, str] = {}
        if r.auth:
            headers["authorization"] = r.auth.decode("ascii").split(": ", 1)[1].strip()
        load = self.state.loads.get(r.key)
        mine_before = 0 if load is None else load.inflight
        error = ""
        busy: int | None = None
        try:
            async with self.session.get(r.endpoint + PATHS[r.engine], headers=headers) as resp:
                raw = await resp.content.read(MAX_BYTES + 1)
                if resp.status != 200:
                    error = f"GET {PATHS[r.engine]} answered {resp.status}"
                elif len(raw) > MAX_BYTES:
                    error = f"GET {PATHS[r.engine]} answered more than {MAX_BYTES} bytes"
                else:
                    busy = busy_of(r.engine, raw)
                    if busy is None:
                        error = f"GET {PATHS[r.engine]} says no count of its requests"
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"GET {PATHS[r.engine]}: {type(exc).__name__}: {exc}"[:300]
        if busy is None:
            log.info("gateway.engine_load_unknown", replica=r.key, reason=error, using="its deal")
            return None
        load = self.state.loads.get(r.key)
        mine_after = 0 if load is None else load.inflight
        return Reading(others(busy, mine_before, mine_after), time.monotonic())
