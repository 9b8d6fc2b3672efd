"""What every command needs: settings, the migrated store, the declared catalog."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, TextIO

from catalog.forms.text import guard_line
from llmgw.cli.shared import times
from llmgw.settings import Settings, SettingsError

# What a command uses is imported when it first uses it (the properties below): a
# command that never opens the database never loads SQLAlchemy (llmgw.cli.shared.parser).
if TYPE_CHECKING:
    from sqlalchemy import Engine

    from catalog import Catalog
    from events.catalog_service import CatalogService
    from events.storage.sql_log import SqlLog

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C outside --watch and --follow


class Refused(Exception):
    """A command refused for a reason the operator can act on (exit status 1)."""


@dataclass
class App:
    settings: Settings

    @cached_property
    def engine(self) -> Engine:
        from events.database.migrate import ensure_schema

        engine = open_engine(self.settings.database_url)
        # An empty database is migrated on first use, so the first command just works.
        ensure_schema(engine)
        return engine

    @cached_property
    def scheduler_engine(self) -> Engine:
        """The scheduler's engine: on PostgreSQL its own, with the leader's keepalives and
        timeouts (``events.database.connection.bounded_engine``); on SQLite, ``engine``
        (an in-memory database is private to its engine)."""
        from sqlalchemy.engine import make_url

        from events.database.connection import bounded_engine

        engine = self.engine  # migrated first
        if make_url(self.settings.database_url).get_backend_name() == "sqlite":
            return engine
        return bounded_engine(self.settings.database_url, self.settings.lease_s)

    @cached_property
    def store(self) -> SqlLog:
        from events.storage.backends import open_log

        return open_log(self.engine)

    @cached_property
    def declared(self) -> Catalog:
        from catalog import Catalog, load_declared

        path = self.settings.config_path
        if path is None:
            return Catalog.build([])
        return load_declared(path)

    @property
    def config_label(self) -> str:
        path = self.settings.config_path
        return str(path) if path is not None else "the declared configuration (catalog.yaml)"

    @cached_property
    def service(self) -> CatalogService:
        from events.catalog_service import CatalogService

        return CatalogService(
            self.store, self.declared, self.config_label, snapshot_key=self.snapshot_key
        )

    @cached_property
    def snapshot_key(self) -> bytes | None:
        try:
            return self.settings.snapshot_key
        except SettingsError as exc:
            raise Refused(str(exc)) from None


def open_engine(url: str) -> Engine:
    """An engine, or a one-line refusal that shows the forms a URL takes."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from events.database.connection import make_engine, session_connect_args

    try:
        if make_url(url).get_backend_name() == "postgresql":
            # A replica frozen mid-transaction must not hold the others' writes for long.
            return make_engine(url, connect_args=session_connect_args())
        return make_engine(url)
    except (ArgumentError, NoSuchModuleError) as exc:
        shown = url if len(url) <= 200 else url[:200] + "..."
        raise Refused(
            f"{shown!r} is not a database URL this release can use ({exc}); write "
            "sqlite:///path/to/llmgw.db or postgresql://user@host:5432/llmgw "
            "(--db, LLMGW_DATABASE_URL or [database] url in llmgw.toml)"
        ) from None


@contextmanager
def refusals() -> Iterator[None]:
    """Turn the domain's refusals into exit status 1 with the message on stderr."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, (*_loaded(_REFUSALS), Refused, SettingsError)):
            raise SystemExitWith(EXIT_REFUSED, f"error: {exc}") from None
        if isinstance(exc, _loaded(_DATABASE)):
            # The driver's message can run to several lines; the first says what failed.
            cause = getattr(exc, "orig", None) or exc
            first = (str(cause).strip().splitlines() or ["unknown error"])[0]
            raise SystemExitWith(EXIT_REFUSED, f"error: cannot use the database: {first}") from None
        raise


# The domain's refusals, by module and class. They are looked up among the modules
# already imported: an exception of a class whose module was never imported cannot be
# raised, and importing them here would load the database and the models for every
# command (llmgw.cli.shared.parser).
_REFUSALS = (
    ("catalog.errors", "CatalogError"),
    ("events.write.commands", "CommandConflict"),
    ("events.write.tokens", "TokenClash"),
    ("events.database.migrate", "UnknownSchema"),
)
_DATABASE = (("sqlalchemy.exc", "OperationalError"),)


def _loaded(names: tuple[tuple[str, str], ...]) -> tuple[type[BaseException], ...]:
    return tuple(getattr(sys.modules[m], c) for m, c in names if m in sys.modules)


class GuardedStream:
    """A text stream whose writes cannot put a control character on the terminal.

    The net under ``shown`` (catalog.forms.text): every value a command prints goes
    through ``shown``; anything unprintable a formatter still let through
    (other than the newlines that end lines) is escaped here.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(guard_line(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def guarded_output() -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    sys.stdout = GuardedStream(saved[0])
    sys.stderr = GuardedStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


class SystemExitWith(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def parse_when(text: str) -> datetime:
    """An ISO-8601 time (UTC without a zone, the log's zone), or a relative one such as
    ``1h`` or ``yesterday`` (see llmgw.cli.shared.times)."""
    try:
        return times.parse_when(text)
    except times.BadTime as exc:
        raise Refused(str(exc)) from None


def resolve_position(app: App, at: str | None) -> int | None:
    """A position as given, or the last position recorded at or before a time.

    A position past the log's head is refused: answering with the head would
    show a catalog the log never had at that position, as if it had.
    """
    if at is None:
        return None
    if at.isdigit():
        position = int(at)
        head = app.store.head()
        if position > head:
            raise Refused(
                f"position {position} is past the log's head ({head}): nothing is recorded "
                "there yet; `llmgw history` lists the positions"
            )
        return position
    return app.store.position_at(parse_when(at))
