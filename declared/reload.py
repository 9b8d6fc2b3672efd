"""Taking a changed declared catalog file while running: whole, or not at all.

``check`` looks at the file (a ``stat``; the content only when that changed,
or when asked to by SIGHUP) and, when its content changed:

- loads and validates it whole (``catalog.load_declared``: every model, the
  engines, the catalog's rules across models). Valid: every catalog service of
  this process runs with it from now on, and ``catalog.declared_changed`` is
  appended to the log (old and new digest, the models added, removed and
  changed), so `llmgw history` shows when configuration changed; a rollout of
  the changed models follows like any other (replicas are pinned to their
  version, ``scheduler.persistence.versions``).
- Invalid: nothing changes (the catalog in force keeps running); the refusal
  names the file, the line, the model, the field and the fix, and is logged
  (``catalog.declared_refused``), kept for ``/readyz`` and the dashboard
  (``last``), counted in the metrics (``on_outcome``) and written to the
  database for ``llmgw status`` (``declared.status``).

A file whose content changed only in ways the catalog ignores (a comment, key
order) changes nothing and records nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import structlog

from catalog import Catalog, CatalogError, load_declared
from catalog.changes.digest import catalog_digest
from catalog.reading.documents import FILE_LIMITS, read_regular
from declared.locate import line_of
from declared.status import Refusal, read_status, write_loaded, write_refused
from events.core.declared_change import DeclaredChange, declared_change

log = structlog.get_logger("llmgw.catalog")

APPLIED, REFUSED, UNCHANGED = "applied", "refused", "unchanged"


class Reloadable(Protocol):
    """A catalog service (events.catalog_service.CatalogService) as a reload uses it."""

    def reload_declared(self, declared: Catalog) -> None: ...


class Recorder(Protocol):
    def record_declared(self, change: DeclaredChange, *, actor: str, key: str) -> object: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one look at a changed file led to."""

    result: str  # APPLIED, REFUSED or UNCHANGED
    digest: str  # the declared catalog's digest in force after it
    change: DeclaredChange | None = None
    refusal: Refusal | None = None
    at: datetime | None = None


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class DeclaredReloader:
    def __init__(
        self,
        path: Path,
        current: Catalog,
        services: Sequence[Reloadable],
        recorder: Recorder,
        *,
        engine: object | None = None,
        by: str = "",
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.path = path
        self.current = current
        self.services = list(services)
        self.recorder = recorder
        self.engine = engine
        self.by = by
        self.on_outcome = on_outcome
        self._signature = _signature(path)
        self._content = self._content_digest()
        # The last refusal (None while the file as it is now is in force).
        self.last: Outcome = Outcome(UNCHANGED, catalog_digest(current), at=datetime.now(UTC))

    def _content_digest(self) -> str | None:
        # Never blocks, never reads without end: a FIFO or a device put in the file's
        # place once froze this thread, and every later reload with it (issue 36).
        try:
            return hashlib.sha256(self._read()).hexdigest()
        except CatalogError:
            return None

    def _read(self) -> bytes:
        return read_regular(self.path, "declared catalog", FILE_LIMITS.max_bytes)

    def start(self) -> None:
        """Record the catalog in force at start-up; if the file changed while nothing
        ran (the row kept says another digest), record that change as well."""
        if self.engine is None:
            return
        from sqlalchemy import Engine

        assert isinstance(self.engine, Engine)
        now = datetime.now(UTC)
        kept = read_status(self.engine, str(self.path))
        new_digest = catalog_digest(self.current)
        if kept and kept[0].digest != new_digest:
            change = declared_change(kept[0].catalog(), self.current, str(self.path))
            self._record(change, f"start-{self._signature[0] if self._signature else 0}")
        write_loaded(self.engine, str(self.path), self.current, by=self.by, now=now)

    def check(self, *, force: bool = False) -> Outcome | None:
        """Look at the file; take it if its content changed (None: nothing to look at)."""
        signature = _signature(self.path)
        if not force and signature == self._signature:
            return None
        self._signature = signature
        content = self._content_digest()
        if content is not None and content == self._content:
            return None  # touched, or written back as it was: already judged
        self._content = content
        now = datetime.now(UTC)
        try:
            self._refuse_emptied()
            new = load_declared(self.path)
        except CatalogError as exc:
            return self._refused(exc, now)
        old_digest, new_digest = catalog_digest(self.current), catalog_digest(new)
        if new_digest == old_digest:
            outcome = Outcome(UNCHANGED, new_digest, at=now)
        else:
            change = declared_change(self.current, new, str(self.path))
            for service in self.services:
                service.reload_declared(new)
            self.current = new
            mtime = signature[0] if signature is not None else 0
            self._record(change, f"{mtime}")
            log.info(
                "catalog.declared_reloaded",
                path=str(self.path),
                old_digest=change.old_digest,
                new_digest=change.new_digest,
                added=list(change.added),
                removed=list(change.removed),
                changed=list(change.changed),
            )
            outcome = Outcome(APPLIED, new_digest, change=change, at=now)
        if self.engine is not None:
            from sqlalchemy import Engine

            assert isinstance(self.engine, Engine)
            write_loaded(self.engine, str(self.path), self.current, by=self.by, now=now)
        if self.last.refusal is not None:
            log.info("catalog.declared_refusal_cleared", path=str(self.path))
        return self._done(outcome)

    def _refuse_emptied(self) -> None:
        """Refuse a file with nothing in it while models are declared.

        Why: a file written in place (a shell's ``>``, an editor that truncates first)
        is empty for a moment, and an empty document reads as "no models": a reload
        caught in that moment would remove every declared model, and the leader's next
        round would unplace them all. Removing them all is said with ``models: []``."""
        if not len(self.current):
            return
        try:
            raw = self._read()
        except CatalogError:
            return  # load_declared refuses it, naming why
        if raw.strip():
            return
        raise CatalogError(
            f"{self.path}: the file is empty (written in place and caught half way?); the "
            f"{len(self.current)} declared model(s) are kept. To remove every declared "
            "model, write `models: []`; to change the file safely, write another file "
            "and rename it over this one"
        )

    def _record(self, change: DeclaredChange, stamp: str) -> None:
        # One event per change however many processes watch the file: the same key.
        key = f"declared-{change.old_digest[:16]}-{change.new_digest[:16]}-{stamp}"[:128]
        try:
            self.recorder.record_declared(change, actor=self.by[:128], key=key)
        except Exception as exc:  # the catalog is taken; the record of it is not the catalog
            log.error("catalog.declared_record_failed", path=str(self.path), error=repr(exc))

    def _refused(self, exc: CatalogError, now: datetime) -> Outcome:
        text = ""
        with suppress(CatalogError):
            text = self._read().decode("utf-8", errors="replace")
        message = exc.message
        # The refusal names the file itself (load_declared's prefix); ``text()`` adds
        # the file and the line in front, once.
        if message.startswith(str(self.path)):
            message = message[len(str(self.path)) :].lstrip(": ")
        refusal = Refusal(
            file=str(self.path),
            message=message,
            line=line_of(text, exc.message, model=exc.model, profile=exc.profile, field=exc.field)
            if text and len(text) <= (16 << 20)
            else None,
            model=exc.model,
            profile=exc.profile,
            field=exc.field,
        )
        log.error(
            "catalog.declared_refused",
            path=refusal.file,
            line=refusal.line,
            model=refusal.model,
            profile=refusal.profile,
            field=refusal.field,
            reason=refusal.message,
            detail=refusal.text(),
            digest_in_force=catalog_digest(self.current),
        )
        if self.engine is not None:
            from sqlalchemy import Engine

            assert isinstance(self.engine, Engine)
            write_refused(self.engine, refusal.file, refusal, self.current, by=self.by, now=now)
        return self._done(Outcome(REFUSED, catalog_digest(self.current), refusal=refusal, at=now))

    def _done(self, outcome: Outcome) -> Outcome:
        self.last = outcome
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        return outcome
