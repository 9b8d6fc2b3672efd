"""The routing profiles, as pure functions of (the candidates, their load, the request).

``choose`` picks one of a model's ready replicas and says why, so ``GET /routing`` can
explain a choice and a test can check one without sockets. The load view
(``Load``, one per replica) is kept by the edge: it counts in-flight requests, picks
and measured times, and this module only reads it.

- ``least-loaded`` (the default): fewest in-flight requests per unit of weight; ties go
  to the replica picked least per unit of weight, so an idle model still spreads.
- ``round-robin``: in turn, in proportion to weight (the replica with the fewest picks
  per unit of weight, which for equal weights is strict turns).
- ``session``: rendezvous hashing of a stable key (weighted): the key sticks to one
  replica and moves only when that replica leaves, for the engines' prefix caches.
  Without a key, least-loaded.
- ``latency``: the lowest predicted time to first token, from the replica's queue (its
  in-flight requests) and its measured seconds per queued request; a replica not yet
  measured is predicted 0 so that it gets measured. ``meets_slo`` says whether the
  choice is predicted within the model's ``slo.ttft_p99``: when it is not, the edge
  tries the model's fallbacks before sending.
- ``prefix``: where the prompt's longest prefix was sent recently, unless that replica
  is loaded; an unseen prefix by a rendezvous hash of its first blocks
  (``gateway.stages.prefix``). Without a prompt to key on (token ids), least-loaded.

**Slow start** (as Envoy's): a replica that joins a model already served (a scale-up, a
replacement) enters at the current turn, not at zero picks, and its weight rises from
``SLOW_START_MIN`` of it to all of it over the gateway's ``slow_start`` window (linear,
Envoy's aggression 1). Without this a new replica had the fewest picks by far, won every
tie (least-loaded idle, round-robin) and took every request until its picks caught up,
all on a cold engine. A pick during the ramp counts 1/ramp turns (``picked``), so the
replica owes no burst of catch-up picks when it reaches full weight. The ``session``
profile is not ramped: moving keys while a weight rises would cost the prefix caches
more than the ramp saves. A model's first replicas (and all of them at a gateway's
start) are not ramped: there is nobody to spare them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from catalog.definition.routing_profiles import LATENCY, PREFIX, ROUND_ROBIN, SESSION
from gateway.stages import prefix as prefix_stage
from gateway.table import Replica, stable_hash

_MASK = (1 << 64) - 1
# The share of its weight a replica has when its slow start begins (Envoy's
# min_weight_percent default, 10%).
SLOW_START_MIN = 0.1


@dataclass(slots=True)
class Load:
    """What the gateway knows of one replica's load (mutated by the edge only)."""

    inflight: int = 0
    picks: int = 0
    # Picks in units of full weight (a pick during slow start counts 1/ramp), compared
    # per unit of weight: round-robin's turns and least-loaded's tie-break.
    turns: float = 0.0
    # Seconds to first token per queued request (TTFT / (in-flight when sent + 1)), EWMA.
    ttft_per_slot: float = 0.0
    measured: bool = False
    set_aside_until: float = 0.0
    # Slow start: the weight rises from warm_from to warm_until (monotonic seconds).
    warm_from: float = 0.0
    warm_until: float = 0.0


def ramp(load: Load, now: float) -> float:
    """The share of its weight a replica has at ``now`` (1 once warm)."""
    if now >= load.warm_until:
        return 1.0
    return max(SLOW_START_MIN, (now - load.warm_from) / (load.warm_until - load.warm_from))


def picked(load: Load, now: float) -> None:
    """A request was sent to the replica: one pick, 1/ramp turns."""
    load.picks += 1
    load.turns += 1.0 if now >= load.warm_until else 1.0 / ramp(load, now)


def joined(
    load: Load, peers: Sequence[tuple[Load, float]], weight: float, now: float, window_s: float
) -> None:
    """A replica joins a model served by ``peers`` (their loads and weights): it enters
    at the current turn (the least turns per unit of weight among them) and, with a
    ``window_s``, starts slow."""
    if not peers:
        return
    load.turns = min(p.turns / w for p, w in peers) * weight
    if window_s > 0:
        load.warm_from, load.warm_until = now, now + window_s


# Not frozen: a frozen dataclass is made by object.__setattr__ field by field, four
# times the instructions of a plain one, and one is made on every request.
@dataclass(slots=True)
class Choice:
    replica: Replica
    # Why, as text or as a function making it: the text is read only by ``GET /routing``
    # and refusals, so a choice made on every request formats it only when asked (a
    # float's formatting was a tenth of least-loaded's choice).
    why: str | Callable[[], str]
    predicted_ttft_s: float | None = None
    meets_slo: bool = True
    # prefix: the prompt's blocks guessed cached on the replica chosen
    prefix_blocks: int = 0
    # Chosen for what it holds (a session key's replica, the replica holding the
    # prompt's conversation): worth waiting for its slot when it is full
    # (gateway.stages.queue, ``holdable``). A choice by load or turn is not.
    sticky: bool = False

    @property
    def reason(self) -> str:
        why = self.why
        return why if isinstance(why, str) else why()


_IDLE = Load()


def _mix(x: int) -> int:
    # One round of a multiplicative hash: spreads the bits of (key ^ replica) over the
    # word (both are already blake2b hashes; this only breaks the xor's symmetry).
    x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15 & _MASK
    return x ^ (x >> 29)


def eligible(replicas: Sequence[Replica], loads: Mapping[str, Load], now: float) -> list[Replica]:
    """The replicas not set aside at ``now``."""
    return [r for r in replicas if loads.get(r.key, _IDLE).set_aside_until <= now]


