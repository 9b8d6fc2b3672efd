"""Audit and debugging commands: replay (--explain, --strict), diff, verify, snapshot.

`llmgw history` is in ``history``."""

from __future__ import annotations

import argparse
import sys

import structlog

from catalog.changes.diff import diff_catalogs
from catalog.changes.redaction import redact_diff
from catalog.forms.text import shown
from events.audit.adoption import AdoptionRefused, adopt_unhashed, verify_log
from events.audit.snapshot_check import SnapshotCheck, audit_snapshots
from events.read.replay import replay
from events.read.replay_reasons import explain, render_context
from events.read.time_travel import catalogs_at
from llmgw.cli.shared.context import EXIT_REFUSED, App, Refused, print_json, resolve_position
from llmgw.cli.shared.live import progress
from llmgw.cli.shared.tables import table
from llmgw.views import iso

log = structlog.get_logger("llmgw.catalog")

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
        with progress("replaying the log"):
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
    with progress(f"rebuilding the catalog at positions {a} and {b}"):
        before, after = catalogs_at(
            app.store,
            app.declared,
            [a, b],
            config_path=app.config_label,
            snapshots=app.service.snapshots,
        )
    diff = diff_catalogs(before, after)
    if not args.show_secrets:
        diff = redact_diff(diff)
    if args.json:
        print_json({"from": a, "to": b, **diff.to_json()})
        return 0
    counts = f"{len(diff.added)} added, {len(diff.removed)} removed, {len(diff.changed)} changed"
    print(f"from position {a} to {b}: {counts}")
    # A time before the first event is position 0 (the declared catalog alone): say so,
    # rather than let a mistyped date read as a diff of the log's start.
    for given, position in ((args.frm, a), (args.to, b)):
        if position == 0 and not str(given).strip().isdigit():
            print(f"({shown(given)} is before the first event: position 0, the declared catalog)")
    if a > b:
        print(f"(backwards: position {a} is after {b}; `added` are the models {b} has and {a} not)")
    sys.stdout.write(diff.render())
    return 0


# -- verify -----------------------------------------------------------------


def cmd_verify(app: App, args: argparse.Namespace) -> int:
    expect = args.expect_head.strip().lower() if args.expect_head else None
    adopted: tuple[int, ...] = ()
    with progress("checking the log's hash chain"):
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
    with progress("checking the snapshots"):
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
    events = f"{report.events} event{'' if report.events == 1 else 's'}"
    print(f"ok: {events}, head position {report.head_position}")
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
    key = "; MACs checked with the snapshot key" if keyed else "; no snapshot key set"
    if not checks:  # "0 match" would read as a mismatch
        return f"snapshots: none stored{key}"
    checked = [c for c in checks if c.checked]
    line = f"snapshots: {len(checked)} match a replay of the log"
    if len(checked) != len(checks):
        line += (
            f"; {len(checks) - len(checked)} not checked (built under another catalog.yaml "
            "or release: never used by this one)"
        )
    return line + key


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
    with progress("replaying the log for a snapshot"):
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
