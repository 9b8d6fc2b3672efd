"""Pinned model versions: each placement runs the definition it was placed with.

A placement records its model's version (``catalog.changes.digest.model_version``, a
digest of the whole definition). The definition of every version a replica was
placed with is kept in ``model_versions`` (written by the round that places
it), and the engine view an agent is sent for a placement is its version's, not
the current catalog's: a change to the catalog (``apply``, an edit of the
declared file, a priority change, a rollback) therefore never changes what a
running replica runs. Only the scheduler changes that, by placing new replicas
of the new version beside the old ones and removing the old ones once the new
ones are ready (``scheduler.planner.rollout``).

Why the definition is kept here rather than found again in the catalog's log:
a declared model's versions are not in the log (the file is edited in place),
and this table holds exactly the versions some replica was placed with, read
by one primary-key lookup and cached (a version's definition never changes).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import Connection, Engine, insert, select, tuple_

from catalog import Catalog, Model
from catalog.changes.digest import model_version
from catalog.definition.parse import parse_model
from catalog.definition.views import EngineProfile
from scheduler.persistence.record_format import checked
from scheduler.persistence.row_decoding import STORED_LIMITS, Row, decode_rows, json_column, raw
from scheduler.persistence.tables import ModelVersionRow, table
from scheduler.planner.fleet.placements import Placement

versions_t = table(ModelVersionRow)

# Versions kept parsed in one process; a version's definition never changes, so
# an entry is never stale, only evicted (oldest first) past this many.
CACHE_SIZE = 4096


def definitions_to_record(
    catalog: Catalog, placements: Iterable[Placement]
) -> dict[tuple[str, str], str]:
    """(model, version) -> definition JSON, for each placement of the catalog's current
    version of its model: what a round that places or pins them must have recorded."""
    out: dict[tuple[str, str], str] = {}
    versions: dict[str, tuple[str, Model] | None] = {}
    for p in placements:
        if not p.version or (p.model, p.version) in out:
            continue
        if p.model not in versions:
            model = catalog.resolve(p.model)
            versions[p.model] = None if model is None else (model_version(model), model)
        current = versions[p.model]
        if current is not None and current[0] == p.version:
            out[(p.model, p.version)] = json.dumps(
                current[1].to_definition(), sort_keys=True, separators=(",", ":")
            )
    return out


def record_definitions(
    conn: Connection, definitions: Mapping[tuple[str, str], str], now: datetime
) -> None:
    """Insert the versions not stored yet (a version's definition never changes)."""
    if not definitions:
        return
    keys = list(definitions)
    stored = {
        (m, v)
        for m, v in conn.execute(
            select(versions_t.c.model, versions_t.c.version).where(
                tuple_(versions_t.c.model, versions_t.c.version).in_(keys)
            )
        )
    }
    rows = [
        {"model": m, "version": v, "definition": definitions[(m, v)], "recorded_at": now}
        for m, v in keys
        if (m, v) not in stored
    ]
    if rows:
        conn.execute(insert(versions_t), rows)


class VersionBook:
    """The definitions of pinned versions, read once per process and kept.

    ``engine_view`` is what an agent is sent for a placement: its version's
    engine profile. A placement with no version (placed before versions) gets
    the current catalog's, as before; one whose version's row is missing or
    unreadable gets None (its agent neither starts nor restarts anything for
    it: an engine already running keeps running) and the row is named in the
    log (``scheduler.row_skipped``).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._models: dict[tuple[str, str], Model | None] = {}
        self._lock = threading.Lock()

    def engine_view(self, p: Placement, catalog: Catalog) -> EngineProfile | None:
        model = self.model_of(p, catalog)
        return None if model is None else model.engine_profile(p.profile)

    def model_of(self, p: Placement, catalog: Catalog) -> Model | None:
        """The definition a placement runs: its pinned version's, else the current one."""
        current = catalog.resolve(p.model)
        if not p.version:
            return current
        if current is not None and model_version(current) == p.version:
            return current
        return self.load([(p.model, p.version)]).get((p.model, p.version))

    def load(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Model | None]:
        """The definitions of ``keys`` (None where none is stored or it cannot be read)."""
        wanted = set(keys)
        with self._lock:
            found = {k: self._models[k] for k in wanted if k in self._models}
        missing = sorted(wanted - found.keys())
        if not missing:
            return found
        with self.engine.connect() as conn:
            rows = decode_rows(
                conn,
                raw(versions_t).where(
                    tuple_(versions_t.c.model, versions_t.c.version).in_(missing)
                ),
                table="model_versions",
                key=("model", "version"),
                decode=_definition,
            )
        read = {(m.name, v): m for v, m in rows}
        with self._lock:
            for key in missing:
                model = read.get(key)
                found[key] = model
                if model is not None:  # a missing row may yet be written: not cached
                    if len(self._models) >= CACHE_SIZE:
                        self._models.pop(next(iter(self._models)))
                    self._models[key] = model
        return found


def _definition(r: Row) -> tuple[str, Model]:
    version = checked(r, "version", str)
    model = parse_model(json_column(r["definition"], "definition", STORED_LIMITS))
    if model.name != checked(r, "model", str):
        raise ValueError(f"the definition is of model {model.name!r}, not {r['model']!r}")
    return version, model
