"""``llmgw add --dry-run`` and ``llmgw apply --dry-run``: what a change would do, recording
nothing.

The change is checked by the same rule as a real one (``CatalogState.check_add``,
``events.write.apply.plan_apply``) against the catalog as of the log's head, then one
round is planned over the catalog it would make, with the placements and the
lifecycle inputs the daemon would use (as ``place --dry-run`` does), so the
operator sees where the new replicas would go, which would be replaced, or why
they would not fit, before anything is written.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from catalog import Catalog, Model
from catalog.changes.digest import catalog_digest
from catalog.definition.bind_args import check_no_bind_args
from catalog.definition.engines import check_engines
from catalog.forms.text import shown
from catalog.secrecy.secrets import check_no_plain_secrets
from catalog.whole.state import CatalogState
from events.write.apply import ApplyResult, plan_apply
from llmgw.cli.shared.context import App, print_json
from llmgw.policy_view import Judged, judge
from llmgw.views import placement_json, rollout_json, unplaced_json
from scheduler.persistence.store import SchedulerStore
from scheduler.planner.demands import demands
from scheduler.planner.fleet.placements import Placement, Plan
from scheduler.planner.plan import plan as make_plan


def _current(app: App) -> tuple[CatalogState, int]:
    """The catalog as of the log's head, as a state a change can be judged against."""
    current = app.service.catalog()
    position = app.service.position
    runtime = [m for m in current.models() if not current.is_declared(m.name)]
    return CatalogState.restore(app.declared, runtime, config_path=app.config_label), position


def _next_round(app: App, catalog: Catalog) -> tuple[Plan, int, Judged]:
    """The round the daemon would plan next over ``catalog``; how many nodes it saw; and
    the policy it was planned by: the one the server runs with, as recorded."""
    store = SchedulerStore(app.engine)
    nodes = store.nodes()
    state = store.state()
    judged = judge(app.settings, store.policy_in_force())
    plan = make_plan(
        demands(catalog),
        nodes,
        state.placements,
        datetime.now(UTC),
        judged.policy,
        lifecycle=state.lifecycle,
    )
    return plan, len(nodes), judged


def _round_json(plan: Plan, names: Collection[str]) -> dict[str, Any]:
    return {
        "would_place": [placement_json(p) for p in plan.place if p.model in names],
        "would_remove": [
            {**placement_json(r.placement), "reason": r.reason}
            for r in plan.remove
            if r.placement.model in names
        ],
        "unplaced": [unplaced_json(u) for u in plan.unplaced if u.model in names],
        "rollouts": [rollout_json(r) for r in plan.rollouts if r.model in names],
    }


def _round_lines(plan: Plan, names: Collection[str], nodes: int) -> list[str]:
    lines = [f"the next round ({nodes} nodes) would then:"]
    for p in plan.place:
        if p.model in names:
            lines.append(f"  + {_replica(p)}")
    for r in plan.remove:
        if r.placement.model in names:
            lines.append(f"  - {_replica(r.placement)}: {shown(r.reason)}")
    for u in plan.unplaced:
        if u.model in names:
            lines.append(f"  ! {shown(u.model)}[{u.replica}] unplaced: {shown(u.reason)}")
    for rollout in plan.rollouts:
        if rollout.model in names:
            waiting = rollout.waiting or "every old replica is replaced"
            lines.append(
                f"  > {shown(rollout.model)} rollout ({shown(rollout.cause)}): "
                f"{len(rollout.old)} old, {len(rollout.new)} new; {shown(waiting)}"
            )
    if len(lines) == 1:
        lines.append("  change nothing for them")
    return lines


def _replica(p: Placement) -> str:
    return f"{shown(p.model)}[{p.replica}] {shown(p.profile)} on {', '.join(map(shown, p.nodes))}"


def show_add(app: App, models: Sequence[Model], *, as_json: bool) -> int:
    state, position = _current(app)
    for m in models:
        # The refusals a real add would give, in its order (events.write.commands).
        check_no_plain_secrets(m.profiles, m.name)
        check_no_bind_args(m.profiles, m.name)
        check_engines(m)
    ordered = state.check_add(models)  # raises the refusal a real add would
    for model in ordered:
        state.add(model)
    plan, nodes, judged = _next_round(app, state.snapshot())
    names = {m.name for m in ordered}
    if as_json:
        view = _round_json(plan, names)
        print_json(
            {
                "dry_run": True,
                "catalog_position": position,
                "would_add": [m.name for m in ordered],
                "would_place": view["would_place"],
                "unplaced": view["unplaced"],
                "judged_by": judged.json,
            }
        )
        return 0
    out = sys.stdout
    out.write(f"dry run at catalog position {position}: nothing recorded\n")
    for model in ordered:
        out.write(f"would add {shown(model.name)}\n")
    lines = _round_lines(plan, names, nodes)
    if lines[1:] == ["  change nothing for them"]:
        lines[1] = "  place nothing for them (scaling.min is 0)"
    out.write("\n".join([*lines, f"  {judged.text}"]) + "\n")
    return 0


def show_apply(app: App, model: Model, *, as_json: bool) -> int:
    """What ``llmgw apply`` would record (added, replaced with its diff, or unchanged) and
    what the next round would then do for the model: place, replace (a rollout), remove."""
    state, position = _current(app)
    # The same judgement as a real apply, refusals included (a declared model, a collision).
    check_no_plain_secrets(model.profiles, model.name)
    check_no_bind_args(model.profiles, model.name)
    check_engines(model)
    planned = plan_apply(state, model, catalog_digest(app.declared))
    if planned.outcome == "added":
        state.add(model)
    elif planned.outcome == "replaced":
        state.replace(model)
    plan, nodes, judged = _next_round(app, state.snapshot())
    names = {model.name}
    # The diff in the words a real apply answers with (events.write.apply.ApplyResult).
    diff = ApplyResult(planned.outcome, model.name, planned.changes, (), False).diff()
    if as_json:
        print_json(
            {
                "dry_run": True,
                "catalog_position": position,
                "outcome": planned.outcome,
                "model": model.name,
                "diff": diff.to_json(),
                **_round_json(plan, names),
                "judged_by": judged.json,
            }
        )
        return 0
    out = sys.stdout
    out.write(f"dry run at catalog position {position}: nothing recorded\n")
    if planned.outcome == "unchanged":
        out.write(f"unchanged {shown(model.name)}: the catalog already holds this definition\n")
    else:
        verb = "add" if planned.outcome == "added" else "replace"
        out.write(f"would {verb} {shown(model.name)}\n{diff.render()}")
    out.write("\n".join([*_round_lines(plan, names, nodes), f"  {judged.text}"]) + "\n")
    return 0
