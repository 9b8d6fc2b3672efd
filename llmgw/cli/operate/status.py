"""``llmgw status``: the control plane at a glance, from any terminal.

What the catalog is at, what the processes watching the declared file made of it
(a refused edit: where and why, and that the previous catalog keeps running),
the nodes by freshness (judged by the policy the server recorded, ``judged_by``:
``llmgw.policy_view``), the replicas wanted, placed and ready, and the rollouts
that are really in progress (replicas of more than one model version placed), and
per model its replicas ready and placed against what is wanted and scaling.min..max,
with the autoscaler's load and p99s (``models``; the policy in force is ``policy``),
and the replicas whose engine gives one request less than the catalog's
``context_length`` promises (``context_warnings``: both numbers and the arithmetic,
e.g. ``--ctx-size 8192 / --parallel 4 = 2048 < context_length 4096``).
Read from the database, so it says what the server and the daemon do, not what
this command would make of the file on its own.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from catalog import CatalogError
from catalog.forms.text import shown
from llmgw.cli.autoscale.commands import model_rows, status_table
from llmgw.cli.scheduler.lifecycle import service_in_force
from llmgw.cli.shared import live
from llmgw.cli.shared.context import App, Refused
from llmgw.policy_view import judge
from llmgw.views import iso, replica_context_json


def cmd_status(app: App, args: argparse.Namespace) -> int:
    return live.show(lambda: _view(app), watch=args.watch, as_json=args.json, title="llmgw status")


def _view(app: App) -> tuple[dict[str, Any], str]:
    from declared.status import read_status
    from scheduler.lifecycle.staleness import freshness
    from scheduler.persistence.store import SchedulerStore

    now = datetime.now(UTC)
    declared = read_status(app.engine)
    store = SchedulerStore(app.engine)
    # The policy the server runs with, as it recorded it: not this command's defaults.
    judged = judge(app.settings, store.policy_in_force())
    nodes = store.nodes()
    states: dict[str, int] = {"fresh": 0, "stale": 0, "lost": 0}
    for n in nodes:
        states[freshness(n.reported_at, now, judged.policy).value] += 1
    replicas = store.replicas()
    versions: dict[str, set[str]] = {}
    for p, _ in replicas:
        versions.setdefault(p.model, set()).add(p.version or "(unpinned)")
    rolling = sorted(m for m, vs in versions.items() if len(vs) > 1)
    own_refusal = None
    models: dict[str, int] | None = None
    wanted = None
    rows: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    try:
        # The catalog the control plane runs (the declared one a watcher recorded when
        # this command's reading of the file differs, e.g. an edit it refused).
        service, _ = service_in_force(app)
        catalog = service.catalog()
    except (CatalogError, Refused) as exc:
        own_refusal = str(exc)
    else:
        declared_count = sum(catalog.is_declared(m.name) for m in catalog.models())
        models = {"declared": declared_count, "runtime": len(catalog) - declared_count}
        rows = model_rows(app, catalog, replicas, now)
        wanted = sum(r["wanted"] for r in rows)
        for p, st in replicas:
            context = replica_context_json(p, catalog, st)
            if context["context_warning"]:
                warnings.append(
                    {"model": p.model, "replica": p.replica, "profile": p.profile, **context}
                )
    out: dict[str, Any] = {
        "catalog_position": app.store.head(),
        "catalog_models": models,
        "declared": [d.to_json() for d in declared],
        "own_read_refused": own_refusal,
        "nodes": {"total": len(nodes), **states},
        "judged_by": judged.json,
        "replicas": {
            "wanted": wanted,
            "placed": len(replicas),
            "ready": sum(s.counts_as_ready for _, s in replicas),
        },
        "rollouts": rolling,
        "leader": _leader(app),
        "context_warnings": warnings,
        "models": rows,
        "policy": app.settings.autoscale.to_json(),
        "checked_at": iso(now),
    }
    text = _text(out)
    return out, text + ("\n\n" + status_table(rows) if rows else "")


def _leader(app: App) -> dict[str, Any] | None:
    """Who holds the scheduler's leadership lease, under which epoch, until when (PostgreSQL;
    None on SQLite, where leadership is a flock on the database file)."""
    from sqlalchemy.engine import make_url

    from scheduler.persistence.lease_store import read_lease

    if make_url(app.settings.database_url).get_backend_name() == "sqlite":
        return None
    with app.engine.connect() as conn:
        lease = read_lease(conn)
    return {"lease": "none"} if lease is None else lease.to_json()


def _leader_line(leader: dict[str, Any] | None) -> str:
    if leader is None:
        return "leader: the scheduler holding the database file's lock (SQLite)"
    if "holder" not in leader:
        return "leader: none yet (no scheduler has taken the leadership lease)"
    state = "lapsed at" if leader["lapsed"] else "until"
    return (
        f"leader: {shown(leader['holder'])}, epoch {leader['epoch']}, leadership lease "
        f"{state} {leader['expires_at']} (since {leader['acquired_at']})"
    )


def _text(out: dict[str, Any]) -> str:
    lines = []
    models = out["catalog_models"]
    counted = (
        f"{models['declared']} declared, {models['runtime']} runtime model(s)"
        if models is not None
        else "models not counted (see below)"
    )
    lines.append(f"catalog: log position {out['catalog_position']}; {counted}")
    if not out["declared"]:
        lines.append("declared file: none watched yet (no `llmgw serve` or daemon has read one)")
    for d in out["declared"]:
        where = shown(d["path"])
        lines.append(
            f"declared file {where}: {d['state']}; in force: digest {d['digest'][:12]}, "
            f"{d['models']} model(s), since {d['loaded_at']} (by {shown(d['by'])})"
        )
        if d["refusal"] is not None:
            lines.append(f"  refused at {d['refused_at']}: {shown(d['refusal']['detail'])}")
    if out["own_read_refused"]:
        lines.append(f"this command's own read of the file: {shown(out['own_read_refused'])}")
    lines.append(_leader_line(out["leader"]))
    n = out["nodes"]
    lines.append(f"nodes: {n['total']} ({n['fresh']} fresh, {n['stale']} stale, {n['lost']} lost)")
    lines.append(f"  {out['judged_by']['text']}")
    r = out["replicas"]
    wanted = "?" if r["wanted"] is None else r["wanted"]
    lines.append(f"replicas: {wanted} wanted, {r['placed']} placed, {r['ready']} ready")
    rolling = out["rollouts"]
    lines.append(
        "rollouts in progress: "
        + (", ".join(shown(m) for m in rolling) if rolling else "none")
        + (" (`llmgw rollout status MODEL` for each)" if rolling else "")
    )
    for w in out["context_warnings"]:
        lines.append(f"warning: {shown(w['model'])}[{w['replica']}]: {shown(w['context_warning'])}")
    return "\n".join(lines)
