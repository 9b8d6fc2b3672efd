"""Tokens in the database: issued, revoked and imported, each with its event in the log.

A change of the token table and its event (events.core.token_change) commit together,
in one write section of the log (under the log's lock, so the row's ``revision`` is
its event's position and grows with every change). The caller checks a token's name,
role and scope first (llmgw.api.guards.tokens); here only what the table itself
decides: one token in force per name, and a hash never issued twice, revoked or not.

Reading the table (``read_tokens``) judges nothing either: a row whose lists are not
JSON comes back with the reason in ``unreadable``, for the reader to skip and name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Table, func, insert, select, update

from events.core.token_change import TokenChange, event_for
from events.database.tables import TokenRow
from events.storage.sql_log import SqlLockedLog, SqlLog

t: Table = TokenRow.__table__  # type: ignore[assignment]  # declarative tables are Tables


class TokenClash(Exception):
    """A token that cannot go into the table; the message names each clash and the fix."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What the table holds of a token: never the token itself."""

    name: str
    role: str
    sha256: str
    nodes: tuple[str, ...] = ()
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredToken:
    """One row of the table, as read."""

    id: int
    record: TokenRecord
    issued_at: datetime | None
    issued_by: str
    revoked_at: datetime | None
    revoked_by: str | None
    revision: int
    # Why the row cannot be used (a list column that is not a JSON list of text), or None.
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class ImportOutcome:
    imported: tuple[str, ...]
    # Already in the table, same name and hash: an import run twice changes nothing.
    already: tuple[str, ...]


def issue(log: SqlLog, record: TokenRecord, *, actor: str, reason: str = "") -> int:
    """Store ``record`` and append ``token.issued``; the event's position."""
    with log.writing() as section:
        assert isinstance(section, SqlLockedLog)
        problems = _clashes(section, record)
        if problems:
            raise TokenClash("; ".join(problems))
        return _issue(section, [record], "new", actor, reason)[0]


def import_tokens(
    log: SqlLog, records: Sequence[TokenRecord], *, actor: str, reason: str = ""
) -> ImportOutcome:
    """Store every record not stored yet, all or none: with any clash, nothing is written
    and every clash is named."""
    with log.writing() as section:
        assert isinstance(section, SqlLockedLog)
        fresh: list[TokenRecord] = []
        already: list[str] = []
        problems: list[str] = []
        names: dict[str, str] = {}
        for record in records:
            if record.name in names:
                problems.append(f"the name {record.name!r} is given twice")
                continue
            names[record.name] = record.sha256
            found = _by_hash(section, record.sha256)
            if found is not None and found[2] is None and found[0] == record.name:
                already.append(record.name)
                continue
            problems.extend(_clashes(section, record))
            fresh.append(record)
        if problems:
            raise TokenClash("; ".join(problems))
        if fresh:
            _issue(section, fresh, "import", actor, reason)
    return ImportOutcome(tuple(r.name for r in fresh), tuple(already))


@dataclass(frozen=True, slots=True)
class Revoked:
    change: TokenChange
    # The revoked token's hash: for the caller to tell whether a file lists the same token.
    sha256: str


def revoke(log: SqlLog, name: str, *, actor: str, reason: str = "") -> Revoked | None:
    """Revoke the token in force named ``name`` and append ``token.revoked``; None when no
    token of that name is in force in the table."""
    with log.writing() as section:
        assert isinstance(section, SqlLockedLog)
        rows = section.execute(
            select(t.c.id, t.c.role, t.c.sha256).where(t.c.name == name, t.c.revoked_at.is_(None))
        )
        if not rows:
            return None
        row_id, role, sha256 = rows[0]
        change = TokenChange(name, str(role), revoked=True)
        appended = section.append(
            [event_for(change)], expected_head=None, actor=actor, reason=reason
        )
        event = appended.events[0]
        section.execute(
            update(t)
            .where(t.c.id == row_id)
            .values(revoked_at=event.recorded_at, revoked_by=actor, revision=event.position)
        )
        return Revoked(change, str(sha256))


def read_tokens(engine: Engine, *, revoked: bool = False) -> list[StoredToken]:
    """The table's rows in issue order: those in force, and with ``revoked`` the rest."""
    query = select(t).order_by(t.c.id)
    if not revoked:
        query = query.where(t.c.revoked_at.is_(None))
    with engine.connect() as conn:
        return [_stored(row._mapping) for row in conn.execute(query)]


def revision(engine: Engine) -> int:
    """The position of the last token event that changed the table (0: never changed)."""
    with engine.connect() as conn:
        return int(conn.execute(select(func.coalesce(func.max(t.c.revision), 0))).scalar_one())


def _issue(
    section: SqlLockedLog, records: Sequence[TokenRecord], via: str, actor: str, reason: str
) -> list[int]:
    changes = [
        TokenChange(r.name, r.role, nodes=r.nodes, models=r.models, via=via) for r in records
    ]
    appended = section.append(
        [event_for(c) for c in changes], expected_head=None, actor=actor, reason=reason
    )
    for record, event in zip(records, appended.events, strict=True):
        section.execute(
            insert(t).values(
                name=record.name,
                role=record.role,
                sha256=record.sha256,
                nodes=json.dumps(list(record.nodes)),
                models=json.dumps(list(record.models)),
                issued_at=event.recorded_at,
                issued_by=actor,
                revision=event.position,
            )
        )
    return [e.position for e in appended.events]


def _by_hash(section: SqlLockedLog, sha256: str) -> tuple[Any, ...] | None:
    rows = section.execute(select(t.c.name, t.c.role, t.c.revoked_at).where(t.c.sha256 == sha256))
    return rows[0] if rows else None


def _clashes(section: SqlLockedLog, record: TokenRecord) -> list[str]:
    problems = []
    found = _by_hash(section, record.sha256)
    if found is not None:
        state = "revoked" if found[2] is not None else "in force"
        problems.append(
            f"token {record.name!r}: its hash is already in the database as token "
            f"{found[0]!r} ({state}); a token is issued once: issue a new one "
            f"(`llmgw token new {record.name} --role {record.role}`)"
        )
        return problems
    held = section.execute(
        select(t.c.role).where(t.c.name == record.name, t.c.revoked_at.is_(None))
    )
    if held:
        problems.append(
            f"a token named {record.name!r} ({held[0][0]}) is already in force in the "
            f"database; revoke it first (`llmgw token revoke {record.name}`) or choose "
            "another name"
        )
    return problems


def _stored(row: Any) -> StoredToken:
    problem = None
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("nodes", "models"):
        try:
            value = json.loads(row[key]) if isinstance(row[key], str) else None
        except ValueError:
            value = None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problem = f"{key} is not a JSON list of names"
            value = []
        lists[key] = tuple(value)
    record = TokenRecord(
        str(row["name"]), str(row["role"]), str(row["sha256"]), lists["nodes"], lists["models"]
    )
    return StoredToken(
        id=int(row["id"]),
        record=record,
        issued_at=row["issued_at"],
        issued_by=str(row["issued_by"]),
        revoked_at=row["revoked_at"],
        revoked_by=row["revoked_by"],
        revision=int(row["revision"]),
        unreadable=problem,
    )
