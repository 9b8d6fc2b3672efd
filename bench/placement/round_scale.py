"""``python -m bench.placement.round_scale --nodes N [N ...]``: the planner's round by size.

One synthetic fleet (``fleets.synthetic_nodes``) of N nodes asking twice as many replicas
(``fleets.synthetic_demands``), planner CPU (``time.process_time``) of:

- a round from nothing (``plan_fresh_cpu_ms``);
- a round with nothing changed, two ways, alternated (best of ``--repeats``): planned in
  full (``plan_idle_cpu_ms``: ``plan()`` on the same inputs) and from its changes
  (``round_idle_cpu_ms``: ``IncrementalRounds.next`` told the nodes not fresh, 10 s later,
  as the daemon runs it);
- a round after a node hosting a replica is lost: in full (``plan_change_cpu_ms``) and
  from its changes (``round_change_cpu_ms``).

One size: one JSON object. Several: one object per size, then the growth exponent of
each figure between consecutive sizes and over the whole range (``log(t2/t1) /
log(n2/n1)``: 1 is linear; n log n is about 1.1 over 10,000-100,000).
``bench.api.heartbeats`` runs it (in a process of its own) for its round figures.

``--placer``: the daemon's whole round instead (``Placer.run``: the catalog, the node and
placement reads, the demands, the plan, the nodes recorded and the write) on a fresh
PostgreSQL database (``placer_rounds``; ``--database`` names it, ``llmgw_bench_...``): one
JSON line a round, with each phase's wall time, then per size the rounds and the time
``explain --round`` takes to read the last recorded round (``read_last_round``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

from bench.placement.fleets import NOW, node_report, synthetic_demands, synthetic_nodes
from bench.shared import common
from scheduler.lifecycle.staleness import DEFAULT_STALENESS
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Demand, Placement
from scheduler.planner.plan import plan

FIGURES = (
    "plan_fresh_cpu_ms",
    "plan_idle_cpu_ms",
    "round_idle_cpu_ms",
    "plan_change_cpu_ms",
    "round_change_cpu_ms",
)


def _cpu(fn: Callable[[], Any]) -> float:
    began = time.process_time()
    fn()
    return (time.process_time() - began) * 1000


def _not_fresh(nodes: Sequence[Node], at: Any) -> dict[str, Any]:
    fresh_from = at - DEFAULT_STALENESS.stale_after
    return {n.name: n.reported_at for n in nodes if n.reported_at < fresh_from}


def _tiled(size: int, tiles: int) -> tuple[list[Node], list[Demand], tuple[Placement, ...]]:
    """``tiles`` copies of the synthetic fleet of ``size`` nodes (names, fabrics and models
    renamed per copy), each copy's replicas placed as the planner places them on one copy;
    then one round over the whole, so that the placements are the planner's own."""
    fleet, demands = synthetic_nodes(size), synthetic_demands(2 * size)
    placed = plan(demands, fleet, (), NOW).placements
    nodes: list[Node] = []
    asked: list[Demand] = []
    current: list[Placement] = []
    for t in range(tiles):
        nodes += [
            replace(
                n,
                name=f"t{t}-{n.name}",
                fabric=None if n.fabric is None else f"t{t}-{n.fabric}",
                labels=dict(n.labels),
            )
            for n in fleet
        ]
        asked += [replace(d, model=f"t{t}-{d.model}") for d in demands]
        current += [
            replace(p, model=f"t{t}-{p.model}", nodes=tuple(f"t{t}-{x}" for x in p.nodes))
            for p in placed
        ]
    settled = plan(asked, nodes, current, NOW).placements
    return nodes, asked, settled


