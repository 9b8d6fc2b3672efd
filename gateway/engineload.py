"""Reading the engines' own counts of the requests they serve, for borrowing idle slots.

The edge of gateway.stages.borrow: every ``POLL_S`` (``IDLE_POLL_S`` while this gateway
has no request in flight or waiting for the model), one ``GET`` per ready replica whose
slots are known, whose engine says its count and of whose slots this process is dealt
less than all: ``/metrics`` where it says the requests running and those held back
(vLLM's and the sim's ``num_requests_running`` plus ``num_requests_waiting``; llama.cpp's
``requests_processing`` plus ``requests_deferred`` when it runs with ``--metrics``), else
llama.cpp's ``/slots`` (the slots ``is_processing``: it does not count the requests it
holds back, which may be the other gateways', so a replica whose every slot is busy lends
nothing). A replica newly
read, or read again after more than ``FRESH_S`` unread (its readings before the gap
dropped), is read every ``POLL_S`` until its readings span ``SPAN_S``. A short timeout
and a bounded read, each replica's on its own (an engine slow to answer delays its own
readings only); a replica that fails is left unread (its limit is its deal) for
``FAILED_PAUSE_S``. What it reads goes into ``State.readings`` and the limits in force
(``State.relend``); the queue is pumped when one rose. Nothing here is on the request
path: a request never waits for a reading.
"""

from __future__ import annotations

import asyncio
import math
import time

import aiohttp
import msgspec
import structlog

from gateway.bodies import read_at_most
from gateway.stages.borrow import (
    FRESH_S,
    IDLE_POLL_S,
    KEPT,
    POLL_S,
    SPAN_S,
    Reading,
    others,
)
from gateway.state import State
from gateway.table import Replica

log = structlog.get_logger("gateway")

TIMEOUT_S = 1.0
# /slots carries each slot's sampling parameters: a few KB a slot. More is not an answer.
MAX_BYTES = 1 << 20
# A /slots answer names each slot's state once: naming them more than this many times a
# slot, it is not one. A /metrics answer says each count once a model it serves: with
# more lines of them than this, it is not one.
NAMES_PER_SLOT = 4
MAX_COUNT_LINES = 256
# A replica whose count could not be read is asked again after this.
FAILED_PAUSE_S = 30.0
# The engines whose count is read, and where: llama.cpp's /metrics when it was started
# with --metrics (its requests deferred counted), else its /slots.
PATHS = {"llamacpp": ("/metrics", "/slots"), "vllm": ("/metrics",), "sim": ("/metrics",)}
_COUNTS = (
    b"vllm:num_requests_running",
    b"vllm:num_requests_waiting",
    b"llamacpp:requests_processing",
    b"llamacpp:requests_deferred",
)


class _Slot(msgspec.Struct, gc=False):
    """A ``/slots`` entry's state; the rest of it is skipped, never built."""

    is_processing: bool


class _OldSlot(msgspec.Struct, gc=False):
    state: int  # (builds before ``is_processing``: 0 idle, 1 processing)


_SLOTS = msgspec.json.Decoder(list[_Slot])
_OLD_SLOTS = msgspec.json.Decoder(list[_OldSlot])


def busy_of(path: str, raw: bytes, slots: int = 1) -> tuple[int, bool] | None:
    """The requests an engine says it serves, and whether that counts the ones it holds
    back (``/metrics``: running and waiting; llama.cpp's ``/slots``: only the slots
    processing); None when its answer says no such thing. Bounded by ``raw``'s bytes,
    not by what they expand to: 1 MB of ``{},`` is 340,000 objects and of newlines a
    million lines, each made on the event loop, every ``POLL_S``."""
    if path == "/slots":
        # Every entry names its state, once (a name a client's prompt or params cannot
        # forge: a quote in a JSON string is escaped); ``slots``: the replica's.
        names = raw.count(b'"is_processing"') + raw.count(b'"state"')
        if names > NAMES_PER_SLOT * max(slots, 1):
            return None
        try:
            try:
                return sum(s.is_processing for s in _SLOTS.decode(raw)), False
            except msgspec.ValidationError:
                return sum(s.state != 0 for s in _OLD_SLOTS.decode(raw)), False
        except (msgspec.DecodeError, RecursionError):  # (not a list of them, too deep)
            return None
    total, lines = 0.0, 0
    text = b"\n" + raw  # (each count's line found by its name after a newline)
    for name in _COUNTS:
        at = text.find(b"\n" + name)
        while at != -1:
            if lines >= MAX_COUNT_LINES:
                return None
            end = text.find(b"\n", at + 1)
            line = text[at + 1 : None if end == -1 else end]
            try:
                value = float(line.rsplit(None, 1)[1])
            except (IndexError, ValueError):
                return None
            if not math.isfinite(value) or value < 0:
                return None
            total += value
            lines += 1
            at = end if end == -1 else text.find(b"\n" + name, end)
    # (counts each finite that add up to more than a float holds: no count either)
    return (int(total), True) if lines and math.isfinite(total) else None


