"""The gateway's live state: the routing table in force, the load view, the set-aside
replicas, the recent choices (for ``GET /routing``), the client tokens and the signal
windows. One per process, touched only on its event loop (no locks)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import structlog

from catalog.definition.routing_profiles import PREFIX, SESSION
from catalog.forms.client_limits import NO_LIMITS, ClientLimits
from catalog.forms.priority import STANDARD
from gateway.metrics import Metrics
from gateway.stages.borrow import Reading, lend
from gateway.stages.ledger import Ledger
from gateway.stages.prefix import PrefixTable, Stats
from gateway.stages.queue import Holds, ModelQueue
from gateway.stages.quota import Quotas
from gateway.stages.routing import Choice, Load, joined, predicted_ttft, ramp
from gateway.stages.setaside import SetAside
from gateway.stages.slotshare import Members, deal
from gateway.table import Table
from gateway.windows import Windows

log = structlog.get_logger("gateway")

RECENT = 20


class Recent(NamedTuple):
    """One routing choice, as ``GET /routing`` shows it (made into text only then)."""

    at: float  # time.time()
    replica: str | None  # None: not sent there
    choice: Choice
    note: str = ""

    def view(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "replica": self.replica,
            "reason": self.choice.reason + self.note,
        }


@dataclass(frozen=True, slots=True)
class Client:
    """A client token: its name (logged), the models it may use (None: all), its
    limits (gateway.stages.quota enforces them) and where it stands in a full model's
    queue (its priority class and share)."""

    name: str
    models: tuple[str, ...] | None
    limits: ClientLimits = NO_LIMITS
    priority_class: str = STANDARD
    share: float = 1.0


class State:
    def __init__(
        self, gateway_id: str, metrics: Metrics | None = None, slow_start_s: float = 0.0
    ) -> None:
        self.gateway_id = gateway_id
        # A replica that joins a model already served ramps up over this (0: at once).
        self.slow_start_s = slow_start_s
        self.metrics = metrics or Metrics()
        self.table = Table()
        self.loads: dict[str, Load] = {}
        self.aside = SetAside()
        # The prefix profile's table: the prompt blocks sent to each replica recently.
        self.prefix = PrefixTable()
        self.recent: dict[str, deque[Recent]] = {}
        self.windows = Windows(time.monotonic(), time.time())
        # sha256 -> client; replaced whole by the follower.
        self.clients: dict[str, Client] = {}
        # What the limited client tokens' limits count (gateway.stages.quota).
        self.quotas = Quotas()
        # Awaited with each new set of client tokens before it is taken: draws ahead
        # for limited tokens new here (gateway.allowance).
        self.prepare: Callable[[dict[str, Client]], Awaitable[None]] | None = None
        # Every finished request's usage until the next flush (gateway.ledger).
        self.ledger = Ledger()
        # sha256 -> name of the cluster's operator and reader tokens: who may read
        # /metrics and /routing. Replaced whole by the follower.
        self.readers: dict[str, str] = {}
        self.synced = False  # a table was read at least once
        self.reachable = False
        self.last_sync = 0.0  # monotonic
        self.last_error = ""
        self.changed = asyncio.Event()  # set (and replaced) on each new table
        self.wake_signals = asyncio.Event()  # a request started waiting: post now
        # model -> its queue, made when a request first waits for a full model's slot.
        self.queues: dict[str, ModelQueue] = {}
        # Called after each new table is installed (the proxy wakes its queues' waiters).
        self.installed: list[Callable[[], None]] = []
        # What replicas' engines said of their slots on /props, by (replica key,
        # endpoint): gateway.engineslots fills it, the follower builds tables with it.
        self.engine_slots: dict[tuple[str, str], int] = {}
        # The live gateway processes and this one's place among them (the control plane
        # answers each signals post with them: gateway.signals), the fixed share when
        # the operator set one, and what they deal this process: replica key -> the
        # requests it may have in flight there (gateway.stages.slotshare).
        self.members = Members()
        self.slot_share: float | None = None
        self.workers = 1
        self.deal: dict[str, int] = {}
        # The engines' own counts, the last readings of each replica, less this
        # process's requests (gateway.engineload), and the limits in force: the deal, or
        # more where those readings left slots idle (gateway.stages.borrow).
        self.readings: dict[str, tuple[Reading, ...]] = {}
        self.dealt: dict[str, int] = {}

    def install(self, table: Table) -> None:
        """A new table: requests from now on route by it; waiters are woken. A replica
        new to a model already served enters at the current turn, slow-started
        (``routing.joined``)."""
        before = self.table.ready
        self.table = table
        now = time.monotonic()
        for model, replicas in table.ready.items():
            known = {r.key for r in before.get(model, ())}
            new = [r for r in replicas if r.key not in known]
            if not known or not new:
                continue  # nothing joined, or the model's first replicas (nobody to spare)
            peers = [(self.load(r.key), r.weight) for r in replicas if r.key in known]
            for r in new:
                joined(self.load(r.key), peers, r.weight, now, self.slow_start_s)
        live = {r.key for rs in table.ready.values() for r in rs}
        for key in list(self.loads):
            if key not in live and self.loads[key].inflight == 0:
                del self.loads[key]
        self.prefix.retain(live)
        for key in [k for k in self.readings if k not in live]:
            del self.readings[key]
        self.redeal()
        for q in self.queues.values():
            q.retain(live)
        for model in table.models:
            self.metrics.ready_replicas.labels(model).set(len(table.ready.get(model, ())))
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()
        for hook in self.installed:
            hook()

    def join(self, members: Members) -> None:
        """The live gateways changed: deal again, and wake the waiters (a deal may grow)."""
        if members == self.members:
            return
        self.members = members
        self.redeal()
        log.info("gateway.members", gateways=members.count, index=members.index)
        for hook in self.installed:
            hook()

    def redeal(self) -> None:
        """The deal of the table in force among the members, and the limits in force."""
        self.deal = deal(self.table.ready, self.members, self.slot_share, self.workers)
        self.relend(time.monotonic())

    def relend(self, now: float) -> bool:
        """The limits in force from the deal and the readings; whether one rose (the
        waiters may take it)."""
        before = self.dealt
        replicas = {r.key: r for rs in self.table.ready.values() for r in rs}
        self.dealt = lend(self.deal, replicas, self.readings, now)
        return any(v > before.get(k, 0) for k, v in self.dealt.items())

    def load(self, key: str) -> Load:
        found = self.loads.get(key)
        if found is None:
            found = self.loads[key] = Load()
        return found

    def remember(self, model: str, choice: Recent) -> None:
        q = self.recent.get(model)
        if q is None:
            q = self.recent[model] = deque(maxlen=RECENT)
        q.append(choice)

    def allowed(self, client: Client) -> frozenset[str] | None:
        """The canonical names a client may use, under the table in force."""
        if client.models is None:
            return None
        index = self.table.index
        return frozenset(index[m] for m in client.models if m in index)

    def routing(self, now: float) -> dict[str, Any]:
        """``GET /routing``: per model, its replicas' state and the recent choices."""
        models: dict[str, Any] = {}
        for name, entry in self.table.models.items():
            replicas: list[dict[str, Any]] = []
            queue = self.queues.get(name)
            for r in self.table.ready.get(name, ()):
                load = self.loads.get(r.key, Load())
                aside = load.set_aside_until > now
                replicas.append(
                    {
                        "replica": r.key,
                        "endpoint": r.endpoint,
                        "health": "set-aside" if aside else "ready",
                        "set_aside_for_s": round(load.set_aside_until - now, 3) if aside else None,
                        "failures": self.aside.count(r.key),
                        "inflight": load.inflight,
                        "slots": r.slots or None,
                        # This process's deal of them (gateway.stages.slotshare), and
                        # the idle ones of others' it may fill now (gateway.stages.borrow).
                        "slots_dealt": self.deal.get(r.key),
                        "slots_borrowable": (
                            self.dealt[r.key] - self.deal[r.key] if r.key in self.deal else None
                        ),
                        "slots_source": r.slots_source or None,
                        "weight": r.weight,
                        "effective_context_length": r.context,
                        "context_detail": r.context_detail,
                        "picks": load.picks,
                        # Slow start: the share of its weight it has now, while < 1.
                        "slow_start": round(ramp(load, now), 3) if now < load.warm_until else None,
                        "predicted_ttft_s": round(predicted_ttft(load), 4)
                        if load.measured
                        else None,
                    }
                )
                if entry.routing_profile == PREFIX:
                    replicas[-1]["prefix"] = self.prefix_view(r.key)
                if queue is not None and entry.routing_profile in (PREFIX, SESSION):
                    # Requests that waited for this replica's slot (chosen for its
                    # cache) against those that took another's (gateway.stages.queue).
                    replicas[-1]["slot_hold"] = queue.holds.get(r.key, Holds()).view()
            models[name] = {
                "routing_profile": entry.routing_profile,
                "fallbacks": list(entry.fallbacks),
                "starting": self.table.coming.get(name, 0),
                "replicas": replicas,
                "recent": [r.view() for r in self.recent.get(name, ())],
                "queue": self.queues[name].snapshot(now) if name in self.queues else None,
            }
        return {
            "gateway": self.gateway_id,
            # The live gateway processes dealing the slots, and this one's place.
            "gateways": self.members.view(),
            "control_plane": self.health(now),
            "models": models,
        }

    def prefix_view(self, replica: str) -> dict[str, Any]:
        """A replica's prefix guesses against its engine's counts, and its table's size."""
        stats = self.prefix.stats.get(replica)
        return {
            "blocks": self.prefix.blocks(replica),
            **(stats or Stats()).view(),
        }

    def health(self, now: float) -> dict[str, Any]:
        age = round(now - self.last_sync, 3) if self.synced else None
        return {
            "reachable": self.reachable,
            "table_age_s": age,
            "last_error": self.last_error or None,
        }
