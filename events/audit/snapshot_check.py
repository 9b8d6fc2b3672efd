"""``llmgw verify`` for snapshots: each one against a replay of the log up to its position.

A snapshot is trusted as the catalog at its position: a row edited to hold a
model no event ever added (its checksum recomputed, which anyone who can
write the table can do) would be served at start-up and copied into the next
snapshot. The log is what the chain protects, so the check is to rebuild what
the snapshot should hold by replaying the log (one pass for all of them) and
compare: the runtime models in order, the counts, and the event it was built on.

A snapshot bound to another declared configuration or other code is never
used by this one (events.read.snapshots), and replaying under this configuration
could not reproduce it: it is listed as not checked, not as failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Row, select

from catalog import Catalog, Model
from catalog.changes.digest import catalog_digest
from events.read.replay import Replayer
from events.read.snapshots import (
    authenticity_problem,
    checksum_problem,
    code_version,
    s,
    stored_models,
)
from events.storage.chain_rows import hash_at
from events.storage.sql_log import SqlLog


@dataclass(frozen=True, slots=True)
class SnapshotCheck:
    snapshot: int
    position: int
    # False: bound to another declared configuration or code, so never used here.
    checked: bool
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_json(self) -> dict[str, object]:
        return {
            "snapshot": self.snapshot,
            "position": self.position,
            "checked": self.checked,
            "ok": self.ok,
            "problem": self.problem,
        }


def audit_snapshots(
    store: SqlLog, declared: Catalog, config_path: str, key: bytes | None = None
) -> list[SnapshotCheck]:
    """Every stored snapshot, oldest position first, checked against the log."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(s).order_by(s.c.position, s.c.id)).all()
    if not rows:
        return []
    digest, code = catalog_digest(declared), code_version()
    replayer = Replayer.start(declared, config_path)
    events = iter(store.read(until=max(r.position for r in rows)))
    checks = []
    for row in rows:
        while replayer.position < row.position:
            event = next(events, None)
            if event is None:
                break
            replayer.apply(event)
        checks.append(_check(store, row, replayer, (digest, code), key))
    return checks


def _check(
    store: SqlLog,
    row: Row[Any],
    replayer: Replayer,
    binding: tuple[str, str],
    key: bytes | None,
) -> SnapshotCheck:
    def failed(problem: str) -> SnapshotCheck:
        return SnapshotCheck(row.id, row.position, True, problem)

    problem = checksum_problem(row._mapping) or authenticity_problem(key, row._mapping)
    if problem is not None:
        return failed(problem)
    if (row.declared_digest, row.code_version) != binding:
        return SnapshotCheck(row.id, row.position, False)
    if replayer.position != row.position:
        return failed(
            f"the log ends at position {replayer.position}: it has no position {row.position}"
        )
    if row.position and hash_at(store.engine, row.position) != row.event_hash:
        return failed(f"it was not built on the event now at position {row.position}")
    try:
        held = stored_models(row.models)
    except ValidationError:
        return failed("its models cannot be read")
    problem = _models_problem(held, list(replayer.state.runtime_models()), row.position)
    if problem is not None:
        return failed(problem)
    counts = (row.applied_count, row.skipped_count, row.model_count)
    replayed = (replayer.applied_count, replayer.skipped_count, len(held))
    if counts != replayed:
        return failed(
            f"it counts {counts[0]} applied, {counts[1]} skipped and {counts[2]} models; "
            f"the log up to position {row.position} gives {replayed[0]}, {replayed[1]} "
            f"and {replayed[2]}"
        )
    return SnapshotCheck(row.id, row.position, True)


def _models_problem(held: list[Model], replayed: list[Model], position: int) -> str | None:
    if held == replayed:
        return None
    names = {m.name for m in replayed}
    extra = [m.name for m in held if m.name not in names]
    if extra:
        return (
            f"it holds model {extra[0]!r}, which no event up to position {position} added: "
            "the snapshot was forged or edited"
        )
    held_names = {m.name for m in held}
    missing = [m.name for m in replayed if m.name not in held_names]
    if missing:
        return f"it lacks model {missing[0]!r}, which the log up to position {position} holds"
    differing = next((a.name for a, b in zip(held, replayed, strict=False) if a != b), held[0].name)
    return (
        f"its definition of model {differing!r} (or the order of the models) is not the one "
        f"the log up to position {position} gives"
    )
