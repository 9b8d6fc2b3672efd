"""The tokens a server checks bearer tokens against, kept current from the database.

Two sources: the tokens configured at start (the auth file, ``LLMGW_TOKENS``: a
bootstrap operator, existing installs) and the token table (``llmgw token new|revoke|
import``: events.write.tokens). A request's check is a dictionary look-up in the book
made last (``book``): it never waits on the database. The book is made again by
``refresh``, which asks the table's ``max(revision)`` (one indexed read) and reads the
rows only when that moved. ``TokenRefresher`` calls it every ``REFRESH_S`` and, on
PostgreSQL, as soon as a change is notified (llmgw.api.runtime.changes): a token
revoked anywhere is refused here within ``REFRESH_S`` plus one read, within a few
milliseconds on PostgreSQL.

A hash revoked in the table is refused even where the auth file still lists it (the
table records revocations; the file does not), and a hash in force in the table is
taken with the table's name, role and scope. A row that cannot be used (a role this
release does not know, a malformed list) is skipped and named once in the log
(``api.token_row_skipped``); the others still work.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import structlog
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from events.write.tokens import StoredToken, read_tokens, revision
from llmgw.api.guards.tokens import TokenBook, TokenConfigError, TokenEntry

log = structlog.get_logger("llmgw.api")

# How often the table's revision is asked when nothing is notified: a revoked token is
# refused within this (plus one read) on every replica, also on SQLite.
REFRESH_S = 0.5


def entry_of(row: StoredToken) -> TokenEntry:
    """The row as a configured token, checked as an auth file's entry is."""
    if row.unreadable is not None:
        raise TokenConfigError(f"tokens row {row.id}: {row.unreadable}")
    r = row.record
    return TokenEntry.checked(
        r.name,
        r.role,
        r.sha256,
        r.nodes,
        f"tokens row {row.id}",
        models=r.models,
        limits=r.limits,
        priority_class=r.priority_class,
        share=r.share,
    )


class LiveTokens:
    """The configured tokens and the table's, as one book (see the module's docstring)."""

    def __init__(self, configured: Sequence[TokenEntry], engine: Engine | None) -> None:
        self._configured = tuple(configured)
        self._engine = engine
        self._lock = threading.Lock()
        self._revision = -1
        self._skipped: set[tuple[int, str]] = set()
        self._book = TokenBook(self._configured)
        self._stored: tuple[TokenEntry, ...] = ()

    @property
    def book(self) -> TokenBook:
        return self._book

    def stored(self) -> tuple[TokenEntry, ...]:
        """The table's tokens in force, as of the last refresh."""
        return self._stored

    def counts(self) -> dict[str, int]:
        """How many tokens the book holds, by source: ``database`` and ``configured``."""
        stored = len(self._stored)
        return {"database": stored, "configured": len(self._book) - stored}

    def first_refresh(self) -> None:
        """``refresh``, where a failure leaves the configured tokens alone in force until
        the refresher's next attempt (a database without the table yet: an app built to
        render its API document)."""
        try:
            self.refresh()
        except SQLAlchemyError as exc:
            log.warning("api.tokens_refresh_failed", error=str(getattr(exc, "orig", exc))[:300])

    def refresh(self) -> bool:
        """Make the book again if the table changed; whether it did. Raises the
        database's error (the caller keeps the last book)."""
        if self._engine is None:
            return False
        with self._lock:
            now = revision(self._engine)
            if now == self._revision:
                return False
            rows = read_tokens(self._engine, revoked=True)
            self._book, self._stored = self._made(rows)
            self._revision = now
            return True

    def _made(self, rows: Sequence[StoredToken]) -> tuple[TokenBook, tuple[TokenEntry, ...]]:
        revoked = {r.record.sha256 for r in rows if r.revoked}
        stored: list[TokenEntry] = []
        for row in rows:
            if row.revoked:
                continue
            try:
                stored.append(entry_of(row))
            except TokenConfigError as exc:
                key = (row.id, str(exc))
                if key not in self._skipped:
                    self._skipped.add(key)
                    log.warning("api.token_row_skipped", row=row.id, reason=str(exc)[:300])
        taken = revoked | {e.sha256 for e in stored}
        configured = [e for e in self._configured if e.sha256 not in taken]
        return TokenBook([*configured, *stored]), tuple(stored)


class TokenRefresher:
    """A thread that refreshes ``tokens`` every ``interval`` and whenever ``wake`` is set."""

    def __init__(self, tokens: LiveTokens, interval: float = REFRESH_S) -> None:
        self.tokens = tokens
        self.interval = interval
        self.wake = threading.Event()
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="llmgw-tokens", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.wake.wait(self.interval)
            self.wake.clear()
            if self._stop.is_set():
                return
            try:
                if self.tokens.refresh():
                    log.info("api.tokens_refreshed", stored=len(self.tokens.stored()))
                if self._failing:
                    self._failing = False
                    log.info("api.tokens_refresh_back")
            except Exception as exc:  # any failure means the same: keep the last book, retry
                # The last book stays in force: a database outage refuses nobody new.
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "api.tokens_refresh_failed", error=str(getattr(exc, "orig", exc))[:300]
                    )
