"""Audit and debugging commands: history, replay (--explain, --strict), diff, verify, snapshot."""

from __future__ import annotations

import argparse
import heapq
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import structlog

from catalog.diff import diff_catalogs
from catalog.text import shown
from events import replay
from events.adoption import AdoptionRefused, adopt_unhashed, verify_log
from events.explain import explain, render_context
from events.snapshot_audit import SnapshotCheck, audit_snapshots
from events.store import HistoryQuery
from events.timetravel import catalogs_at
from events.types import StoredEvent
from llmgw.cli.catalog_cmds import resolve_position
from llmgw.cli.context import EXIT_REFUSED, App, Refused, parse_when, print_json
from llmgw.cli.render import table
from llmgw.cli.times import whole_day
from llmgw.views import iso
from scheduler.store import PlacementEvent, SchedulerStore

log = structlog.get_logger("llmgw.catalog")

HISTORY_KEYS = ["position", "recorded_at", "type", "model", "actor", "reason"]


# -- history ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One line of ``llmgw history``, from whichever log it comes."""

    position: int
    recorded_at: datetime
    type: str
    model: str | None
    actor: str
    reason: str
    # None for the catalog's log alone; "catalog" or "placements" when merged,
    # since the two logs number their positions separately.
    log: str | None = None

    @classmethod
    def of(cls, event: StoredEvent) -> HistoryEntry:
        return cls(
            event.position, event.recorded_at, event.type, event.model, event.actor, event.reason
        )

    @classmethod
    def of_placement(cls, event: PlacementEvent) -> HistoryEntry:
        if event.type.startswith("node."):  # cordons and drains name no replica
            where = f"node {', '.join(event.nodes)}"
        else:
            where = f"replica {event.replica} ({event.profile}) on {', '.join(event.nodes)}"
        reason = f"{where}: {event.reason}" if event.reason else where
        reason += f" [round {event.round_id}, catalog position {event.catalog_position}]"
        return cls(
            event.position,
            event.recorded_at,
            event.type,
            event.model or None,
            # The scheduler's own decisions carry no actor; an agent's or operator's do.
            event.actor or "scheduler",
            reason,
            "placements",
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "position": self.position,
            "recorded_at": iso(self.recorded_at),
            "type": self.type,
            "model": self.model,
            "actor": self.actor,
            "reason": self.reason,
        }
        if self.log is not None:
            out["log"] = self.log
        return out


def history_query(args: argparse.Namespace) -> HistoryQuery:
    return HistoryQuery(
        model=args.model,
        actor=args.actor,
        type=args.type,
        since=None if args.since is None else parse_when(args.since),
        until=None if args.until is None else _until(args.until),
    )


def _until(text: str) -> datetime:
    when = parse_when(text)
    if whole_day(text):  # a date alone, today or yesterday: up to the end of that day
        when += timedelta(days=1) - timedelta(microseconds=1)
    return when


def history_sources(
    app: App, query: HistoryQuery, *, placements: bool = False
) -> list[Iterable[HistoryEntry]]:
    """The logs ``history`` reads, each in time order, all filtered by ``query``.

    With ``placements``, the scheduler's ``placement_events`` are a second
    source (actor "scheduler"), merged by time by ``cmd_history``.
    """
    if not placements:
        return [(HistoryEntry.of(e) for e in app.store.history(query))]
    catalog = (replace(HistoryEntry.of(e), log="catalog") for e in app.store.history(query))
    sources: list[Iterable[HistoryEntry]] = [catalog]
    events = SchedulerStore(app.engine).events(
        model=query.model, since=query.since, until=query.until
    )
    sources.append(
        entry
        for entry in (HistoryEntry.of_placement(e) for e in events)
        if (query.type is None or entry.type == query.type)
        and (query.actor is None or entry.actor == query.actor)
    )
    return sources


