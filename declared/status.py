"""What the processes watching a declared catalog file made of it, kept in the database.

One row per file (``declared_catalogs``): the digest and definitions in force,
and the refusal of the file as it is now, if it was refused. Written by the
watchers (``declared.reload``), read by ``llmgw status``, ``llmgw rollout
status`` and the API. A row that cannot be read is skipped and named, like any
scheduler row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, insert, update
from sqlalchemy.exc import IntegrityError

from catalog import Catalog, Model, parse_model
from catalog.changes.digest import catalog_digest
from events.database.connection import WRITE
from events.database.tables import DeclaredCatalogRow
from scheduler.persistence.record_format import checked
from scheduler.persistence.row_decoding import STORED_LIMITS, Row, decode_rows, json_column, raw
from scheduler.persistence.tables import table

declared_t = table(DeclaredCatalogRow)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a declared file was not taken: where to edit it, and what to write."""

    file: str
    message: str
    line: int | None = None
    model: str | None = None
    profile: str | None = None
    field: str | None = None

    def text(self) -> str:
        where = f"{self.file}, line {self.line}" if self.line else self.file
        return (
            f"{where}: {self.message} (the previous catalog keeps running; fix the file "
            "and save it, or send SIGHUP, to apply it)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "model": self.model,
            "profile": self.profile,
            "field": self.field,
            "message": self.message,
            "detail": self.text(),
        }

    @classmethod
    def from_json(cls, data: Any) -> Refusal:
        if not isinstance(data, dict):
            raise ValueError("the refusal is not a JSON object")
        line = data.get("line")
        return cls(
            file=checked(data, "file", str),
            message=checked(data, "message", str),
            line=line if type(line) is int else None,
            model=checked(data, "model", str, None),
            profile=checked(data, "profile", str, None),
            field=checked(data, "field", str, None),
        )


@dataclass(frozen=True, slots=True)
class DeclaredStatus:
    path: str
    digest: str
    models: int
    loaded_at: datetime
    refusal: Refusal | None
    refused_at: datetime | None
    by: str
    definitions: tuple[Model, ...] = ()

    def catalog(self) -> Catalog:
        """The declared catalog in force, as the watcher that wrote the row took it."""
        return Catalog.build(list(self.definitions), declared=True)

    @property
    def state(self) -> str:
        """``loaded``: the file as it is now is in force; ``refused``: it is not."""
        return "refused" if self.refusal is not None else "loaded"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "state": self.state,
            "digest": self.digest,
            "models": self.models,
            "loaded_at": _iso(self.loaded_at),
            "refusal": None if self.refusal is None else self.refusal.to_json(),
            "refused_at": None if self.refused_at is None else _iso(self.refused_at),
            "by": self.by,
        }


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def write_loaded(engine: Engine, path: str, catalog: Catalog, *, by: str, now: datetime) -> None:
    """Record that ``catalog`` (read from ``path``) is in force, and nothing refused."""
    models = [m for m in catalog.models() if catalog.is_declared(m.name)]
    values = {
        "digest": catalog_digest(catalog),
        "models": len(models),
        "definitions": json.dumps([m.to_definition() for m in models], separators=(",", ":")),
        "loaded_at": now,
        "refusal": "",
        "refused_at": None,
        "by": by[:255],
    }
    _upsert(engine, path, values)


def write_refused(
    engine: Engine, path: str, refusal: Refusal, in_force: Catalog, *, by: str, now: datetime
) -> None:
    """Record that the file as it is now was refused (the catalog in force stays)."""
    with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
        done = conn.execute(
            update(declared_t)
            .where(declared_t.c.path == path)
            .values(refusal=json.dumps(refusal.to_json()), refused_at=now, by=by[:255])
        )
        if done.rowcount:
            return
    write_loaded(engine, path, in_force, by=by, now=now)
    write_refused(engine, path, refusal, in_force, by=by, now=now)


def _upsert(engine: Engine, path: str, values: dict[str, Any]) -> None:
    # Portable: update, else insert; two watchers inserting at once: the loser updates.
    for _ in range(2):
        with engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            done = conn.execute(update(declared_t).where(declared_t.c.path == path).values(values))
            if done.rowcount:
                return
            try:
                conn.execute(insert(declared_t).values(path=path, **values))
                return
            except IntegrityError:
                conn.rollback()


def read_status(engine: Engine, path: str | None = None) -> list[DeclaredStatus]:
    """The rows (of ``path`` if given), each readable one; the others skipped and named."""
    query = raw(declared_t).order_by(declared_t.c.path)
    if path is not None:
        query = query.where(declared_t.c.path == path)
    with engine.connect() as conn:
        return decode_rows(
            conn,
            query,
            table="declared_catalogs",
            key=("path",),
            decode=_status,
            times=("loaded_at",),
            nullable_times=("refused_at",),
        )


def _status(r: Row) -> DeclaredStatus:
    refusal_text = checked(r, "refusal", str)
    definitions = json_column(r["definitions"], "definitions", STORED_LIMITS)
    if not isinstance(definitions, list):
        raise ValueError("definitions is not a list")
    return DeclaredStatus(
        path=checked(r, "path", str),
        digest=checked(r, "digest", str),
        models=checked(r, "models", int),
        loaded_at=r["loaded_at"],
        refusal=Refusal.from_json(json_column(refusal_text, "refusal")) if refusal_text else None,
        refused_at=r["refused_at"],
        by=checked(r, "by", str),
        definitions=tuple(parse_model(d) for d in definitions),
    )
