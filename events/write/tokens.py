"""Tokens in the database: issued, revoked and imported, each with its event in the log.

A change of the token table and its event (events.core.token_change) commit together,
in one write section of the log (under the log's lock, so the row's ``revision`` is
its event's position and grows with every change). The caller checks a token's name,
role and scope first (llmgw.api.guards.tokens); here only what the table itself
decides: one token in force per name, and a hash never issued twice, revoked or not.

Reading the table (``read_tokens``) judges nothing of a token either: a row whose columns
cannot be read as their types (a list that is not JSON, a time that is not one, text
that is not text: SQLite stores what it is given) comes back with the reason in
``unreadable``, for the reader to skip and name; the other rows are read as usual.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, Table, Text, TypeDecorator, func, insert, select, type_coerce, update

from catalog.errors import CatalogError
from catalog.forms.client_limits import (
    NO_LIMITS,
    ClientLimits,
    LimitChange,
    LimitError,
    apply,
    from_json,
)
from catalog.reading.documents import Limits, read_json
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
    limits: ClientLimits = NO_LIMITS
    priority_class: str = "standard"
    share: int = 1


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
    # Whether it was revoked (``revoked_at`` is there, even if it cannot be read).
    revoked: bool = False


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


@dataclass(frozen=True, slots=True)
class LimitsChanged:
    change: TokenChange
    position: int


def set_limits(
    log: SqlLog, name: str, change: LimitChange, *, actor: str, reason: str = ""
) -> LimitsChanged | None:
    """Change the limits of the client token in force named ``name`` and append
    ``token.limits_changed`` (before and after); None when no token of that name is in
    force. A change that changes nothing appends nothing (``position`` 0)."""
    with log.writing() as section:
        assert isinstance(section, SqlLockedLog)
        rows = section.execute(
            select(t.c.id, t.c.role, t.c.limits).where(t.c.name == name, t.c.revoked_at.is_(None))
        )
        if not rows:
            return None
        row_id, role, stored = rows[0]
        if role != "client":
            raise TokenClash(f"token {name!r} has the {role} role: only a client token has limits")
        try:
            before = from_json(read_json(stored, "limits", _LIST_LIMITS))
        except (CatalogError, LimitError):
            # A damaged column is replaced whole by what the change gives.
            before = NO_LIMITS
        try:
            after = apply(before, change)
        except LimitError as exc:
            raise TokenClash(str(exc)) from None
        done = TokenChange(name, str(role), limits=after, before=before)
        if after == before:
            return LimitsChanged(done, 0)
        appended = section.append([event_for(done)], expected_head=None, actor=actor, reason=reason)
        event = appended.events[0]
        section.execute(
            update(t)
            .where(t.c.id == row_id)
            .values(limits=json.dumps(after.to_json()), revision=event.position)
        )
        return LimitsChanged(done, event.position)


def read_tokens(engine: Engine, *, revoked: bool = False) -> list[StoredToken]:
    """The table's rows in issue order: those in force, and with ``revoked`` the rest.

    Every column is read as the driver gives it (no type's processing, which would fail
    the whole read on one row's garbage) and judged row by row (``_stored``)."""
    columns = [type_coerce(c, _Raw()) if c.name in _TIMES else c for c in t.c]
    query = select(*columns).order_by(t.c.id)
    if not revoked:
        query = query.where(t.c.revoked_at.is_(None))
    with engine.connect() as conn:
        return [_stored(row._mapping) for row in conn.execute(query)]


def revision(engine: Engine) -> int:
    """The position of the last token event that changed the table (0: never changed).

    A damaged or hostile row can hold anything in ``revision`` (SQLite keeps any value in
    any column, and answers ``max`` with text over numbers): then the answer is a digest
    of the whole table's names and revisions (a small table), negative so that it never
    equals a real position, so a change is still seen; ``read_tokens`` skips and names
    the row itself. Never an exception: the refresh that asks this must go on."""
    with engine.connect() as conn:
        found = conn.execute(select(func.coalesce(func.max(t.c.revision), 0))).scalar_one()
        if isinstance(found, int) and not isinstance(found, bool):
            return found
        rows = conn.execute(select(t.c.name, t.c.revision, t.c.revoked_at).order_by(t.c.name)).all()
    digest = hashlib.sha256(repr([tuple(map(repr, row)) for row in rows]).encode())
    return -1 - int.from_bytes(digest.digest()[:7], "big")


def _issue(
    section: SqlLockedLog, records: Sequence[TokenRecord], via: str, actor: str, reason: str
) -> list[int]:
    changes = [
        TokenChange(
            r.name,
            r.role,
            nodes=r.nodes,
            models=r.models,
            via=via,
            limits=r.limits,
            priority_class=r.priority_class,
            share=r.share,
        )
        for r in records
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
                limits=json.dumps(record.limits.to_json()),
                priority_class=record.priority_class,
                share=record.share,
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


class _Raw(TypeDecorator[Any]):
    """A column read as the driver gives it (a time as text on SQLite)."""

    impl = Text
    cache_ok = True

    def result_processor(self, dialect: Any, coltype: Any) -> None:
        return None


_TIMES = frozenset({"issued_at", "revoked_at"})
# A name list is a few names; a megabyte of one is a hand-edited row, read no further.
_LIST_LIMITS = Limits(max_bytes=1 << 20, max_nodes=100_000)


def _stored(row: Any) -> StoredToken:
    """One row, with the first reason it cannot be used in ``unreadable`` (or None)."""
    problems: list[str] = []
    texts: dict[str, str] = {}
    for key in ("name", "role", "sha256", "issued_by"):
        value = row[key]
        if not isinstance(value, str):
            problems.append(f"{key} is not text")
            value = ""
        texts[key] = value
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("nodes", "models"):
        lists[key] = ()
        try:
            value = read_json(row[key], key, _LIST_LIMITS) if isinstance(row[key], str) else None
        except CatalogError:
            value = None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"{key} is not a JSON list of names")
            continue
        lists[key] = tuple(value)
    limits = NO_LIMITS
    try:
        raw = row["limits"]
        limits = from_json(read_json(raw, "limits", _LIST_LIMITS) if isinstance(raw, str) else 0)
    except (CatalogError, LimitError) as exc:
        problems.append(f"limits cannot be read ({exc})"[:300])
    times: dict[str, datetime | None] = {}
    for key in _TIMES:
        try:
            times[key] = _time(row[key])
        except (TypeError, ValueError):
            problems.append(f"{key} is not a time")
            times[key] = None
    priority_class, share = row["priority_class"], row["share"]
    if not isinstance(priority_class, str):
        problems.append("priority_class is not text")
        priority_class = "standard"
    if not isinstance(share, int) or isinstance(share, bool) or share < 1:
        problems.append("share is not a positive whole number")
        share = 1
    revoked_by = row["revoked_by"]
    revision = row["revision"]
    if not isinstance(revision, int):
        problems.append("revision is not a number")
    record = TokenRecord(
        texts["name"],
        texts["role"],
        texts["sha256"],
        lists["nodes"],
        lists["models"],
        limits,
        priority_class=priority_class,
        share=share,
    )
    return StoredToken(
        id=int(row["id"]),
        record=record,
        issued_at=times["issued_at"],
        issued_by=texts["issued_by"],
        # A row whose revocation time cannot be read but is there is taken as revoked:
        # a damaged row never brings a revoked token back.
        revoked_at=times["revoked_at"],
        revoked_by=revoked_by if isinstance(revoked_by, str) else None,
        revision=revision if isinstance(revision, int) else 0,
        unreadable=problems[0] if problems else None,
        revoked=row["revoked_at"] is not None,
    )


def _time(value: Any) -> datetime | None:
    """A stored time, as ``UTCDateTime`` reads it: SQLite's text, or the driver's value."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"not a time: {type(value).__name__}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
