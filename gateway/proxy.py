"""One admitted request, from the model asked for to an answer: route, send, retry, fall back.

The order, as the issue and ``docs/operator/gateway.md`` state it:

1. The model asked for, then its ``fallbacks`` in order, each admitted on its own limits
   (a fallback that refuses the request is passed over and named in the 503).
2. Within a model, a replica chosen by its routing profile among the ready ones not set
   aside; a failure before the first byte reached the client (refused, reset, timed out,
   5xx) sets that replica aside and tries another, up to ``attempts``; then the next model.
   A model with no ready replica goes to the next at once. With the ``latency`` profile,
   a model whose best replica is predicted above its ``slo.ttft_p99`` is passed over for
   a fallback predicted within its own, and used only if none is.
3. Nothing served and the model asked for has replicas starting (or none at all, which an
   autoscaler may start: the scale-from-zero path): wait for the routing table to change,
   up to the profile's ``startup_timeout`` (capped by ``max_wait``), then 503 with
   ``Retry-After``.

A stream's headers are held until its first content token, so a failure before it is
still invisible to the client and can be retried; after it, the stream ends with one
terminal error event (``data: {"error": ...}``), never a retry. Bytes sent are never
sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from catalog.definition.routing_profiles import PREFIX, SESSION
from catalog.forms.client_limits import NO_LIMITS, ClientLimits
from catalog.forms.priority import STANDARD
from gateway import usage
from gateway.settings import GatewaySettings
from gateway.stages import admission, plausible, prefix, quota, sse
from gateway.stages.admission import Refusal, Request
from gateway.stages.head import pairs
from gateway.stages.queue import (
    Bounds,
    ModelQueue,
    Waiter,
    free_slots,
    holdable,
    is_open,
    open_replicas,
    rooms,
    unreserved,
)
from gateway.stages.routing import Choice, choose, eligible, observe_ttft, picked
from gateway.stages.slotshare import Members
from gateway.state import Recent, State
from gateway.table import ModelEntry, Replica
from gateway.upstream import Answer, BrokenAnswer, Unreachable, Upstream
from gateway.usage import Usage

if TYPE_CHECKING:  # (the proxy needs no server at run time: httpguard.protocol loads uvicorn)
    from httpguard.protocol import RequestHooks

log = structlog.get_logger("gateway")

# The gateway's own headers of every answer (``Proxy._head``), and of a stream's.
OWN_HEAD = (
    b"x-llmgw-model: %b\r\nx-llmgw-replica: %b\r\nx-llmgw-overhead-ms: %.3f\r\nx-request-id: %b\r\n"
)
STREAM_HEAD = (
    b"content-type: text/event-stream\r\ncache-control: no-cache\r\nx-accel-buffering: no\r\n"
)

Send = Callable[[dict[str, Any]], Awaitable[None]]
# A body larger than this is re-encoded (alias -> name) in a worker thread.
INLINE_JSON = 256 * 1024
# A stream's bytes held while its first content token is awaited; past this, passed on as
# they are (and no retry). Unbounded, an engine whose first event never ended was held
# whole and rescanned on every read: 64 MiB took 46 s of the event loop's CPU.
HOLD_BYTES = 1 << 20
# A large whole answer's last bytes, where its ``usage`` is (OpenAI's and the engines'
# answers end with it), kept to count its tokens.
USAGE_TAIL = 4096
# What the engine reused of the prompt, for the prefix router's check: vLLM's and the
# sim's usage (``cached_tokens``), llama.cpp's timings (``cache_n``).
_CACHED_TOKENS = re.compile(rb'"(?:cached_tokens|cache_n)"\s*:\s*(\d{1,9})')
# llama.cpp's prompt tokens computed (a stream's final chunk has its timings, and usage
# only when asked): with cache_n, the prompt's tokens.
_PROMPT_N = re.compile(rb'"prompt_n"\s*:\s*(\d{1,9})')
# The profiles that choose a replica for its cache: a request of theirs may wait for the
# replica chosen when it is full (a hold, gateway.stages.queue).
FOR_CACHE = frozenset({PREFIX, SESSION})
ROUTES = {
    admission.CHAT: "/v1/chat/completions",
    admission.COMPLETIONS: "/v1/completions",
    admission.EMBEDDINGS: "/v1/embeddings",
}


@dataclass(slots=True)
class Trace:
    """What happened to one request, for its log line and its headers."""

    request_id: str
    client: str
    started: float
    served: str | None = None
    replica: str | None = None
    status: int = 0
    outcome: str = "ok"
    tried: list[str] = field(default_factory=list)
    attempts: int = 0
    upstream_s: float = 0.0
    ttft_s: float | None = None
    tpot_s: float | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    # The prompt tokens the engine said it took from its cache (None: it did not say).
    cached_tokens: int | None = None
    waited_s: float = 0.0
    # In the model's queue, for a free slot (gateway.stages.queue); the class it ran in.
    queued_s: float = 0.0
    priority_class: str = STANDARD
    bytes_sent: bool = False
    # The client has every byte of the answer ([DONE] sent): a hang-up after it is no
    # cancellation.
    complete: bool = False
    # The engine's own counts (its answer's ``usage``), when it gave them.
    usage: Usage | None = None
    # The client token's limits, and its reservation until it settles
    # (gateway.stages.quota).
    limits: ClientLimits = NO_LIMITS
    ticket: quota.Ticket | None = None
    # A stream's last message was sent (nothing may follow it).
    finished: bool = False


# (Not frozen: a frozen dataclass's fields are set one by one through object.__setattr__,
# four times the instructions of a plain one's, and one is made on every request.)
@dataclass(slots=True)
class Call:
    """One request as the proxy handles it: its facts, its body, where to answer."""

    req: Request
    body: dict[str, Any]
    raw: bytes
    allowed: frozenset[str] | None
    send: Send
    trace: Trace
    # The server's hooks (httpguard's protocol), when it has them: a stream's events are
    # written through them.
    hooks: RequestHooks | None = None
    # Where it stands in a full model's queue: its client's share, and how long it may
    # wait there (its client's own timeout when shorter than the gateway's bound).
    share: float = 1.0
    queue_wait_s: float | None = None


class _OverSlo(Exception):
    def __init__(self, choice: Choice) -> None:
        self.choice = choice


class Proxy:
    def __init__(self, state: State, upstream: Upstream, settings: GatewaySettings) -> None:
        self.state = state
        self.upstream = upstream
        self.settings = settings
        # This process's part of each replica's slots (``state.dealt``): dealt among the
        # live gateway processes (gateway.stages.slotshare), or the operator's fixed
        # [gateway] slot_share split evenly between its workers. Until the control plane
        # names the others: this gateway's workers.
        state.slot_share = settings.slot_share
        state.workers = max(settings.workers, 1)
        state.members = Members(state.workers, settings.worker % state.workers)
        state.redeal()
        # A new table may bring replicas with free slots: the queues' waiters take them.
        state.installed.append(self.pump_all)

    def chain(self, entry: ModelEntry, allowed: frozenset[str] | None) -> list[ModelEntry]:
        """The model and its fallbacks the client may use, in order, each once."""
        out, seen = [entry], {entry.name}
        for name in entry.fallbacks:
            m = self.state.table.resolve(name)
            if m is None or m.name in seen or (allowed is not None and m.name not in allowed):
                continue
            seen.add(m.name)
            out.append(m)
        return out

    async def serve(self, call: Call, entry: ModelEntry) -> None:
        """Answer the request on ``send``; a ``Refusal`` when nothing is sent."""
        try:
            await self._serve(call, entry)
        finally:
            if call.trace.ticket is not None:
                self._settle(call.trace, call.trace.ticket)

    def _settle(self, trace: Trace, ticket: quota.Ticket) -> None:
        """The reservation settles to the engine's usage; without it (a stream cut
        before its usage event, an engine that gives none), to the prompt reserved and
        the completion counted; a request that sent nothing used nothing."""
        if trace.usage is not None:
            used = trace.usage.total
        elif trace.bytes_sent:
            used = ticket.prompt + (trace.completion_tokens or 0)
        else:
            used = 0
        self.state.quotas.settle(ticket, used, time.monotonic())

    async def _serve(self, call: Call, entry: ModelEntry) -> None:
        trace = call.trace
        deadline: float | None = None
        while True:
            if await self._try_chain(call, entry):
                return
            # Nothing served. Wait only for a model with nothing ready to try: one whose
            # ready replicas all failed is an outage, not a start.
            now = time.monotonic()
            if self.state.table.ready.get(entry.name):
                break
            if deadline is None:
                deadline = now + min(entry.startup_timeout_s, self.settings.max_wait_s)
                self.state.windows.waited(entry.name, now)
                self.state.wake_signals.set()
                log.info(
                    "gateway.waiting",
                    request_id=trace.request_id,
                    model=entry.name,
                    starting=self.state.table.coming.get(entry.name, 0),
                    up_to_s=round(deadline - now, 1),
                )
            if now >= deadline:
                break
            changed = self.state.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), deadline - now)
            trace.waited_s = time.monotonic() - trace.started
        trace.outcome = "unavailable"
        tried = "; ".join(trace.tried) or "no replica of it is ready"
        retry = 5 if self.state.table.coming.get(entry.name) else 30
        raise Refusal(
            503,
            f"model {entry.name!r} could not be served: {tried}. Retry later (ready "
            f"replicas: {len(self.state.table.ready.get(entry.name, ()))}, starting: "
            f"{self.state.table.coming.get(entry.name, 0)}).",
            param="model",
            code="no_replica_available",
            type="service_unavailable",
            retry_after=retry,
        )

    async def _try_chain(self, call: Call, entry: ModelEntry) -> bool:
        req, trace = call.req, call.trace
        chain = self.chain(entry, call.allowed)
        over_slo: tuple[ModelEntry, Choice] | None = None
        for i, m in enumerate(chain):
            try:
                admission.admit(req, m)
                w = admission.window(m, self.state.table.ready.get(m.name, ()))
                if admission.needs_count(req, m, w):
                    await self._count(req, m, trace, w)
                if trace.ticket is None and trace.limits is not NO_LIMITS:
                    # Reserved once, on the first model the request is admitted to.
                    tokens, prompt = quota.reservation(req, m, trace.prompt_tokens, w)
                    trace.ticket = self.state.quotas.admit(
                        trace.client,
                        trace.limits,
                        m.name,
                        tokens,
                        prompt=prompt,
                        now=time.monotonic(),
                    )
            except Refusal as refusal:
                if m is entry:
                    raise
                trace.tried.append(f"fallback {m.name!r} refused it ({refusal.reason})")
                continue
            last = i == len(chain) - 1
            try:
                if await self._attempts(call, m, slo_binding=not last):
                    return True
            except _OverSlo as over:
                trace.tried.append(
                    f"{m.name!r} predicted above its slo.ttft_p99 ({over.choice.reason})"
                )
                if over_slo is None:
                    over_slo = (m, over.choice)
        if over_slo is not None:  # none predicted within its SLO: the best there was
            m, choice = over_slo
            return await self._attempts(call, m, slo_binding=False, first=choice)
        return False

    async def _count(self, req: Request, m: ModelEntry, trace: Trace, w: admission.Window) -> None:
        ready = self.state.table.ready.get(m.name)
        if ready:
            tokens, how = await self.upstream.count(ready[0].endpoint, m.name, req, ready[0].auth)
        else:
            tokens, how = admission.estimate(req), "an estimate: no replica to count with"
        trace.prompt_tokens = tokens
        admission.fits(req, m, tokens, how, w)

    async def _attempts(  # noqa: PLR0915 (the slot stage's common path inline: a call costs)
        self, call: Call, m: ModelEntry, *, slo_binding: bool, first: Choice | None = None
    ) -> bool:
        state, req, trace = self.state, call.req, call.trace
        tried: set[str] = set()
        session = req.session
        waiter: Waiter | None = None
        prompt = prefix.prompt_of(call.body, req.kind) if m.routing_profile == PREFIX else None
        for _ in range(self.settings.attempts):
            now = time.monotonic()
            if first is not None and first.replica.key in {
                r.key for r in state.table.ready.get(m.name, ())
            }:
                choice, first = first, None
            else:
                first = None
                ready = [r for r in state.table.ready.get(m.name, ()) if r.key not in tried]
                candidates = eligible(ready, state.loads, now)
                picked: Choice | None = None
                if candidates and (state.queues or m.name in state.table.slotted):
                    if m.routing_profile in FOR_CACHE:
                        free, picked, prefer = self._at_once(m, candidates, session, prompt, now)
                    else:  # (inline: every request's path to a model with slots)
                        q = state.queues.get(m.name)
                        busy = q is not None and (q.length or q.granted)
                        free = [] if busy else open_replicas(candidates, state.loads, state.dealt)
                        prefer = None
                    if free:
                        candidates = free
                    elif picked is None:
                        candidates, queued = await self._gate(call, m, tried, prefer)
                        waiter = waiter or queued
                if picked is None:
                    picked = choose(
                        m.routing_profile,
                        candidates,
                        state.loads,
                        session=session,
                        ttft_slo_s=m.ttft_slo_s,
                        prompt=prompt,
                        prefixes=state.prefix,
                        now=now,
                    )
                if picked is None:  # (no candidate)
                    if ready:
                        trace.tried.append(f"{m.name!r}: every ready replica is set aside")
                    elif not tried:
                        trace.tried.append(f"{m.name!r}: no ready replica")
                    return False
                choice = picked
                if slo_binding and not choice.meets_slo:
                    # Shown in GET /routing too: a choice not made is a choice.
                    state.remember(
                        m.name, Recent(time.time(), None, choice, ": not sent, its fallbacks first")
                    )
                    raise _OverSlo(choice)
            replica = choice.replica
            tried.add(replica.key)
            state.remember(m.name, Recent(time.time(), replica.key, choice))
            ticket = (
                None
                if prompt is None
                else state.prefix.record(replica.key, prompt, choice.prefix_blocks)
            )
            try:
                await self._send(call, m, replica)
                if waiter is not None and (q := state.queues.get(m.name)) is not None:
                    served = (trace.prompt_tokens or 0) + (trace.completion_tokens or 0)
                    q.served(waiter, served or None)
                if ticket is not None:
                    self._check(m.name, ticket, trace)
                return True
            except Unreachable as exc:
                trace.tried.append(f"{replica.key}: {exc.reason}")
                until = state.aside.failed(replica.key, state.load(replica.key), time.monotonic())
                state.metrics.retries.labels(m.name).inc()
                log.warning(
                    "gateway.replica_set_aside",
                    request_id=trace.request_id,
                    replica=replica.key,
                    reason=exc.reason,
                    for_s=round(until - time.monotonic(), 2),
                )
        return False

    def _choose(
        self,
        m: ModelEntry,
        candidates: list[Replica],
        session: str | None,
        prompt: prefix.Prompt | None,
        now: float,
    ) -> Choice | None:
        return choose(
            m.routing_profile,
            candidates,
            self.state.loads,
            session=session,
            ttft_slo_s=m.ttft_slo_s,
            prompt=prompt,
            prefixes=self.state.prefix,
            now=now,
        )

    def _at_once(  # (the profiles of FOR_CACHE only)
        self,
        m: ModelEntry,
        candidates: list[Replica],
        session: str | None,
        prompt: prefix.Prompt | None,
        now: float,
    ) -> tuple[list[Replica], Choice | None, Replica | None]:
        """A model with slots known: (the replicas with a free one, when nobody waits
        for one; the choice already made, when a profile that chooses for the cache
        chose a replica with a free slot; the replica to hold for). Nothing of the
        first two: the request waits in the queue (``_gate``). No await: this is every
        request's path to a model with slots.

        ``prefix`` (with a prompt) and ``session`` (with a key) choose among all the
        candidates, full or not, so that a full replica holding the prompt is waited
        for (a hold, gateway.stages.queue) rather than overridden by whichever replica
        frees a slot first; past the balance bound (``_hold``) or not chosen for its
        cache, the request takes the first free slot, as any."""
        state = self.state
        q = state.queues.get(m.name)
        busy = q is not None and bool(q.length or q.granted)
        prefer: Replica | None = None
        if len(candidates) > 1 and (
            (prompt is not None and m.routing_profile == PREFIX)
            or (session is not None and m.routing_profile == SESSION)
        ):
            want = self._choose(m, candidates, session, prompt, now)
            assert want is not None  # (candidates is not empty)
            if not busy and is_open(want.replica, state.loads, state.dealt):
                return [], want, None
            if want.sticky:
                prefer = self._hold(m, want.replica, candidates)
        if busy or prefer is not None:
            return [], None, prefer
        return open_replicas(candidates, state.loads, state.dealt), None, None

    def _queue(self, m: ModelEntry) -> ModelQueue:
        q = self.state.queues.get(m.name)
        if q is None:
            q = self.state.queues[m.name] = ModelQueue(
                m.name,
                Bounds(
                    self.settings.queue_max_length,
                    self.settings.queue_max_wait_s,
                    self.settings.queue_starvation_s,
                ),
            )
        return q

    def _hold(self, m: ModelEntry, chosen: Replica, candidates: list[Replica]) -> Replica | None:
        """``chosen`` (for what it holds) when the request may wait for its slot
        (``queue.holdable``); else None, counted as a spill."""
        if self.settings.queue_hold_s <= 0:
            return None
        q = self._queue(m)
        if holdable(chosen.key, candidates, self.state.loads, q.holding()):
            return chosen
        q.spilled(chosen.key)
        return None

    async def _gate(
        self, call: Call, m: ModelEntry, tried: set[str], prefer: Replica | None = None
    ) -> tuple[list[Replica], Waiter | None]:
        """The replicas with a free slot after waiting in the model's queue
        (``gateway.stages.queue``): every ready one is full, or others wait already.
        With ``prefer``, the request holds for that replica's slot (a hold): granted it,
        that replica alone."""
        state = self.state
        q = self._queue(m)
        waiter: Waiter | None = None
        while True:
            waiter = await self._wait(call, m, q, waiter, prefer)
            slot, waiter.slot = waiter.slot, None
            ready = [r for r in state.table.ready.get(m.name, ()) if r.key not in tried]
            candidates = eligible(ready, state.loads, time.monotonic())
            if slot is not None:
                mine = [r for r in candidates if r.key == slot]
                if mine and is_open(mine[0], state.loads, state.dealt):
                    return mine, waiter
            free = unreserved(candidates, state.loads, state.dealt, q.reserved)
            if free or not ready:
                # Nothing ready at all: the caller's path for a model without replicas.
                return free, waiter
            prefer = None  # (its slot went: back at its line's head, for any slot)

    async def _wait(
        self,
        call: Call,
        m: ModelEntry,
        q: ModelQueue,
        again: Waiter | None,
        prefer: Replica | None = None,
    ) -> Waiter:
        """Wait in ``q`` until woken for a free slot (with ``prefer``, for that replica's
        until the hold ends); a ``Refusal`` when the queue is full (429 ``queue_full``)
        or the wait is over (503 ``queue_timeout``)."""
        trace, metrics = call.trace, self.state.metrics
        now = time.monotonic()
        if again is None:
            bound = self.settings.queue_max_wait_s
            if call.queue_wait_s is not None:
                bound = min(bound, call.queue_wait_s)
            w = Waiter(trace.client, trace.priority_class, call.share, now, now + bound)
        else:
            w = again  # woken, but the slot went (a replica left): back at its line's head
        w.prefer = None if prefer is None else prefer.key
        # At most queue_starvation: a starved waiter is never a holder (no starvation).
        w.hold_until = now + min(self.settings.queue_hold_s, self.settings.queue_starvation_s)
        loop = asyncio.get_running_loop()
        w.ticket = loop.create_future()
        queued, evicted = q.push(w, front=again is not None)
        if evicted is not None and not evicted.ticket.done():
            # (Done: its client left, and cancelling its task cancelled the future at
            # once; its clean-up runs at the loop's next turn. Setting an exception on
            # it raised InvalidStateError here: the newcomer was answered 500.)
            evicted.ticket.set_exception(_queue_full(m.name, q, evicted.klass))
        if not queued:
            raise _queue_full(m.name, q, w.klass)
        gauge = metrics.queue_length.labels(m.name, w.klass)
        gauge.inc()
        if again is None:
            log.info(
                "gateway.queued",
                request_id=trace.request_id,
                model=m.name,
                priority=w.klass,
                length=q.length,
                holds_for=w.prefer,
            )
        self.pump(m.name)
        woken = False
        try:
            if w.prefer is not None and w.hold_until < w.deadline:
                await self._held(call, m, q, w)
            if w.ticket.done():
                w.ticket.result()  # (granted; a displaced waiter's refusal raised)
            else:
                async with asyncio.timeout(w.deadline - time.monotonic()):
                    await w.ticket
            woken = True
        except TimeoutError:
            trace.outcome = "unavailable"
            raise Refusal(
                503,
                f"model {m.name!r} is full: every ready replica's slots are busy and this "
                f"request waited {time.monotonic() - w.enqueued:.1f}s in its queue (position "
                f"among {q.length}, class {w.klass!r}); retry later, or lower its class "
                "(x-llmgw-priority-class: batch) to leave room for others",
                param="model",
                code="queue_timeout",
                type="service_unavailable",
                retry_after=_retry_after(q),
            ) from None
        finally:
            gauge.dec()
            if not woken and not q.remove(w) and _granted(w.ticket):
                # Woken for a slot and gone before taking it (the client left): it is
                # someone else's now.
                q.taken(w)
                self.pump(m.name)
        slot = w.slot
        q.taken(w)
        w.slot = slot  # (for _gate: the replica whose slot it was granted)
        waited = time.monotonic() - w.enqueued
        trace.queued_s = waited
        metrics.queue_wait.labels(m.name, w.klass).observe(waited)
        return w

    async def _held(self, call: Call, m: ModelEntry, q: ModelQueue, w: Waiter) -> None:
        """A holder's wait for its replica's slot, until its hold ends; then it stays
        in line for any slot (a new ticket), and the queue is pumped for it."""
        try:
            async with asyncio.timeout(w.hold_until - time.monotonic()):
                await w.ticket
        except TimeoutError:
            ticket = w.ticket
            if _granted(ticket):
                return
            if ticket.done() and not ticket.cancelled():
                exc = ticket.exception()
                assert exc is not None
                raise exc from None  # (displaced by a higher class: queue_full)
            replica = w.prefer
            if q.release(w):
                log.info(
                    "gateway.hold_expired",
                    request_id=call.trace.request_id,
                    model=m.name,
                    replica=replica,
                )
            w.ticket = asyncio.get_running_loop().create_future()
            self.pump(m.name)

    def pump_all(self) -> None:
        for model in list(self.state.queues):
            self.pump(model)

    def pump(self, model: str) -> None:
        """Wake the model's next waiters, one per free slot not yet promised."""
        q = self.state.queues.get(model)
        if q is None:
            return
        if not q.length:
            if not q.granted:
                q.forget_idle()
            return
        loads, now = self.state.loads, time.monotonic()
        ready = eligible(self.state.table.ready.get(model, ()), loads, now)
        if not q.reserved and not any(h.holding for h in q.holds.values()):
            free = free_slots(ready, loads, self.state.dealt)
            while q.length and free > q.granted:
                w = q.pop(now)
                if w is None or w.ticket is None or w.ticket.done():
                    continue
                q.granted += 1
                w.ticket.set_result(None)
            return
        # Some wait for one replica's slot (holds): per replica, the free slots not
        # reserved; the waiters granted any slot take those too, so a grant needs one
        # more unreserved free slot than there are such grants outstanding.
        room = rooms(ready, loads, self.state.dealt, q.reserved)
        spare = sum(room.values()) - (q.granted - sum(q.reserved.values()))
        while q.length and spare > 0:
            w = q.pop(now, room)
            if w is None:
                break  # only holders of full replicas wait
            if w.ticket is None or w.ticket.done():
                if w.slot is not None:  # (gone: its reservation undone)
                    room[w.slot] += 1
                    q.granted += 1
                    q.taken(w)
                continue
            q.granted += 1
            spare -= 1
            w.ticket.set_result(None)

    def _check(self, model: str, ticket: prefix.Ticket, trace: Trace) -> None:
        """A prefix guess against the engine's own count, when it gave one."""
        if trace.status >= 400 or trace.cached_tokens is None:
            return
        predicted = self.state.prefix.check(ticket, trace.prompt_tokens, trace.cached_tokens)
        if predicted:
            self.state.metrics.prefix_predicted(model).inc(predicted)

    async def _body(self, body: dict[str, Any], raw: bytes, name: str, stream: bool) -> bytes:
        """The body with ``model`` set to the catalog name the engine serves it by, and
        a stream's usage asked for (gateway.usage)."""
        ask = stream and not usage.asked(body)
        if body.get("model") == name:
            if not ask:
                return raw
            spliced = usage.ask(body, raw)
            if spliced is not None:
                return spliced
        rewritten = {**body, "model": name}
        if ask:
            options = body.get("stream_options")
            rewritten["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        if len(raw) > INLINE_JSON:
            return await asyncio.to_thread(_dumps, rewritten)
        return _dumps(rewritten)

    async def _send(self, call: Call, m: ModelEntry, replica: Replica) -> None:
        state, req, trace = self.state, call.req, call.trace
        data = await self._body(call.body, call.raw, m.name, req.stream)
        load = state.load(replica.key)
        before = load.inflight
        load.inflight += 1
        trace.attempts += 1
        sent_at = time.monotonic()
        picked(load, sent_at)
        state.windows.sent(m.name, replica.key, sent_at, sent_at - trace.started)
        resp: Answer | None = None
        try:
            # The whole exchange is bounded (``max_answer_time``): the read timeout
            # bounds a silence, not an engine that trickles its answer for ever.
            async with asyncio.timeout(self.settings.max_answer_s):
                resp = await self.upstream.open(
                    replica.endpoint + ROUTES[req.kind],
                    data,
                    replica.auth,
                    replica.auth_note,
                    replica.auth_previous,
                )
                if req.stream and resp.status == 200:
                    await self._stream(call, resp, m, replica, sent_at=sent_at, before=before)
                else:
                    await self._whole(call, resp, m, replica, sent_at=sent_at, before=before)
            state.aside.answered(replica.key, load)
        except TimeoutError:
            took = f"{self.settings.max_answer_s:g} s ([gateway] max_answer_time)"
            if not trace.bytes_sent:
                raise Unreachable(f"no answer within {took}") from None
            # Sent in part: no retry. A stream ends with an error event; a whole
            # answer is left short, which closes the client's connection.
            await self._cut(call, replica, "answer_timeout", f"did not finish within {took}")
            if req.stream and trace.status == 200 and not trace.finished:
                trace.finished = True
                await call.send({"type": "http.response.body", "body": b""})
        finally:
            # Before anything reads the counts (the queue's clock, the settlement, the
            # ledger, the metrics, the log line): held to what the request could use.
            self._plausible(call, m, replica)
            load.inflight -= 1
            if state.queues:
                self.pump(m.name)
            state.windows.replied(m.name, replica.key, time.monotonic())
            if resp is not None and not resp.closed:
                # A complete answer's connection goes back to the pool; an interrupted
                # one (a client gone, an error) is closed, which stops the engine's work.
                if resp.complete:
                    resp.release()
                else:
                    resp.close()

    def _plausible(self, call: Call, m: ModelEntry, replica: Replica) -> None:
        """The request's token counts (the engine's usage, else what was counted) held to
        what it could have used (gateway.stages.plausible). An engine's figure held (its
        usage; without it, a prompt count: its /tokenize or timings) is logged
        ``gateway.usage_implausible`` and counted; the gateway's own count of a stream's
        events past ``max_tokens`` (an estimate: an event is not always a token) is held
        without a word."""
        trace = call.trace
        found = trace.usage
        if found is not None:
            reported = found
        elif trace.prompt_tokens is None and trace.completion_tokens is None:
            return
        else:
            reported = Usage(trace.prompt_tokens or 0, 0, trace.completion_tokens or 0)
        # (The common answer is within its bounds at a glance: 1.3 us against 3.9 for
        # making them, measured under load.)
        if plausible.surely(
            call.req,
            len(call.raw),
            m,
            replica,
            prompt=reported.prompt,
            completion=reported.completion,
        ):
            return
        most = plausible.most(call.req, call.body, len(call.raw), m, replica)
        if reported.prompt <= most.prompt and reported.completion <= most.completion:
            return
        charged = Usage(*plausible.held(*reported, most))
        if found is not None:
            trace.usage = charged
        if trace.prompt_tokens is not None:
            trace.prompt_tokens = min(trace.prompt_tokens, most.prompt)
        if trace.completion_tokens is not None:
            trace.completion_tokens = min(trace.completion_tokens, most.completion)
        if trace.cached_tokens is not None:
            trace.cached_tokens = min(trace.cached_tokens, charged.prompt)
        if found is None and reported.prompt <= most.prompt:
            return
        self.state.metrics.implausible(m.name).inc()
        log.warning(
            "gateway.usage_implausible",
            request_id=trace.request_id,
            client=trace.client,
            model=m.name,
            replica=replica.key,
            source="usage" if found is not None else "counted",
            reported_prompt=reported.prompt,
            reported_completion=reported.completion,
            charged_prompt=charged.prompt,
            charged_completion=charged.completion,
            most_prompt=most.prompt,
            most_completion=most.completion,
        )

    def _head(self, call: Call, m: ModelEntry, replica: Replica) -> bytes:
        """The gateway's own headers of an answer, as header lines: names it knows, a
        model name and replica key of the catalog's grammar (no space, no control
        character), numbers and its own request id; written unchecked
        (``RequestHooks.start``). The engine's (``content-type``) go as headers."""
        trace = call.trace
        now = time.monotonic()
        overhead = (now - trace.started - trace.upstream_s - trace.waited_s) * 1e3
        head = OWN_HEAD % (
            m.name.encode(),
            replica.key.encode(),
            max(overhead, 0.0),
            trace.request_id.encode(),
        )
        if trace.limits is not NO_LIMITS:
            head += self.state.quotas.head(trace.client, trace.limits, m.name, now)
        return head

    @staticmethod
    async def _start(call: Call, status: int, headers: list[tuple[bytes, bytes]], head: bytes
                     ) -> None:  # fmt: skip
        """The answer's start: ``headers`` (checked by the server) and ``head`` (the
        gateway's own, ``_head``)."""
        message = {"type": "http.response.start", "status": status, "headers": headers}
        if call.hooks is not None:
            await call.hooks.start(call.send, message, head)
        else:
            headers += pairs(head)
            await call.send(message)

    @staticmethod
    async def _broken(call: Call, replica: Replica, exc: BrokenAnswer) -> None:
        """A stream the engine broke off: ended with one error event."""
        trace = call.trace
        trace.outcome = "failed"
        log.warning(
            "gateway.stream_broken",
            request_id=trace.request_id,
            replica=replica.key,
            error=f"{exc!r:.120}",
        )
        error = {
            "error": {
                "message": f"the replica {replica.key} stopped in the middle of the "
                "answer; the text so far is incomplete. Retry the request.",
                "type": "upstream_error",
                "param": None,
                "code": "stream_interrupted",
            }
        }
        await call.send(
            {
                "type": "http.response.body",
                "body": b"data: " + _dumps(error) + b"\n\n",
                "more_body": True,
            }
        )

    async def _within_bounds(
        self, call: Call, replica: Replica, tally: _Tally, chunk: bytes, limit: int
    ) -> bool:
        """Whether a stream's next piece may be passed on (counted if so); if not, the
        stream is ended: over ``limit`` bytes in all, or not SSE (its well-formed
        lines before the first that is not are passed on)."""
        if tally.size + len(chunk) > limit:
            await self._cut(call, replica, "answer_too_large", _over(limit))
            return False
        # (A piece the relay judged and the client could not take then is not judged
        # twice: the framing's state has moved past it.)
        bad = -1 if chunk is tally.judged else tally.framing.check(chunk)
        if bad >= 0:
            # (What the usage cut held of an open event goes first.)
            body = tally.usage.rest() + chunk[:bad]
            if body:
                await call.send({"type": "http.response.body", "body": body, "more_body": True})
            await self._cut(
                call, replica, "malformed_stream", "is not server-sent events past this point"
            )
            return False
        tally.size += len(chunk)
        return True

    async def _cut(self, call: Call, replica: Replica, code: str, why: str) -> None:
        """End an answer begun but not finished: a stream with one error event (after
        a blank line, which ends any event the engine left open), a whole answer short
        of its end (the client's connection closes: it sees a failure)."""
        trace = call.trace
        trace.outcome = "failed"
        log.warning(
            "gateway.answer_cut", request_id=trace.request_id, replica=replica.key, reason=code
        )
        if not call.req.stream or trace.status != 200:
            return
        error = {
            "error": {
                "message": f"the replica {replica.key}'s answer {why}; the text so far is "
                "incomplete",
                "type": "upstream_error",
                "param": None,
                "code": code,
            }
        }
        await call.send(
            {
                "type": "http.response.body",
                "body": b"\ndata: " + _dumps(error) + b"\n\n",
                "more_body": True,
            }
        )

    async def _whole(
        self,
        call: Call,
        resp: Answer,
        m: ModelEntry,
        replica: Replica,
        *,
        sent_at: float,
        before: int,
    ) -> None:
        """A whole answer: held until complete (so a break before its end can still be
        retried elsewhere, unseen), up to ``HOLD_BYTES``; a larger one (a big embeddings
        batch, a hostile engine) is passed on as it comes, so no answer makes the
        gateway hold more than that."""
        send, trace = call.send, call.trace
        held: list[bytes] = []
        size, complete = 0, True
        limit = self.settings.max_answer_bytes
        chunks = resp.chunks()
        try:
            async for chunk in chunks:
                held.append(chunk)
                size += len(chunk)
                if size > HOLD_BYTES or size > limit:
                    complete = False
                    break
        except BrokenAnswer as exc:
            raise Unreachable(f"the answer broke off ({exc})") from None
        if size > limit:  # (a bound below HOLD_BYTES) nothing sent: refused whole
            raise Refusal(
                502,
                f"model {m.name!r}: the replica's answer {_over(limit)}",
                code="answer_too_large",
                type="upstream_error",
            )
        trace.upstream_s = time.monotonic() - sent_at
        payload = b"".join(held)
        del held
        if resp.status < 400:
            trace.ttft_s = trace.upstream_s
            observe_ttft(self.state.load(replica.key), trace.ttft_s, before)
        head = self._head(call, m, replica)
        headers = [
            (
                b"content-type",
                resp.headers.get("content-type", "application/json").encode("latin-1"),
            )
        ]
        declared = resp.headers.get("content-length")
        if complete:
            headers.append((b"content-length", str(len(payload)).encode()))
        elif declared is not None and declared.isdigit():
            headers.append((b"content-length", declared.encode()))
        # (else no length: uvicorn sends it chunked)
        trace.served, trace.replica, trace.status = m.name, replica.key, resp.status
        trace.bytes_sent = True
        await self._start(call, resp.status, headers, head)
        if complete:
            await send({"type": "http.response.body", "body": payload})
            self._usage(trace, payload, resp.status)
            return
        await send({"type": "http.response.body", "body": payload, "more_body": True})
        tail = payload[-USAGE_TAIL:]
        del payload
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    await self._cut(call, replica, "answer_too_large", _over(limit))
                    return
                tail = (tail + chunk)[-USAGE_TAIL:]
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except BrokenAnswer as exc:
            # Bytes were sent: no retry, and no way to say so inside a JSON body. The
            # answer is left incomplete, which closes the client's connection (a short
            # body for its length, or an unended chunked one): the client sees a failure.
            trace.outcome = "failed"
            log.warning(
                "gateway.answer_broken",
                request_id=trace.request_id,
                replica=replica.key,
                error=f"{exc}"[:120],
            )
            return
        self._usage(trace, tail, resp.status)
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    def _usage(trace: Trace, payload: bytes, status: int) -> None:
        """The engine's own token counts, from its answer's ``usage``."""
        if status >= 400:
            return
        found = usage.parse(payload)
        trace.usage = found
        trace.completion_tokens = found.completion if found else None
        if found:
            trace.prompt_tokens = found.prompt
        if payload.find(b"cache") >= 0:  # (find, not `in`: gateway.usage says why)
            cached = _CACHED_TOKENS.search(payload)
            if cached:
                trace.cached_tokens = int(cached.group(1))

    async def _stream(
        self,
        call: Call,
        resp: Answer,
        m: ModelEntry,
        replica: Replica,
        *,
        sent_at: float,
        before: int,
    ) -> None:
        send, trace = call.send, call.trace
        held = bytearray()
        scanner = _FirstContent()
        try:
            while (chunk := await resp.piece()) is not None:
                held += chunk
                if scanner.seen(held) or len(held) > HOLD_BYTES:
                    break
        except BrokenAnswer as exc:
            raise Unreachable(f"the stream broke off before its first token ({exc})") from None
        # Nothing sent yet: a stream that is not SSE from its start is a failure
        # before the first byte (retried elsewhere), not garbage passed on.
        framing = sse.Framing()
        if framing.check(bytes(held)) >= 0:
            raise Unreachable("the stream is not server-sent events")
        first = time.monotonic()
        trace.upstream_s = first - sent_at
        trace.ttft_s = trace.upstream_s
        observe_ttft(self.state.load(replica.key), trace.ttft_s, before)
        head = self._head(call, m, replica) + STREAM_HEAD
        headers: list[tuple[bytes, bytes]] = []
        trace.served, trace.replica, trace.status = m.name, replica.key, 200
        trace.bytes_sent = True
        # Cut at event ends: the usage event the gateway asked for is taken out again
        # unless the client asked for it too (gateway.usage).
        cutter = usage.Events(strip=not usage.asked(call.body))
        await self._start(call, 200, headers, head)
        body = cutter.take(bytes(held))
        await send({"type": "http.response.body", "body": body, "more_body": True})
        # Events after the first content one (a fast engine's may have come with it).
        tally = _Tally(bytes(held[scanner.offset :]), first, framing, len(held), cutter)
        trace.complete = tally.ended
        del held
        limit = self.settings.max_answer_bytes
        sink = None if call.hooks is None else _relay(call.hooks.write_body, tally, trace, limit)
        try:
            while True:
                if sink is not None:
                    # As the events come, from the engine connection's read callback
                    # straight to the client's (``Answer.relay``,
                    # ``RequestHooks.write_body``): no task woken per event. It stops at
                    # the end, at a break, at a piece the client cannot take now (not
                    # reading: ``send`` below waits for it, then the relay goes on), or
                    # at one that breaks a bound (judged again below).
                    await resp.relay(sink, call.hooks.flush if call.hooks else None)
                chunk = await resp.piece()
                if chunk is None:
                    break
                if not await self._within_bounds(call, replica, tally, chunk, limit):
                    break
                out = tally.passed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                # The client has the whole answer: one that hangs up now (the SDKs stop
                # at [DONE]) did not cancel anything.
                trace.complete = tally.ended
        except BrokenAnswer as exc:
            await self._broken(call, replica, exc)
        finally:
            tally.count(trace, first)  # however the stream ended (a client gone included)
        await _end(call, cutter)


async def _end(call: Call, cutter: usage.Events) -> None:
    """A stream's last message: what the usage cut held of an event the engine left
    open at its end first (passed on as it is; not after an error event)."""
    rest = cutter.rest()
    if rest and call.trace.outcome != "failed":
        await call.send({"type": "http.response.body", "body": rest, "more_body": True})
    call.trace.finished = True
    await call.send({"type": "http.response.body", "body": b""})


class _Tally:
    """What a stream's events after its first content one say: how many there were,
    whether ``[DONE]`` came, and when the last piece did (the engine's own counts are
    ``usage``'s: ``gateway.usage.Events``, which also cuts the pieces at event ends); and
    the stream's bounds: its size so far and its framing."""

    __slots__ = (
        "cached",
        "ended",
        "events",
        "framing",
        "judged",
        "last",
        "prompt",
        "size",
        "usage",
    )

    def __init__(
        self, rest: bytes, first: float, framing: sse.Framing, size: int, cutter: usage.Events
    ) -> None:
        self.usage = cutter
        self.events = 0
        # What the engine reused (the prefix router's check), from a usage or timings.
        self.prompt: int | None = None
        self.cached: int | None = None
        self.ended = False
        self.last = first
        self.framing = framing
        self.size = size  # bytes passed on
        # A piece whose framing was judged (the state moved past it) but not passed on.
        self.judged: bytes | None = None
        if rest:
            self.take(rest)
            self.last = first

    def count(self, trace: Trace, first: float) -> None:
        """The stream's tokens and time per token, into ``trace``.

        The engine's own counts when it gave its usage; else, tokens after the first:
        the events after it, less the final chunk (its finish_reason) and [DONE] when
        the answer ended (an estimate: an engine may put two tokens in one event). The
        usage event, when there was one, is not a token."""
        tokens = max(self.events - 2, 0) if self.ended else self.events
        counted = trace.usage = self.usage.usage
        if counted is not None:
            tokens = max(tokens - 1, 0)
            trace.completion_tokens = counted.completion
            trace.prompt_tokens = counted.prompt
        else:
            trace.completion_tokens = tokens + 1
        if counted is None and self.prompt is not None:
            trace.prompt_tokens = self.prompt
        trace.cached_tokens = self.cached
        if tokens > 0:
            trace.tpot_s = (self.last - first) / tokens

    def passed(self, chunk: bytes) -> bytes:
        """``chunk`` counted; what of it to pass on now (``usage.Events.take``)."""
        self.take(chunk)
        return self.usage.take(chunk)

    def take(self, chunk: bytes) -> None:
        self.events += chunk.count(b"data:")
        # Only the final chunk says what the engine reused (llama.cpp: timings): one scan
        # in C of each piece for "cache" (both names have it), and a parse of none.
        # (``find``, not ``in``: gateway.usage says why.)
        if chunk.find(b"cache") >= 0:
            found = _CACHED_TOKENS.search(chunk)
            if found:
                self.cached = int(found.group(1))
                computed = _PROMPT_N.search(chunk)
                if computed:
                    self.prompt = self.cached + int(computed.group(1))
        self.ended = self.ended or chunk.find(b"[DONE]") >= 0
        self.last = time.monotonic()


def _relay(
    write: Callable[[bytes], bool], tally: _Tally, trace: Trace, limit: int
) -> Callable[[bytes], bool]:
    """The sink of ``Answer.relay``: a piece written to the client, counted; False
    (nothing written) when the client cannot take it now, or when it would break a
    bound (over ``limit`` bytes in all, not SSE): the caller judges it again and ends
    the stream. It runs in the engine connection's parser and must not raise: a
    failure is a refusal, and the piece goes through ``send``."""
    check = tally.framing.check
    cutter = tally.usage

    def sink(chunk: bytes) -> bool:
        size = tally.size + len(chunk)
        if size > limit or check(chunk) >= 0:
            return False
        try:
            if cutter.pending or not chunk.endswith(b"\n\n") or chunk.find(b'"usage"') >= 0:
                out, held, found = cutter.peek(chunk)
            else:
                # (``Events.peek``'s first case, inline: nearly every piece, one call less.)
                out, held, found = chunk, b"", None
            if out and not write(out):
                tally.judged = chunk
                return False
        except Exception:
            tally.judged = chunk
            return False
        if held or found is not None or cutter.pending:  # (else nothing to take)
            cutter.commit(held, found)
        tally.size = size
        tally.take(chunk)
        # The client has the whole answer: one that hangs up now (the SDKs stop at
        # [DONE]) did not cancel anything.
        trace.complete = tally.ended
        return True

    return sink


class _FirstContent:
    """Finds the first server-sent event that carries content (or the end)."""

    def __init__(self) -> None:
        self.offset = 0
        # How far the held bytes were searched for an event's end, found in none: the
        # next search starts there (less the 3 bytes an end may straddle). Searched from
        # the event's start on every piece, an engine dribbling a first event that never
        # ends, 16 bytes a piece up to HOLD_BYTES, cost 46 s of the event loop's CPU.
        self.scanned = 0

    def seen(self, buf: bytearray) -> bool:
        while True:
            start = max(self.offset, self.scanned - 3)
            end = buf.find(b"\n\n", start)
            if end < 0:
                # An engine may end events with \r\n\r\n.
                end = buf.find(b"\r\n\r\n", start)
                if end < 0:
                    self.scanned = len(buf)
                    return False
            event = bytes(buf[self.offset : end])
            self.offset = end + 2
            for line in event.splitlines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]" or _has_content(payload):
                    return True