def measure(nodes: int, repeats: int = 3, tiles: int = 1) -> dict[str, float | None]:
    # Imported here: older trees (``LLMGW_BENCH_BASE``) do not have it.
    from scheduler.planner.rounds.incremental import Changes, IncrementalRounds

    fresh: float | None = None
    if tiles > 1:
        fleet, demands, current = _tiled(nodes // tiles, tiles)
        nodes = len(fleet)
    else:
        fleet, demands = synthetic_nodes(nodes), synthetic_demands(2 * nodes)
        began = time.process_time()
        current = plan(demands, fleet, (), NOW).placements
        fresh = (time.process_time() - began) * 1000
    host = current[0].nodes[0]

    rounds = IncrementalRounds()
    rounds.start(demands, fleet, current, NOW)
    # The inputs of each later round, made before any clock starts (reading them is the
    # store's cost): only the nodes not fresh at its time, of every node as read again,
    # its lease 10 s newer.
    later = [NOW + timedelta(seconds=10 * (i + 1)) for i in range(repeats)]
    read_again = [
        [replace(n, labels=dict(n.labels), reported_at=n.reported_at + (at - NOW)) for n in fleet]
        for at in later
    ]
    stale_changes = [
        Changes(now=at, not_fresh=_not_fresh(again, at))
        for at, again in zip(later, read_again, strict=True)
    ]
    idle: dict[str, float] = dict.fromkeys(("plan", "round"), math.inf)
    for changes in stale_changes:
        idle["plan"] = min(idle["plan"], _cpu(lambda: plan(demands, fleet, current, NOW)))
        idle["round"] = min(idle["round"], _cpu(partial(rounds.next, changes)))
    if rounds.reused != repeats:
        raise AssertionError(
            f"a round with nothing changed was planned again (incremental rounds reused "
            f"{rounds.reused}, of {repeats})"
        )

    lost = [replace(n, reported_at=NOW - timedelta(days=1)) if n.name == host else n for n in fleet]
    change_plan = _cpu(lambda: plan(demands, lost, current, NOW))
    lost_at = later[-1] + timedelta(seconds=10)
    aged = [replace(n, reported_at=n.reported_at + (lost_at - NOW)) for n in fleet]
    gone = Changes(
        now=lost_at, not_fresh={**_not_fresh(aged, lost_at), host: NOW - timedelta(days=1)}
    )
    change_round = _cpu(lambda: rounds.next(gone))
    return {
        "nodes": nodes,
        "replicas": len(current),
        "plan_fresh_cpu_ms": None if fresh is None else round(fresh, 1),
        "plan_idle_cpu_ms": round(idle["plan"], 1),
        "round_idle_cpu_ms": round(idle["round"], 2),
        "plan_change_cpu_ms": round(change_plan, 1),
        "round_change_cpu_ms": round(change_round, 1),
    }


def exponents(results: Sequence[dict[str, float | None]]) -> dict[str, dict[str, float]]:
    """Each figure's growth exponent between consecutive sizes, and first to last."""
    out: dict[str, dict[str, float]] = {}
    pairs = [*itertools.pairwise(results)]
    if len(results) > 2:
        pairs.append((results[0], results[-1]))
    for a, b in pairs:
        na, nb = a["nodes"] or 1, b["nodes"] or 1
        ratio = math.log(nb / na)
        out[f"{int(na)}-{int(nb)}"] = {
            k: round(math.log(y / x) / ratio, 2)
            for k in FIGURES
            if (x := a[k]) is not None and (y := b[k]) is not None and x > 0 and y > 0
        }
    return out


# -- the whole round: ``Placer.run`` on PostgreSQL ----------------------------------------

PLACER_DB = "llmgw_bench_round_placer"
# The heartbeat bench's policy (10 s heartbeats): stale after 15 s, lost 5 s later.
PLACER_POLICY_S = (15, 5)
# Where a round's time goes: ``Placer.run``'s steps, each timed (wall and this process's
# CPU; PostgreSQL's CPU is in its own processes, inside the wall time of the reads and
# the write). ``other``: the round's wall time not in any of them.
PHASES = ("catalog", "node_read", "placement_read", "demands", "plan", "nodes", "write")


class _Phases:
    """Wall and CPU time by phase, of the round under way."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.inside = False

    def reset(self) -> None:
        self.wall.clear()
        self.cpu.clear()

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if self.inside:  # counted once, by the outermost phase
                return fn(*args, **kwargs)
            self.inside = True
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside = False
                self.wall[phase] = self.wall.get(phase, 0.0) + time.perf_counter() - wall
                self.cpu[phase] = self.cpu.get(phase, 0.0) + time.process_time() - cpu

        return run


def _catalog_of(asked: Sequence[Demand]) -> Any:
    """A catalog whose ``scaling.min`` and profiles ask exactly ``asked``."""
    from catalog import Catalog
    from catalog.definition.parse import parse_model

    def profile(p: Any) -> dict[str, Any]:
        return {
            "name": p.name,
            "engine": p.engine,
            "gpu_class": p.gpu_class or "",
            "tp": p.gpus_per_node * p.nodes,
            "gpus_per_node": p.gpus_per_node,
            "nodes": p.nodes,
            "priority": p.priority,
            "node_selector": dict(p.node_selector),
            "min_memory_gb": p.min_memory_gb,
        }

    return Catalog.build(
        [
            parse_model(
                {
                    "name": d.model,
                    "source": f"org/{d.model}",
                    "profiles": [profile(p) for p in d.profiles],
                    "scaling": {"min": d.replicas, "max": d.replicas},
                }
            )
            for d in asked
        ]
    )


def _placer_database(
    nodes: int, policy: Any, database: str = PLACER_DB
) -> tuple[Any, Any, list[str], int]:
    """A fresh PostgreSQL database holding ``nodes`` nodes, each registered by a report
    (1% silent since 200 s before ``NOW``, the others' leases renewed at ``NOW``), their
    replicas placed (``_tiled``) and written by ``SchedulerStore.apply``: the store, the
    catalog service, the names of the nodes that heartbeat and the replicas placed."""
    from events.catalog_service import CatalogService
    from events.database.connection import make_engine
    from events.database.migrate import upgrade
    from events.storage.backends import open_log
    from scheduler.persistence.store import SchedulerStore
    from scheduler.persistence.versions import definitions_to_record
    from scheduler.planner.demands import demands
    from scheduler.planner.fleet.inventory import parse_node_report
    from scheduler.planner.fleet.placements import Plan

    tiles = max(1, nodes // 10_000)
    common.progress(f"round_scale --placer: {nodes:,} nodes, placing ({tiles} tile(s))")
    fleet, asked, settled = _tiled(nodes // tiles, tiles)
    declared = _catalog_of(asked)
    if [(d.model, d.replicas, d.profiles) for d in demands(declared)] != [
        (d.model, d.replicas, d.profiles) for d in asked
    ]:
        raise AssertionError("the catalog does not ask what the synthetic demands ask")
    common.pg_recreate(database)
    engine = make_engine(common.pg_url(database))
    upgrade(engine)
    store = SchedulerStore(engine)
    service = CatalogService(open_log(engine), declared)
    common.progress(f"round_scale --placer: reporting {len(fleet):,} nodes")
    for start in range(0, len(fleet), 1_000):
        batch = fleet[start : start + 1_000]
        reports = [parse_node_report(node_report(n)) for n in batch]
        store.report(reports, min(n.reported_at for n in batch))
    beating = [n.name for n in fleet if n.reported_at >= NOW]
    _renew(store, beating, NOW)
    common.progress(f"round_scale --placer: writing {len(settled):,} placements")
    store.apply(
        Plan(keep=(), place=tuple(settled), remove=(), unplaced=()),
        based_on=store.state(),
        catalog_position=service.position,
        nodes=fleet,
        now=NOW,
        policy=policy,
        definitions=definitions_to_record(service.catalog(), settled),
    )
    return store, service, beating, len(settled)


def _renew(store: Any, names: Sequence[str], at: Any) -> None:
    """Every lease of ``names`` renewed at ``at``, as heartbeats are: in batches."""
    for start in range(0, len(names), 10_000):
        store.renew_leases(dict.fromkeys(names[start : start + 10_000], at))


def _timed_placer(store: Any, service: Any, policy: Any) -> tuple[Any, _Phases]:
    """A ``Placer`` whose steps are timed by phase."""
    from scheduler.daemon import round_runner

    placer = round_runner.Placer(service, store, policy)
    phases = _Phases()
    for owner, name, phase in (
        (placer._feed, "read", "node_read"),
        (placer._placements, "read", "placement_read"),
        (placer, "_demands", "demands"),
        (placer._rounds, "start", "plan"),
        (placer._rounds, "next", "plan"),
        (placer._rounds, "nodes", "nodes"),
        (store, "apply", "write"),
        (store, "record_outcome", "write"),
        (service, "catalog", "catalog"),
    ):
        setattr(owner, name, phases.timed(phase, getattr(owner, name)))
    return placer, phases


def placer_rounds(nodes: int, repeats: int = 3, database: str = PLACER_DB) -> dict[str, Any]:
    """The daemon's own round (``Placer.run``) on a fresh Alembic-migrated PostgreSQL
    database (``_placer_database``), with the heartbeat bench's policy. After the rounds
    that settle (the first reads whole and plans in full): ``repeats`` rounds with nothing
    changed (every lease renewed, 10 s apart), then ``repeats`` times a node hosting
    replicas falls silent: its rounds 10 s (fresh), 20 s (stale) and 30 s (lost) after
    its last heartbeat. Each round: one JSON line (wall and CPU ms, each phase's wall ms)."""
    import os

    import psycopg

    from scheduler.lifecycle.staleness import StalenessPolicy

    reason = common.pg_available()
    if reason is not None:
        raise SystemExit(reason)
    common.quiet_logs()
    stale_s, grace_s = PLACER_POLICY_S
    policy = StalenessPolicy(
        stale_after=timedelta(seconds=stale_s), grace=timedelta(seconds=grace_s)
    )
    try:
        store, service, beating, replicas = _placer_database(nodes, policy, database)
        placer, phases = _timed_placer(store, service, policy)
        at = NOW
        silent: set[str] = set()

        def one(kind: str) -> dict[str, Any]:
            nonlocal at
            at += timedelta(seconds=10)
            _renew(store, [n for n in beating if n not in silent], at)
            phases.reset()
            wall, cpu = time.perf_counter(), time.process_time()
            outcome = placer.run(now=at)
            wall_ms = (time.perf_counter() - wall) * 1000
            row: dict[str, Any] = {
                "round": kind,
                "wall_ms": round(wall_ms, 1),
                "cpu_ms": round((time.process_time() - cpu) * 1000, 1),
                "written": outcome.round_id is not None,
                "placed": len(outcome.plan.place),
                "removed": len(outcome.plan.remove),
            }
            for phase in PHASES:
                row[f"{phase}_ms"] = round(phases.wall.get(phase, 0.0) * 1000, 2)
            row["other_ms"] = round(wall_ms - sum(phases.wall.values()) * 1000, 2)
            row["plan_cpu_ms"] = round(phases.cpu.get("plan", 0.0) * 1000, 2)
            row["load"] = round(os.getloadavg()[0], 1)
            print(json.dumps(row), flush=True)
            return row

        common.progress("round_scale --placer: the first rounds (whole reads, full plan)")
        rows = [one("settling")]
        while rows[-1]["written"] and len(rows) < 4:
            rows.append(one("settling"))
        rows += [one("nothing changed") for _ in range(repeats)]
        beats = set(beating)
        hosts = sorted({x for p in store.state().placements for x in p.nodes if x in beats})
        for i in range(repeats):
            silent.add(hosts[(i * 7919) % len(hosts)])
            rows += [one("host silent 10 s"), one("host stale (20 s)"), one("host lost (30 s)")]
        # What ``explain --round`` reads: the last recorded round, rebuilt along its chain
        # (rounds recorded by reference, revision 0024) where it has one.
        wall, cpu = time.perf_counter(), time.process_time()
        last = store.recorded_round()
        read = {
            "round": None if last is None else last.id,
            "wall_ms": round((time.perf_counter() - wall) * 1000, 1),
            "cpu_ms": round((time.process_time() - cpu) * 1000, 1),
        }
        return {
            "nodes": nodes,
            "replicas": replicas,
            "store": "postgresql",
            "rounds": rows,
            "read_last_round": read,
        }
    finally:
        with psycopg.connect(common.PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement.round_scale")
    parser.add_argument("--nodes", type=int, nargs="+", default=[10_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--tiles",
        type=int,
        default=1,
        help="build each fleet as this many renamed copies of one N/tiles nodes, placed "
        "once (a round from nothing at 100,000 nodes takes minutes): no from-nothing figure",
    )
    parser.add_argument(
        "--placer",
        action="store_true",
        help="run the daemon's whole round (Placer.run: reads, plan, write) on a fresh "
        "PostgreSQL database instead of the planner alone: one JSON line a round (wall, "
        "CPU and each phase's wall time), then one object a size",
    )
    parser.add_argument(
        "--database",
        default=PLACER_DB,
        help="with --placer: the PostgreSQL database to create (and drop) for it; "
        "its name starts with llmgw_bench_",
    )
    args = parser.parse_args(argv)
    if args.placer:
        if not args.database.startswith("llmgw_bench_"):
            parser.error("--database: the name must start with llmgw_bench_")
        for count in args.nodes:
            print(json.dumps(placer_rounds(count, args.repeats, args.database)), flush=True)
        return 0
    results = []
    for count in args.nodes:
        results.append(measure(count, args.repeats, args.tiles))
        if len(args.nodes) > 1:
            print(json.dumps(results[-1]), flush=True)
    if len(results) == 1:
        print(json.dumps(results[0]))
    else:
        print(json.dumps({"exponents": exponents(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
