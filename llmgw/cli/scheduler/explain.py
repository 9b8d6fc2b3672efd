"""`llmgw explain MODEL`: why each replica went where it did, now or in a recorded round."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from catalog.forms.text import shown
from events.read.replay import replay
from llmgw.cli.shared.context import App, Refused, parse_when, print_json
from llmgw.policy_view import judged_by_round, judging_policy
from llmgw.views import iso
from scheduler.persistence.store import PLACED, REMOVED, RoundUnreadable, SchedulerStore
from scheduler.planner.replica_stories import explain


def cmd_explain(app: App, args: argparse.Namespace) -> int:
    store = SchedulerStore(app.engine)
    if args.at is None and args.round is None:
        # Now: the inputs a round would read this moment, planned without writing.
        catalog = app.service.catalog()
        position = app.service.position
        nodes = store.nodes()
        state = store.state()
        current, lifecycle = state.placements, state.lifecycle
        now = datetime.now(UTC)
        # The policy the server runs with, as recorded: what its next round judges by.
        judged = judging_policy(app.settings, app.engine)
        rules = judged.policy
        header = f"now ({iso(now)}), catalog position {position}, {len(nodes)} nodes"
        recorded = None
    else:
        try:
            recorded = store.recorded_round(
                round_id=args.round, at=parse_when(args.at) if args.at else None
            )
        except RoundUnreadable as exc:
            # The reason is the one `scheduler.row_skipped` logs: damaged, or written by a
            # newer release. The round did happen; what it wrote is still in the trail.
            raise Refused(
                f"cannot explain {args.model!r} in round {exc.round_id}: the round is "
                f"recorded but its row cannot be read ({exc.reason}). `llmgw history "
                "--placements` still lists what it did; explain a round before or after it"
            ) from None
        if recorded is None:
            if args.round is not None:
                raise Refused(
                    f"round {args.round} is not recorded; `llmgw history --placements` "
                    "lists the rounds that are"
                )
            raise Refused(f"no placement round is recorded at or before {args.at}")
        position = recorded.catalog_position
        catalog = replay(app.declared, app.store.read(until=position), app.config_label).catalog
        nodes, current, now, rules = (
            list(recorded.nodes),
            recorded.current,
            recorded.planned_at,
            recorded.policy,
        )
        lifecycle = recorded.lifecycle
        judged = judged_by_round(recorded)
        header = (
            f"round {recorded.id} at {iso(now)}, catalog position {position}, {len(nodes)} nodes"
        )
    if catalog.resolve(args.model) is None and not any(p.model == args.model for p in current):
        raise Refused(
            f"model {args.model!r} was not in the catalog at position {position}, "
            "and no replica of it was running"
        )
    from autoscale.runner import wanted_counts
    from autoscale.store import AutoscaleStore

    # The autoscaler's counts in force at that time: the last decisions recorded by then.
    counts = wanted_counts(AutoscaleStore(app.engine), app.settings.autoscale, now)
    result = explain(
        args.model,
        catalog=catalog,
        nodes=nodes,
        current=current,
        now=now,
        policy=rules,
        lifecycle=lifecycle,
        counts=counts,
    )
    matches = None
    if recorded is not None:
        written = {
            (e.type, e.model, e.replica, e.nodes)
            for e in store.events(round_id=recorded.id)
            if e.type in (PLACED, REMOVED)
        }
        again = {(PLACED, p.model, p.replica, p.nodes) for p in result.plan.place} | {
            (REMOVED, r.placement.model, r.placement.replica, r.placement.nodes)
            for r in result.plan.remove
        }
        matches = written == again
    if args.json:
        print_json(
            {
                "model": result.model,
                "round": recorded.id if recorded else None,
                "planned_at": iso(now),
                "catalog_position": position,
                "matches_recorded_round": matches,
                "replicas": [
                    {
                        "replica": s.replica,
                        "outcome": s.outcome,
                        "profile": s.profile,
                        "nodes": list(s.nodes),
                        "why": s.why,
                    }
                    for s in result.stories
                ],
                "notes": list(result.notes),
                "judged_by": judged.json,
            }
        )
        return 0
    print(f"{shown(result.model)}: {header}")
    print(f"  {judged.text}")
    if matches is not None:
        print(
            "  planned again: identical to what the round wrote"
            if matches
            else "  planned again: DIFFERS from what the round wrote (has the declared "
            "configuration changed since? it is part of the catalog the round saw)"
        )
    if not result.stories:
        print("  no replicas wanted (scaling.min is 0) and none running")
    for s in result.stories:
        where = f" {shown(s.profile)} on {', '.join(map(shown, s.nodes))}" if s.nodes else ""
        print(f"  replica {s.replica}: {s.outcome}{where}: {shown(s.why)}")
    for note in result.notes:
        print(f"  {shown(note)}")
    return 0
