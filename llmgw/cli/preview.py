"""``llmgw add --dry-run``: what an addition would change, recording nothing.

The addition is checked by the same rule as a real one (``CatalogState.check_add``)
against the catalog as of the log's head, then one round is planned over the
catalog it would make, so the operator sees where the new replicas would go, or
why they would not fit, before anything is written.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from catalog import Model
from catalog.state import CatalogState
from llmgw.cli.context import App, print_json
from llmgw.views import placement_json, unplaced_json
from scheduler.demands import demands
from scheduler.planner import plan as make_plan
from scheduler.store import SchedulerStore


def show_add(app: App, models: Sequence[Model], *, as_json: bool) -> int:
    current = app.service.catalog()
    position = app.service.position
    runtime = [m for m in current.models() if not current.is_declared(m.name)]
    state = CatalogState.restore(app.declared, runtime, config_path=app.config_label)
    ordered = state.check_add(models)  # raises the refusal a real add would
    for model in ordered:
        state.add(model)
    store = SchedulerStore(app.engine)
    nodes = store.nodes()
    plan = make_plan(
        demands(state.snapshot()),
        nodes,
        store.state().placements,
        datetime.now(UTC),
        app.settings.policy,
    )
    names = {m.name for m in ordered}
    place = [p for p in plan.place if p.model in names]
    unplaced = [u for u in plan.unplaced if u.model in names]
    if as_json:
        print_json(
            {
                "dry_run": True,
                "catalog_position": position,
                "would_add": [m.name for m in ordered],
                "would_place": [placement_json(p) for p in place],
                "unplaced": [unplaced_json(u) for u in unplaced],
            }
        )
        return 0
    out = sys.stdout
    out.write(f"dry run at catalog position {position}: nothing recorded\n")
    for model in ordered:
        out.write(f"would add {model.name}\n")
    out.write(f"the next round ({len(nodes)} nodes) would then:\n")
    for p in place:
        out.write(f"  + {p.model}[{p.replica}] {p.profile} on {', '.join(p.nodes)}\n")
    for u in unplaced:
        out.write(f"  ! {u.model}[{u.replica}] unplaced: {u.reason}\n")
    if not place and not unplaced:
        out.write("  place nothing for them (scaling.min is 0)\n")
    return 0