_decode = msgspec.json.Decoder().decode


def _has_content(payload: bytes) -> bool:
    try:
        # msgspec: a third of json.loads' time for an event; what it refuses (NaN, a
        # lone surrogate escape) json.loads judges, as before.
        data = _decode(payload)
    except (msgspec.DecodeError, RecursionError):
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError):
            return True  # not ours to judge: pass it on
    if not isinstance(data, dict):
        return True
    if "error" in data:
        return True
    for choice in data.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("text") or choice.get("finish_reason"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("tool_calls") or delta.get("function_call")
        ):
            return True
    return False


def _over(limit: int) -> str:
    return f"is over {limit} bytes ([gateway] max_answer_mb)"


def _granted(ticket: asyncio.Future[None]) -> bool:
    """Whether a waiter's future says it was woken for a slot."""
    return ticket.done() and not ticket.cancelled() and ticket.exception() is None


def _retry_after(q: ModelQueue) -> int:
    # Seconds: about how long the line ahead takes to clear, at one a second per waiter
    # a class, between 1 and 60 (the client's backoff takes it from there).
    return max(1, min(60, q.length // 4 + 1))


def _queue_full(model: str, q: ModelQueue, klass: str) -> Refusal:
    return Refusal(
        429,
        f"model {model!r} is full: every ready replica's slots are busy and its queue holds "
        f"{q.length} requests of class {klass!r} or above (at most {q.bounds.max_length}, "
        "[gateway] queue_max_length); retry after the Retry-After seconds",
        param="model",
        code="queue_full",
        type="rate_limit_error",
        retry_after=_retry_after(q),
    )


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )
