"""Snapshots of replay state, so that start-up replays only the events after one.

A snapshot holds what replay needs to continue exactly where it stopped: the
position, the runtime models in the order they were accepted (the declared
ones come from catalog.yaml), and the applied and skipped counts (the lists
themselves stay out: ``llmgw replay`` always replays in full and names them).

It is only used when it provably belongs to the present:

- **the declared configuration**: the digest of the declared catalog it was
  built with (catalog.changes.digest). Declared models win every conflict, so a changed
  catalog.yaml can change which runtime events apply; such a snapshot is ignored.
- **the code**: the snapshot format, the event schema versions (CURRENT_SCHEMA)
  and the llmgw version that wrote it. A release may judge events differently.
- **the log**: the chain hash of the event at its position. A log rewritten,
  truncated or restored from an older backup under the snapshot no longer
  matches, and the snapshot is ignored.
- **itself**: a sha256 checksum over every column. Damaged or hand-edited,
  it is ignored.
- **its author**, when a snapshot key is configured (``LLMGW_SNAPSHOT_KEY``,
  held outside the database): an HMAC-SHA256 under that key over the same
  content. The checksum catches accidents only; anyone who can write the
  table can recompute it, and a snapshot is trusted as the catalog. With a
  key, a snapshot whose MAC does not match, or taken without one, is refused
  (``catalog.snapshot_refused``) and the catalog is rebuilt by replay. Without
  a key, a forged snapshot is caught by ``llmgw verify`` (which replays the
  log to each snapshot's position, events.audit.snapshot_check), not at start-up.

An ignored snapshot is named in a ``catalog.snapshot_ignored`` warning with
the reason and is never trusted; replay then starts from the beginning (or from
an older snapshot that does match), and the read model replaces it after catching
up (events.read.model). Restoring validates each model's types (pydantic, one call for the whole
list) and re-checks each addition against the catalog (names, aliases,
fallbacks), which is cheap; it skips re-parsing events, which is not.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from importlib import metadata
from typing import Any, Protocol

import structlog
from pydantic import TypeAdapter, ValidationError
from sqlalchemy import Engine, Row, Table, delete, func, insert, select
from sqlalchemy.exc import SQLAlchemyError

from catalog import Catalog, CatalogError, CatalogState, Model
from catalog.changes.digest import catalog_digest
from events.core.types import CURRENT_SCHEMA
from events.database.connection import WRITE
from events.database.tables import EventRow, SnapshotRow
from events.read.replay import Replayer

log = structlog.get_logger("llmgw.catalog")

# Bump when what a snapshot holds, or how it is read, changes, or when replay's
# rules change what it accepts: a snapshot is trusted without being validated
# again. 2: the identifier grammar (catalog.definition.identifiers), under which an older
# snapshot may hold a name that replay now skips.
SNAPSHOT_FORMAT = 2
# How many snapshots are kept; older ones are deleted when a new one is taken.
KEEP = 3

s: Table = SnapshotRow.__table__  # type: ignore[assignment]
e: Table = EventRow.__table__  # type: ignore[assignment]
_MODELS = TypeAdapter(list[Model])


@cache
def code_version() -> str:
    """What a snapshot is bound to on the code's side."""
    try:
        release = metadata.version("llmgw-control")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        release = "unknown"
    schema = ",".join(f"{t}:{v}" for t, v in sorted(CURRENT_SCHEMA.items()))
    return f"format={SNAPSHOT_FORMAT};events={schema};llmgw={release}"


def stored_models(text: str) -> list[Model]:
    """The runtime models a snapshot holds (raises pydantic's ValidationError)."""
    return _MODELS.validate_json(text)


class SnapshotIgnored(Exception):
    """Why a stored snapshot cannot be used."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    id: int
    position: int
    model_count: int
    applied_count: int
    skipped_count: int
    declared_digest: str
    created_at: datetime
    size: int


@dataclass(frozen=True, slots=True)
class Restored:
    """What ``SnapshotStore.load`` found: a replayer to continue from, and whether the
    newest snapshot had to be ignored (then it is worth replacing)."""

    replayer: Replayer | None
    ignored: bool


_CHECKED = (
    "position",
    "event_hash",
    "declared_digest",
    "code_version",
    "applied_count",
    "skipped_count",
    "model_count",
)


def _content(row: Mapping[Any, Any]) -> bytes:
    """Every column that matters, the models last: what the checksum and the MAC cover."""
    head = "".join(f"{'' if row[k] is None else row[k]}\n" for k in _CHECKED)
    return head.encode("utf-8") + str(row["models"]).encode("utf-8")


def _checksum(row: Mapping[Any, Any]) -> str:
    return hashlib.sha256(_content(row)).hexdigest()


def checksum_problem(row: Mapping[Any, Any]) -> str | None:
    """Why a stored snapshot is damaged, if it is (an accident: anyone can recompute it)."""
    if _checksum(row) != row["checksum"]:
        return "checksum mismatch: the snapshot was changed after it was taken"
    return None


def snapshot_mac(key: bytes, row: Mapping[Any, Any]) -> str:
    """HMAC-SHA256 of a snapshot's content under the snapshot key."""
    return hmac.new(key, _content(row), hashlib.sha256).hexdigest()


def authenticity_problem(key: bytes | None, row: Mapping[Any, Any]) -> str | None:
    """Why a stored snapshot cannot be trusted as written by a holder of the key, if so."""
    if key is None:
        return None
    if row["mac"] is None:
        return (
            "it carries no MAC but a snapshot key is configured: it was taken without the "
            "key (by a process not given LLMGW_SNAPSHOT_KEY) or written by hand"
        )
    if not hmac.compare_digest(snapshot_mac(key, row), str(row["mac"])):
        return (
            "its MAC does not match under the configured snapshot key: it was written by "
            "someone without the key, or under another key"
        )
    return None


class Snapshots(Protocol):
    """Where the read model saves and restores replay state: ``SnapshotStore`` below, or
    any object with these methods (``events.read.model`` and ``events.read.time_travel`` take one).
    """

    def load(
        self, declared: Catalog, config_path: str = "catalog.yaml", *, at_most: int | None = None
    ) -> Restored: ...

    def try_load(self, declared: Catalog, config_path: str = "catalog.yaml") -> Restored: ...

    def try_save(self, replayer: Replayer, declared: Catalog) -> SnapshotInfo | None: ...


class SnapshotStore:
    """Snapshots in the ``catalog_snapshots`` table of one database; ``key`` is the
    snapshot key (None: snapshots are taken and trusted without a MAC)."""

    def __init__(self, engine: Engine, key: bytes | None = None) -> None:
        self.engine = engine
        self.key = key

    # -- taking -----------------------------------------------------------

    def save(self, replayer: Replayer, declared: Catalog) -> SnapshotInfo:
        """Store the replayer's state as of its position; keeps the newest ``KEEP``."""
        started = time.perf_counter()
        models = replayer.state.runtime_models()
        text = _MODELS.dump_json(list(models)).decode("utf-8")
        digest = catalog_digest(declared)
        code = code_version()
        position = replayer.position
        now = datetime.now(UTC)
        with self.engine.connect().execution_options(**{WRITE: True}) as conn, conn.begin():
            event_hash = (
                conn.execute(select(e.c.hash).where(e.c.position == position)).scalar()
                if position
                else None
            )
            row: dict[str, Any] = {
                "position": position,
                "event_hash": event_hash,
                "declared_digest": digest,
                "code_version": code,
                "applied_count": replayer.applied_count,
                "skipped_count": replayer.skipped_count,
                "model_count": len(models),
                "models": text,
                "created_at": now,
            }
            row["checksum"] = _checksum(row)
            row["mac"] = None if self.key is None else snapshot_mac(self.key, row)
            new_id = int(conn.execute(insert(s).values(**row).returning(s.c.id)).scalar_one())
            keep = select(s.c.id).order_by(s.c.id.desc()).limit(KEEP).scalar_subquery()
            conn.execute(delete(s).where(s.c.id.not_in(keep)))
        info = SnapshotInfo(
            new_id,
            position,
            len(models),
            row["applied_count"],
            row["skipped_count"],
            digest,
            now,
            len(text),
        )
        log.info(
            "catalog.snapshot_taken",
            snapshot=new_id,
            position=position,
            models=len(models),
            bytes=len(text),
            ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return info

    def try_save(self, replayer: Replayer, declared: Catalog) -> SnapshotInfo | None:
        """``save``, or None if the database refused (a read-only replica, a lock held
        too long): nothing depends on a snapshot, so the refusal is logged, not raised."""
        try:
            return self.save(replayer, declared)
        except SQLAlchemyError as exc:
            log.warning("catalog.snapshot_failed", position=replayer.position, error=str(exc))
            return None

    # -- restoring --------------------------------------------------------

    def try_load(self, declared: Catalog, config_path: str = "catalog.yaml") -> Restored:
        """``load`` for a start-up: a database that cannot be read for snapshots (e.g. not
        yet migrated to them) restores nothing, and replay starts from the beginning."""
        try:
            return self.load(declared, config_path)
        except SQLAlchemyError as exc:
            log.warning("catalog.snapshot_ignored", reason=f"cannot read snapshots: {exc}")
            return Restored(None, ignored=False)

    def load(
        self, declared: Catalog, config_path: str = "catalog.yaml", *, at_most: int | None = None
    ) -> Restored:
        """The newest usable snapshot (at or before ``at_most``) as a replayer, if any."""
        digest = catalog_digest(declared)
        code = code_version()
        query = select(s).order_by(s.c.position.desc(), s.c.id.desc()).limit(1)
        if at_most is not None:
            query = query.where(s.c.position <= at_most)
        with self.engine.connect() as conn:
            newest = conn.execute(query).first()
            if newest is None:
                return Restored(None, ignored=False)
            candidate = newest
            if (newest.declared_digest, newest.code_version) != (digest, code):
                _ignored(newest, _binding_reason(newest, digest, code))
                bound = conn.execute(
                    query.where(s.c.declared_digest == digest, s.c.code_version == code)
                ).first()
                if bound is None:
                    return Restored(None, ignored=True)
                candidate = bound
        # A damaged snapshot is ignored below, as an accident; one intact but not
        # written by a holder of the key is refused, as what it may be: a forgery.
        row = candidate._mapping
        problem = None if checksum_problem(row) else authenticity_problem(self.key, row)
        if problem is not None:
            log.warning(
                "catalog.snapshot_refused",
                snapshot=candidate.id,
                position=candidate.position,
                reason=problem,
                action="rebuilding the catalog by replaying the log",
            )
            return Restored(None, ignored=True)
        try:
            replayer = self._restore(candidate, declared, config_path)
        except SnapshotIgnored as exc:
            _ignored(candidate, str(exc))
            return Restored(None, ignored=True)
        except Exception as exc:
            # Whatever else a damaged row makes fail (a column of the wrong type, a
            # structure too deep to validate), it is a snapshot not to trust: replay
            # from the log instead, and say so.
            _ignored(candidate, f"it cannot be read ({type(exc).__name__}: {str(exc)[:200]})")
            return Restored(None, ignored=True)
        return Restored(replayer, ignored=candidate is not newest)

    def _restore(self, row: Row[Any], declared: Catalog, config_path: str) -> Replayer:
        started = time.perf_counter()
        damaged = checksum_problem(row._mapping)
        if damaged is not None:
            raise SnapshotIgnored(damaged)
        try:
            models = _MODELS.validate_json(row.models)
        except ValidationError as exc:
            raise SnapshotIgnored(f"its models cannot be read: {_first_error(exc)}") from None
        if len(models) != row.model_count:
            raise SnapshotIgnored(f"it holds {len(models)} models, not {row.model_count}")
        if row.position:
            with self.engine.connect() as conn:
                event = conn.execute(
                    select(e.c.position, e.c.hash).where(e.c.position == row.position)
                ).first()
            if event is None:
                raise SnapshotIgnored(
                    f"the log has no position {row.position}: it was truncated or replaced "
                    "since the snapshot was taken"
                )
            if row.event_hash is not None and event.hash != row.event_hash:
                raise SnapshotIgnored(
                    f"the event at position {row.position} is not the one the snapshot was "
                    "built from: the log was rewritten since"
                )
        try:
            state = CatalogState.restore(declared, models, config_path=config_path)
        except CatalogError as exc:
            raise SnapshotIgnored(f"it does not fit the declared catalog: {exc}") from None
        replayer = Replayer.resume(
            state, row.position, applied=row.applied_count, skipped=row.skipped_count
        )
        log.info(
            "catalog.snapshot_restored",
            snapshot=row.id,
            position=row.position,
            models=row.model_count,
            skipped_before=row.skipped_count,
            ms=round((time.perf_counter() - started) * 1000, 1),
        )
        return replayer

    def taken(self) -> list[SnapshotInfo]:
        """Every stored snapshot, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    s.c.id,
                    s.c.position,
                    s.c.model_count,
                    s.c.applied_count,
                    s.c.skipped_count,
                    s.c.declared_digest,
                    s.c.created_at,
                    func.length(s.c.models),
                ).order_by(s.c.id)
            ).all()
        return [SnapshotInfo(*row) for row in rows]


def _binding_reason(row: Row[Any], digest: str, code: str) -> str:
    if row.declared_digest != digest:
        return (
            "the declared configuration changed since it was taken (declared digest "
            f"{row.declared_digest[:12]}, now {digest[:12]}); declared models win conflicts, "
            "so the runtime events must be judged again"
        )
    return f"it was written by other code ({row.code_version}; this is {code})"


def _ignored(row: Row[Any], reason: str) -> None:
    log.warning("catalog.snapshot_ignored", snapshot=row.id, position=row.position, reason=reason)


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])