def cmd_history(app: App, args: argparse.Namespace) -> int:
    sources = history_sources(app, history_query(args), placements=args.placements)
    entries: Iterator[HistoryEntry] = heapq.merge(*sources, key=lambda e: e.recorded_at)
    rows = [e.to_json() for e in entries]
    if args.json:
        print_json(rows)
        return 0
    keys = [*HISTORY_KEYS, "log"] if args.placements else HISTORY_KEYS
    sys.stdout.write(table(keys, [[str(r[h] or "") for h in keys] for r in rows]))
    return 0


# -- replay -----------------------------------------------------------------


def cmd_replay(app: App, args: argparse.Namespace) -> int:
    until = resolve_position(app, args.until)
    events = app.store.read(until=until)
    steps = []
    if args.explain:
        replayer, walk = explain(app.declared, events, app.config_label)
        for step in walk:
            if args.json:
                steps.append(step.to_json())
                continue
            outcome = "applied" if step.applied else "SKIPPED"
            print(
                f"{step.position:>6}  {iso(step.recorded_at)}  {shown(step.type):<14}  "
                f"{shown(step.model or '-'):<24} {shown(step.actor or '-'):<10} {outcome}"
            )
            if not step.applied:
                print(f"{'':>8}reason: {shown(step.reason)}")
                for line in render_context(step.context):
                    print(f"{'':>8}{line}")
        result = replayer.result()
    else:
        result = replay(app.declared, events, app.config_label)
    if args.json:
        out: dict[str, object] = {
            "position": result.position,
            "applied": list(result.applied),
            "skipped": [s.to_json() for s in result.skipped],
            "models": result.catalog.names(),
        }
        if args.explain:
            out["events"] = steps
        print_json(out)
    else:
        print(
            f"replayed to position {result.position}: {len(result.applied)} applied, "
            f"{len(result.skipped)} skipped, {len(result.catalog)} models"
        )
        if not args.explain:
            for s in result.skipped:
                print(
                    f"  skipped position {s.position} ({shown(s.type)}, event "
                    f"{shown(s.event_id)}): {shown(s.reason)}"
                )
    if args.strict and result.skipped:
        positions = ", ".join(str(s.position) for s in result.skipped[:10])
        more = "" if len(result.skipped) <= 10 else ", ..."
        print(
            f"error: {len(result.skipped)} event(s) skipped (positions {positions}{more}) with "
            f"{app.config_label}; --strict fails on any",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    return 0


# -- diff -------------------------------------------------------------------


def cmd_diff(app: App, args: argparse.Namespace) -> int:
    a = resolve_position(app, args.frm)
    b = resolve_position(app, args.to)
    assert a is not None and b is not None  # both arguments are required
    before, after = catalogs_at(
        app.store,
        app.declared,
        [a, b],
        config_path=app.config_label,
        snapshots=app.service.snapshots,
    )
    diff = diff_catalogs(before, after)
    if args.json:
        print_json({"from": a, "to": b, **diff.to_json()})
        return 0
    counts = f"{len(diff.added)} added, {len(diff.removed)} removed, {len(diff.changed)} changed"
    print(f"from position {a} to {b}: {counts}")
    sys.stdout.write(diff.render())
    return 0


# -- verify -----------------------------------------------------------------


def cmd_verify(app: App, args: argparse.Namespace) -> int:
    expect = args.expect_head.strip().lower() if args.expect_head else None
    adopted: tuple[int, ...] = ()
    if args.adopt_unhashed:
        try:
            report, adopted = adopt_unhashed(app.store, actor=args.actor, reason=args.reason)
        except AdoptionRefused as exc:
            raise Refused(str(exc)) from None
        if expect is not None and report.ok:
            report = verify_log(app.store, expect)
    else:
        report = verify_log(app.store, expect)
    if not report.ok:
        log.warning("catalog.verify_failed", position=report.failed_at, reason=report.reason)
    checks = audit_snapshots(app.store, app.declared, app.config_label, app.snapshot_key)
    forged = [c for c in checks if not c.ok]
    for check in forged:
        log.warning(
            "catalog.verify_snapshot_failed",
            snapshot=check.snapshot,
            position=check.position,
            reason=check.problem,
        )
    ok = report.ok and not forged
    if args.json:
        out = {**report.to_json(), "adopted_now": list(adopted)}
        print_json({**out, "ok": ok, "snapshots": [c.to_json() for c in checks]})
        return 0 if ok else EXIT_REFUSED
    if not report.ok:
        print(
            f"error: verify failed at position {report.failed_at}: {shown(report.reason)}",
            file=sys.stderr,
        )
        if args.adopt_unhashed:
            print("nothing was adopted", file=sys.stderr)
    for check in forged:
        print(
            f"error: verify failed for snapshot {check.snapshot} at position "
            f"{check.position}: {check.problem}",
            file=sys.stderr,
        )
    if not ok:
        return EXIT_REFUSED
    if adopted:
        print(
            f"adopted {len(adopted)} unhashed event(s) at position(s) "
            f"{', '.join(map(str, adopted))}, recorded as adopted by {args.actor!r}"
        )
    print(f"ok: {report.events} events, head position {report.head_position}")
    print(f"head {shown(report.head_hash)}")
    seal = report.seal
    if seal is not None and seal.position:
        print(
            f"positions 1..{seal.position} predate the hash chain: covered by its seal since "
            f"{iso(seal.sealed_at)}"
        )
    if report.adopted:
        print(
            f"{report.adopted} event(s) after the seal carry no hash and were adopted by an "
            "operator (table event_chain_adoptions)"
        )
    if expect is not None:
        print(f"expected head found at position {report.expected_head_at}")
    print(_snapshots_line(checks, keyed=app.snapshot_key is not None))
    return 0


def _snapshots_line(checks: list[SnapshotCheck], *, keyed: bool) -> str:
    checked = [c for c in checks if c.checked]
    line = f"snapshots: {len(checked)} match a replay of the log"
    if len(checked) != len(checks):
        line += (
            f"; {len(checks) - len(checked)} not checked (built under another catalog.yaml "
            "or release: never used by this one)"
        )
    return line + ("; MACs checked with the snapshot key" if keyed else "; no snapshot key set")


# -- snapshot ---------------------------------------------------------------


def cmd_snapshot(app: App, args: argparse.Namespace) -> int:
    snapshots = app.service.snapshots
    if args.list and args.json:
        print_json(
            [
                {
                    "id": i.id,
                    "position": i.position,
                    "runtime_models": i.model_count,
                    "skipped": i.skipped_count,
                    "declared_digest": i.declared_digest,
                    "taken_at": iso(i.created_at),
                    "bytes": i.size,
                }
                for i in snapshots.taken()
            ]
        )
        return 0
    if args.list:
        rows = [
            [
                str(i.id),
                str(i.position),
                str(i.model_count),
                str(i.skipped_count),
                i.declared_digest[:12],
                iso(i.created_at),
                f"{i.size:,}",
            ]
            for i in snapshots.taken()
        ]
        headers = ["id", "position", "runtime_models", "skipped", "declared", "taken_at", "bytes"]
        sys.stdout.write(table(headers, rows))
        return 0
    snapshot_id = app.service.snapshot()
    if snapshot_id is None:
        print("error: the database refused the snapshot (see the log)", file=sys.stderr)
        return EXIT_REFUSED
    (info,) = [i for i in snapshots.taken() if i.id == snapshot_id]
    if args.json:
        print_json(
            {
                "id": info.id,
                "position": info.position,
                "runtime_models": info.model_count,
                "bytes": info.size,
                "declared_digest": info.declared_digest,
            }
        )
        return 0
    print(
        f"snapshot {info.id} at position {info.position}: {info.model_count} runtime models, "
        f"{info.size:,} bytes, declared catalog {info.declared_digest[:12]}"
    )
    return 0