def choose(
    profile: str,
    replicas: Sequence[Replica],
    loads: Mapping[str, Load],
    *,
    session: str | None = None,
    ttft_slo_s: float = 0.0,
    prompt: prefix_stage.Prompt | None = None,
    prefixes: prefix_stage.PrefixTable | None = None,
    now: float = 0.0,
) -> Choice | None:
    """One of ``replicas`` (already the eligible ones) by ``profile``; None when empty.

    ``now`` (monotonic): for the weight of a replica in its slow start."""
    if not replicas:
        return None
    if len(replicas) == 1 and profile not in (LATENCY, PREFIX):
        return Choice(replicas[0], _only(profile))
    if profile == ROUND_ROBIN:
        return _round_robin(replicas, loads, now)
    if profile == SESSION and session is not None:
        return _session(replicas, session)
    if profile == LATENCY:
        return _latency(replicas, loads, ttft_slo_s, now)
    if profile == PREFIX and prompt is not None and prefixes is not None:
        return _prefix(replicas, loads, prompt, prefixes, now)
    label = profile if profile != SESSION else "session (no key)"
    if profile == PREFIX:
        label = "prefix (no prompt text)"
    return _least_loaded(replicas, loads, label, now)


def _least_loaded(
    replicas: Sequence[Replica], loads: Mapping[str, Load], label: str, now: float
) -> Choice:
    best = replicas[0]
    best_score = (math.inf, math.inf)
    for r in replicas:
        load = loads.get(r.key, _IDLE)
        weight = r.weight if now >= load.warm_until else r.weight * ramp(load, now)
        score = (load.inflight / weight, load.turns / r.weight)
        if score < best_score:
            best, best_score = r, score
    inflight, n = best_score[0], len(replicas)
    return Choice(
        best, lambda: f"{label}: {inflight:.2g} in flight per unit of weight, lowest of {n}"
    )


def _prefix(
    replicas: Sequence[Replica],
    loads: Mapping[str, Load],
    prompt: prefix_stage.Prompt,
    prefixes: prefix_stage.PrefixTable,
    now: float,
) -> Choice:
    inflight = []
    for r in replicas:
        load = loads.get(r.key, _IDLE)
        # In flight per unit of weight, the weight ramped in slow start (as least-loaded).
        weight = r.weight if now >= load.warm_until else r.weight * ramp(load, now)
        inflight.append(load.inflight / weight)
    pick = prefix_stage.choose(replicas, inflight, prompt, prefixes)
    # (Positional: keywords cost a call more.)
    return Choice(pick.replica, pick, None, True, pick.matched, pick.longest and pick.matched > 0)


def _round_robin(replicas: Sequence[Replica], loads: Mapping[str, Load], now: float) -> Choice:
    best = replicas[0]
    best_score = math.inf
    for r in replicas:
        load = loads.get(r.key, _IDLE)
        # Where its next turn would put it (a pick during slow start costs 1/ramp).
        step = 1.0 if now >= load.warm_until else 1.0 / ramp(load, now)
        score = (load.turns + step) / r.weight
        if score < best_score:
            best, best_score = r, score
    n = len(replicas)
    return Choice(best, lambda: f"round-robin: its turn among {n} (by weight)")


def _session(replicas: Sequence[Replica], session: str) -> Choice:
    key = stable_hash(session)
    w0 = replicas[0].weight
    if all(r.weight == w0 for r in replicas):
        # Equal weights: the highest mixed hash wins (the log below would not change
        # the order), at a third of the cost.
        best = max(replicas, key=lambda r: _mix(key ^ r.hash))
    else:
        best = replicas[0]
        best_score = -math.inf
        for r in replicas:
            # Weighted rendezvous hashing: score = -weight / ln(u), u uniform in (0, 1).
            u = (_mix(key ^ r.hash) + 1) / (_MASK + 2)
            score = -r.weight / math.log(u)
            if score > best_score:
                best, best_score = r, score
    n = len(replicas)
    return Choice(best, lambda: f"session: key hashed to it among {n}", sticky=True)


_ONLY: dict[str, str] = {}


def _only(profile: str) -> str:
    found = _ONLY.get(profile)
    if found is None:
        if len(_ONLY) > 64:  # (profiles are the catalog's few; bounded all the same)
            _ONLY.clear()
        found = _ONLY[profile] = f"{profile}: the only eligible replica"
    return found


def predicted_ttft(load: Load) -> float:
    return load.ttft_per_slot * (load.inflight + 1) if load.measured else 0.0


def _latency(
    replicas: Sequence[Replica], loads: Mapping[str, Load], slo: float, now: float
) -> Choice:
    best = replicas[0]
    best_t = math.inf
    for r in replicas:
        load = loads.get(r.key, _IDLE)
        t = predicted_ttft(load)
        if now < load.warm_until:  # warming up: looks slower, so it takes less
            t /= ramp(load, now)
        if t < best_t:
            best, best_t = r, t
    meets = slo <= 0 or best_t <= slo
    n = len(replicas)

    def why() -> str:
        verdict = (
            "no SLO"
            if slo <= 0
            else f"within slo.ttft_p99 {slo:g}s"
            if meets
            else f"above slo.ttft_p99 {slo:g}s"
        )
        return f"latency: predicted TTFT {best_t:.3f}s, lowest of {n} ({verdict})"

    return Choice(
        best,
        why,
        predicted_ttft_s=best_t,
        meets_slo=meets,
    )


def observe_ttft(load: Load, ttft_s: float, inflight_when_sent: int, alpha: float = 0.2) -> None:
    """Fold one measured time to first token into the replica's rate (EWMA)."""
    per_slot = ttft_s / (inflight_when_sent + 1)
    if load.measured:
        load.ttft_per_slot += alpha * (per_slot - load.ttft_per_slot)
    else:
        load.ttft_per_slot, load.measured = per_slot, True
