"""The catalog as of the log's head: the one read model the CLI, the API and the daemon use.

It owns replay (events.read.replay) over a ``Log``, the snapshot policy and the
only cache of the catalog. It keeps its replay state between calls and reads
only what was appended since, so a long-lived process (the daemon, an API
server, a benchmark) pays for each event once. The first catch-up starts from
the newest usable snapshot (events.read.snapshots) rather than from the beginning
of the log, and a catch-up over ``snapshot_every`` events or more takes a new
one (``snapshot_every=None``: never), as does the first one after a snapshot
had to be ignored. A ``ReplayResult`` from a model restored from a snapshot
lists only the events after it.

Thread-safe: replay state changes only under ``lock``, which the commands
(events.write.commands) also hold while they validate against it. A reader asking
for ``view`` does not take the lock when nothing changed: the catalog is
cached with its log position, and the log's head is asked at most every
``max_age`` seconds (one indexed query, but it costs more than the rest of an
API read). A write applies its own events before it returns and drops the
cached view (the next read builds it), so a writer sees its own change.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import structlog

from catalog import Catalog, CatalogState, Model
from events.core.rows import ReplayEvent
from events.core.types import DEFINITION_TYPES, StoredEvent
from events.read.replay import Replayer, ReplayResult
from events.read.time_travel import catalog_at
from events.storage.log import LockedLog, Log

if TYPE_CHECKING:
    from events.read.snapshots import Snapshots

log = structlog.get_logger("llmgw.catalog")

# A snapshot is taken after catching up on this many events (bench/events/replay.py
# measures replay's rate; at any rate it has measured, a start-up replays a
# small fraction of a second past a snapshot), and whenever one was ignored.
SNAPSHOT_EVERY = 2_000


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cycle collector while catching up with the log.

    Replay allocates many objects that all live on (the catalog's models), so
    the collector runs again and again over a growing heap and finds nothing:
    about a quarter of a start-up's replay. Replay makes no reference cycles
    worth collecting mid-way; the collector resumes (if it was running) when
    the catch-up ends, however it ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class CatalogView:
    """The catalog as of a log position, and how many events replay skipped."""

    position: int
    catalog: Catalog
    skipped: int


class CatalogReadModel:
    def __init__(
        self,
        events: Log,
        declared: Catalog,
        config_path: str = "catalog.yaml",
        *,
        snapshots: Snapshots | None = None,
        snapshot_every: int | None = SNAPSHOT_EVERY,
        max_age: float = 0.0,
    ) -> None:
        self.log = events
        self.declared = declared
        self.config_path = config_path
        self.snapshots = snapshots
        self.snapshot_every = snapshot_every if snapshots is not None else None
        self.max_age = max_age
        self.lock = threading.RLock()
        self._replayer = Replayer.start(declared, config_path)
        self._started = False
        self._since_snapshot = 0
        self._replace_snapshot = False
        # The cache: the catalog as of the replay state it was taken from (a
        # snapshot copies the whole catalog; most catch-ups find nothing new).
        self._catalog: Catalog | None = None
        self._catalog_of: tuple[int, int] = (0, -1)  # (id of the replayer, applied count)
        self._view: CatalogView | None = None
        self._checked = 0.0  # time.monotonic() of the last look at the log's head

    # -- reading ----------------------------------------------------------

    @property
    def position(self) -> int:
        return self._replayer.position

    @property
    def state(self) -> CatalogState:
        """The replay state itself, for commands to validate against (hold ``lock``)."""
        return self._replayer.state

    def refresh(self) -> ReplayResult:
        """Catch up with the log; the replay as of its head."""
        with self.lock:
            self.sync()
            replayer = self._replayer
            return ReplayResult(
                catalog=self._cached_catalog(),
                position=replayer.position,
                applied=tuple(replayer.applied),
                skipped=tuple(replayer.skipped),
            )

    def catalog(self) -> Catalog:
        """The catalog as of the log's head."""
        with self.lock:
            self.sync()
            return self._cached_catalog()

    def view(self) -> CatalogView:
        """The catalog as of the log's head, looked at within the last ``max_age`` seconds."""
        cached = self._view
        if cached is not None:
            now = time.monotonic()
            if now - self._checked < self.max_age:
                return cached
            if self.log.head() == cached.position:
                self._checked = now
                return cached
        with self.lock:
            checked = time.monotonic()
            self.sync()
            self._checked = checked
            return self._current_view()

    def catalog_at(self, position: int | None) -> tuple[int, Catalog]:
        """The catalog after the events up to ``position`` (events.read.time_travel)."""
        return catalog_at(
            self.log,
            self.declared,
            position,
            config_path=self.config_path,
            snapshots=self.snapshots,
        )

    def _current_view(self) -> CatalogView:
        cached = self._view
        if cached is not None and cached.position == self._replayer.position:
            return cached
        view = CatalogView(
            self._replayer.position, self._cached_catalog(), self._replayer.skipped_count
        )
        self._view = view
        return view

    def _cached_catalog(self) -> Catalog:
        replayer = self._replayer
        of = (id(replayer), replayer.applied_count)
        if self._catalog is None or self._catalog_of != of:
            self._catalog = replayer.state.snapshot()
            self._catalog_of = of
        return self._catalog

    def replace_declared(self, declared: Catalog) -> None:
        """Take a new declared catalog (a reloaded catalog.yaml): replay starts over
        against it, since which runtime events apply depends on what is declared
        (configuration wins every conflict). The next read replays the log; a snapshot
        taken with the old declared catalog is not used (events.read.snapshots)."""
        with self.lock:
            self.declared = declared
            self._replayer = Replayer.start(declared, self.config_path)
            self._started = False
            self._since_snapshot = 0
            self._replace_snapshot = False
            self._catalog = None
            self._catalog_of = (0, -1)
            self._view = None
            self._checked = 0.0

    # -- catching up ------------------------------------------------------

    def sync(self) -> None:
        """Catch up with the log, and snapshot when due (hold ``lock``)."""
        self._catch_up()
        self._snapshot_if_due()

    def start(self) -> None:
        """Restore and catch up the first time only (hold ``lock``): a command calls it
        before its write section, so that a start-up's replay is not done holding the
        log's write lock; every later catch-up of a command is the one inside its
        section (``catch_up_locked``)."""
        if not self._started:
            self.sync()

    def catch_up_locked(self, locked: LockedLog) -> None:
        """Apply what other writers appended, read inside a command's write section."""
        if not self._started:  # a caller that did not ``start``: restore, at least
            self._started = True
            self._restore()
        events = iter(locked.read(after=self._replayer.position))
        first = next(events, None)
        if first is None:  # most commands: nobody else wrote since
            return
        with gc_paused():
            self._apply(chain((first,), events))

    def wrote(
        self, events: Sequence[StoredEvent] = (), decoded: Sequence[Model | None] = ()
    ) -> None:
        """After a command (hold ``lock``): apply the ``events`` it appended, or catch up
        when it appended none (a repeated key); snapshot when due.

        The appended events are applied as they were committed, without reading
        them back (nor decoding again the definitions ``decoded`` holds, one per
        event or None), and a definition without judging it again: the command
        judged it against this state with replay's own checks
        (``Replayer.apply_accepted``), so the catalog is the one any reader of the
        log gets (tests/unit/events/test_commands.py). The cached view is dropped rather than
        rebuilt: copying the catalog costs in proportion to its size, and the next
        read builds it once however many commands came before it.
        """
        if events:
            # A command's own events are few: pausing the collector is for long catch-ups.
            self._apply_own(events, decoded)
            self._snapshot_if_due()
        else:
            self.sync()
        self._view = None

    def _apply_own(self, events: Sequence[StoredEvent], decoded: Sequence[Model | None]) -> None:
        """A command's own events: a definition it judged is applied without judging it
        again (``Replayer.apply_accepted``); anything else as replay applies it."""
        for i, event in enumerate(events):
            model = decoded[i] if i < len(decoded) else None
            if model is None or event.type not in DEFINITION_TYPES:
                self._apply((event,))
                continue
            self._since_snapshot += 1
            self._replayer.apply_accepted(event, model)

    def _snapshot_if_due(self) -> None:
        if self.snapshot_every is not None and (
            self._since_snapshot >= self.snapshot_every
            or (self._replace_snapshot and self._since_snapshot > 0)
        ):
            self._save_snapshot()

    def _catch_up(self) -> None:
        if not self._started:
            self._started = True
            self._restore()
        with gc_paused():
            self._apply(self.log.read_for_replay(after=self._replayer.position))

    def _apply(self, events: Iterable[StoredEvent | ReplayEvent]) -> None:
        """Replay ``events`` (``Replayer.apply_all``), logging each one skipped."""
        replayer = self._replayer
        applied, skipped = len(replayer.applied), len(replayer.skipped)
        try:
            replayer.apply_all(events)
        finally:
            # Every event taken is applied or skipped, and counts toward the next snapshot;
            # the skipped are named even if a later one raised (a programming error).
            self._since_snapshot += (
                len(replayer.applied) - applied + len(replayer.skipped) - skipped
            )
            for event in replayer.skipped[skipped:]:
                log.warning(
                    "catalog.event_skipped",
                    position=event.position,
                    event_id=event.event_id,
                    type=event.type,
                    reason=event.reason,
                )

    # -- snapshots --------------------------------------------------------

    def _restore(self) -> None:
        if self.snapshots is None or self.snapshot_every is None:
            return
        restored = self.snapshots.try_load(self.declared, self.config_path)
        if restored.replayer is not None:
            self._replayer = restored.replayer
        self._replace_snapshot = restored.ignored

    def snapshot(self) -> int | None:
        """Catch up and store the replay state as of the head; the snapshot's id, or None
        if there is nowhere to store it or the database refused (a read-only replica,
        a lock held too long): nothing depends on it."""
        with self.lock:
            self._catch_up()
            return self._save_snapshot()

    def _save_snapshot(self) -> int | None:
        if self.snapshots is None:
            return None
        info = self.snapshots.try_save(self._replayer, self.declared)
        if info is None:
            return None
        self._since_snapshot = 0
        self._replace_snapshot = False
        return info.id

    @property
    def replayer(self) -> Replayer:
        """The replay state (applied and skipped counts, for reports and tests)."""
        return self._replayer