class EngineLoad:
    """Reads the replicas due and installs what they say (see the module)."""

    def __init__(self, state: State, timeout_s: float = TIMEOUT_S) -> None:
        self.state = state
        self.timeout_s = timeout_s
        self.session: aiohttp.ClientSession | None = None
        self._paused: dict[str, float] = {}  # replica key -> when to try it again
        self._last: dict[str, Reading] = {}
        self._first: dict[str, tuple[Reading, ...]] = {}  # a replica's first reading
        self._path: dict[str, str] = {}  # where a replica's count is read, when not first
        self._reading: dict[str, asyncio.Task[None]] = {}  # replica key -> its read now

    async def close(self) -> None:
        for task in self._reading.values():
            task.cancel()
        await asyncio.gather(*self._reading.values(), return_exceptions=True)
        if self.session is not None:
            await self.session.close()

    async def run(self) -> None:
        # Each replica's read on its own: an engine slow to answer (up to the timeout)
        # delays its own readings, never the others' (each POLL_S).
        while True:
            self.start()
            self.settle()
            await asyncio.sleep(POLL_S)

    async def check(self) -> None:
        """One round, its reads awaited: what ``run`` does each ``POLL_S``."""
        await asyncio.gather(*self.start())
        self.settle()

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
                if self._paused.get(r.key, 0.0) > now or r.key in self._reading:
                    continue
                last = self._last.get(r.key)
                # (a replica newly read is read at POLL_S until its readings span SPAN_S)
                kept = state.readings.get(r.key)
                pace = every if kept and kept[-1].at - kept[0].at >= SPAN_S else POLL_S
                if last is None or now - last.at >= pace - 0.01:
                    out.append(r)
        return out

    def start(self) -> list[asyncio.Task[None]]:
        """A read of each replica due (one at a time a replica); the entries of the
        replicas gone are dropped."""
        now = time.monotonic()
        live = {r.key for rs in self.state.table.ready.values() for r in rs}
        # (a replica left unread when it went has no ``_last``: each kept apart)
        for key in {*self._last, *self._first, *self._path, *self._paused} - live:
            self._last.pop(key, None)
            self._first.pop(key, None)
            self._path.pop(key, None)
            self._paused.pop(key, None)
        started = []
        for r in self.due(now):
            task = asyncio.create_task(self._read_one(r), name=f"engine-load {r.key}")
            self._reading[r.key] = task
            started.append(task)
        return started

    async def _read_one(self, r: Replica) -> None:
        try:
            self._take(r, await self.read(r))
        finally:
            self._reading.pop(r.key, None)

    def _take(self, r: Replica, reading: Reading | None) -> None:
        """What a read found, into ``State.readings`` (in force at the next ``settle``)."""
        state = self.state
        if not any(x.key == r.key for x in state.table.ready.get(r.model, ())):
            return  # (gone meanwhile)
        if reading is None:
            self._last.pop(r.key, None)
            self._first.pop(r.key, None)
            state.readings.pop(r.key, None)
            self._paused[r.key] = time.monotonic() + FAILED_PAUSE_S
            return
        self._last[r.key] = reading
        before = state.readings.pop(r.key, self._first.pop(r.key, ()))
        if before and reading.at - before[-1].at > FRESH_S:
            # Unread meanwhile (dealt all of it, say): the readings before the gap
            # say nothing of the slots since, and a span starts again.
            before = ()
        kept = (*before, reading)
        if len(kept) < 2:
            self._first[r.key] = kept
        else:
            state.readings[r.key] = kept[-KEPT:]

    def settle(self) -> None:
        """The limits in force from the readings now; the queues pumped when one rose."""
        state = self.state
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
        # The engine's key, and the one before a rotation when it refuses that (an
        # engine keeps the key it was started with until it restarts).
        keys = [r.auth, r.auth_previous] if r.auth and r.auth_previous else [r.auth]
        paths = PATHS[r.engine]
        path = self._path.get(r.key, paths[0])
        if path not in paths:  # (the key's replica before was another engine)
            path = paths[0]
        error = ""
        status = 0
        found: tuple[int, bool] | None = None
        mine_before = 0
        try:
            for key in keys:
                headers = (
                    {"authorization": key.decode("ascii").split(": ", 1)[1].strip()} if key else {}
                )
                load = self.state.loads.get(r.key)
                mine_before = 0 if load is None else load.inflight
                async with self.session.get(r.endpoint + path, headers=headers) as resp:
                    raw = await read_at_most(resp.content, MAX_BYTES)
                    status = resp.status
                if status != 401:
                    break
            if status != 200:
                error = f"GET {path} answered {status}"
            elif len(raw) > MAX_BYTES:
                error = f"GET {path} answered more than {MAX_BYTES} bytes"
            else:
                found = busy_of(path, raw, r.slots)
                if found is None:
                    error = f"GET {path} says no count of its requests"
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"GET {path}: {type(exc).__name__}: {exc}"[:300]
        if found is None:
            later = paths[paths.index(path) + 1 :]
            # (answered, and not a refused key: not this path)
            if later and status != 401 and not error.startswith(f"GET {path}: "):
                self._path[r.key] = later[0]
                return await self.read(r)
            log.info("gateway.engine_load_unknown", replica=r.key, reason=error, using="its deal")
            return None
        busy, whole = found
        load = self.state.loads.get(r.key)
        mine_after = 0 if load is None else load.inflight
        if not whole and busy >= r.slots:
            # Every slot busy, and the requests it holds back not counted: they may be
            # the others'. It lends nothing (the module's bound).
            return Reading(r.slots, time.monotonic())
        return Reading(others(busy, mine_before, mine_after), time.monotonic())
