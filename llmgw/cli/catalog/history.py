"""`llmgw history`: who changed what, and when, from the catalog's log and, with
--placements, the scheduler's (merged by time)."""

from __future__ import annotations

import argparse
import heapq
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from events.core.types import TOKEN_TYPES, USAGE_RECORDED
from events.storage.history import HistoryQuery, history
from llmgw.cli.shared.context import EXIT_USAGE, App, SystemExitWith, parse_when, print_json
from llmgw.cli.shared.live import json_line
from llmgw.cli.shared.tables import column_widths, table, table_row
from llmgw.cli.shared.times import whole_day
from llmgw.views import iso

if TYPE_CHECKING:
    from events.core.types import StoredEvent
    from scheduler.persistence.record_format import PlacementEvent

HISTORY_KEYS = ["position", "recorded_at", "type", "model", "actor", "reason"]


def _token_reason(event: StoredEvent) -> str:
    """Which token and its role, then the reason given: as replay reads the payload
    (never a token or a hash: the event holds neither), or why it cannot be read."""
    from catalog.reading.documents import read_json
    from events.core.token_change import check_token_change
    from events.core.upcast import UnreadableEvent, upcast
    from events.read.replay import STORED_LIMITS

    try:
        payload = read_json(event.payload, "payload", STORED_LIMITS)
        if not isinstance(payload, dict):
            raise UnreadableEvent("payload is not a JSON object")
        change = check_token_change(event.type, upcast(event.type, event.schema_version, payload))
    except Exception as exc:  # any row a reader must still see, named as replay names it
        return f"unreadable row: {str(exc)[:200]}"
    return f"{change.describe()}: {event.reason}" if event.reason else change.describe()


def _usage_reason(event: StoredEvent) -> str:
    """Whose usage, of which model and minute, as the ledger reads it, or why not."""
    from events.read.ledger import read_row

    try:
        return read_row(event).describe()
    except Exception as exc:  # any row a reader must still see, named as replay names it
        return f"unreadable row: {str(exc)[:200]}"


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One line of ``llmgw history``, from whichever log it comes."""

    position: int
    recorded_at: datetime
    type: str
    model: str | None
    actor: str
    reason: str
    # None for the catalog's log alone; "catalog" or "placements" when merged,
    # since the two logs number their positions separately.
    log: str | None = None

    @classmethod
    def of(cls, event: StoredEvent) -> HistoryEntry:
        # A row that cannot be read is listed and named, as replay names it.
        reason = event.reason if event.unreadable is None else f"unreadable row: {event.unreadable}"
        if event.unreadable is None and event.type in TOKEN_TYPES:
            reason = _token_reason(event)
        elif event.unreadable is None and event.type == USAGE_RECORDED:
            reason = _usage_reason(event)
        return cls(event.position, event.recorded_at, event.type, event.model, event.actor, reason)

    @classmethod
    def of_placement(cls, event: PlacementEvent) -> HistoryEntry:
        if event.type.startswith("node."):  # cordons and drains name no replica
            where = f"node {', '.join(event.nodes)}"
        else:
            where = f"replica {event.replica} ({event.profile}) on {', '.join(event.nodes)}"
        reason = f"{where}: {event.reason}" if event.reason else where
        reason += f" [round {event.round_id}, catalog position {event.catalog_position}]"
        return cls(
            event.position,
            event.recorded_at,
            event.type,
            event.model or None,
            # The scheduler's own decisions carry no actor; an agent's or operator's do.
            event.actor or "scheduler",
            reason,
            "placements",
        )

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "position": self.position,
            "recorded_at": iso(self.recorded_at),
            "type": self.type,
            "model": self.model,
            "actor": self.actor,
            "reason": self.reason,
        }
        if self.log is not None:
            out["log"] = self.log
        return out


def history_query(args: argparse.Namespace) -> HistoryQuery:
    return HistoryQuery(
        model=args.model,
        actor=args.actor,
        type=args.type,
        # The usage ledger's events (a minute's counts per client, model and replica)
        # would bury the catalog's changes: left out unless asked for.
        without_type=None
        if getattr(args, "usage", False) or args.type is not None
        else USAGE_RECORDED,
        since=None if args.since is None else parse_when(args.since),
        until=None if args.until is None else _until(args.until),
    )


def _until(text: str) -> datetime:
    when = parse_when(text)
    if whole_day(text):  # a date alone, today or yesterday: up to the end of that day
        when += timedelta(days=1) - timedelta(microseconds=1)
    return when


def history_sources(
    app: App,
    query: HistoryQuery,
    *,
    placements: bool = False,
    after: tuple[int, int] = (0, 0),
) -> list[Iterable[HistoryEntry]]:
    """The logs ``history`` reads, each in time order, all filtered by ``query``.

    With ``placements``, the scheduler's ``placement_events`` are a second
    source (actor "scheduler"), merged by time by ``cmd_history``. ``after``:
    only events past these positions of the catalog's and the placement log.
    """
    if not placements:
        return [(HistoryEntry.of(e) for e in history(app.store.engine, query, after=after[0]))]
    catalog = (
        replace(HistoryEntry.of(e), log="catalog")
        for e in history(app.store.engine, query, after=after[0])
    )
    sources: list[Iterable[HistoryEntry]] = [catalog]
    from scheduler.persistence.store import SchedulerStore  # only with --placements: a second store

    events = SchedulerStore(app.engine).events(
        model=query.model, since=query.since, until=query.until, after=after[1]
    )
    sources.append(
        entry
        for entry in (HistoryEntry.of_placement(e) for e in events)
        if (query.type is None or entry.type == query.type)
        and (query.actor is None or entry.actor == query.actor)
    )
    return sources


def cmd_history(app: App, args: argparse.Namespace) -> int:
    if args.follow:
        return follow(app, args)
    sources = history_sources(app, history_query(args), placements=args.placements)
    entries: Iterator[HistoryEntry] = heapq.merge(*sources, key=lambda e: e.recorded_at)
    rows = [e.to_json() for e in entries]
    if args.json:
        print_json(rows)
        return 0
    keys = [*HISTORY_KEYS, "log"] if args.placements else HISTORY_KEYS
    sys.stdout.write(table(keys, [[str(r[h] or "") for h in keys] for r in rows]))
    return 0


# How often --follow looks for new events.
FOLLOW_POLL_S = 0.5


def follow(app: App, args: argparse.Namespace) -> int:
    """History up to the logs' heads, then each event past them as it is recorded.

    Both logs number their events gaplessly in commit order (events.storage.sql_log; the
    placement log is appended under one lock), so reading past the last head
    seen neither misses nor repeats an event. The heads are read first and the
    entries bounded by them, so an event recorded meanwhile is printed once, by
    the next poll. With --json, one object a line, the first ones too.

    With --until, it follows until that time and then exits 0 (``--until today``: to
    the end of the day); an --until already past is refused (see below).
    """
    query = history_query(args)
    if query.until is not None and query.until <= datetime.now(UTC):
        # Refused, not "print and exit": --follow promises to wait for new events, and
        # none can ever match, so printing the history and exiting 0 would look like a
        # follow that ended by itself (a supervisor restarts it; a person thinks the log
        # went quiet). It is also most often a slip: relative times count back, so
        # `--until 1h` is an hour ago, not "for an hour".
        raise SystemExitWith(
            EXIT_USAGE,
            f"error: history --follow --until {args.until}: that time ({iso(query.until)}) "
            "has passed, so no new event can match and --follow would wait forever. Drop "
            "--follow to list the events up to then, or give an --until still to come "
            "(e.g. today, the end of today) to follow until it; relative times count back "
            "from now (--until 1h is an hour ago)",
        )
    keys = [*HISTORY_KEYS, "log"] if args.placements else HISTORY_KEYS
    out = sys.stdout
    try:
        heads = _heads(app, args.placements)
        first = _entries(app, query, args.placements, (0, 0), heads)
        rows = [[str(e.to_json()[h] or "") for h in keys] for e in first]
        widths = column_widths(keys, rows)
        if args.json:
            out.writelines(json_line(e.to_json()) for e in first)
        else:
            out.write(table(keys, rows))
        out.flush()
        while True:
            time.sleep(FOLLOW_POLL_S)
            # Read once more after --until has passed: an event recorded just before it
            # may commit just after.
            ended = query.until is not None and datetime.now(UTC) > query.until
            now = _heads(app, args.placements)
            if now == heads:
                if ended:
                    return 0
                continue
            for entry in _entries(app, query, args.placements, heads, now):
                data = entry.to_json()
                if args.json:
                    out.write(json_line(data))
                else:
                    out.write(table_row([str(data[h] or "") for h in keys], widths) + "\n")
            out.flush()
            heads = now
            if ended:
                return 0
    except KeyboardInterrupt:
        return 0


def _heads(app: App, placements: bool) -> tuple[int, int]:
    if not placements:
        return app.store.head(), 0
    from scheduler.persistence.store import SchedulerStore

    return app.store.head(), SchedulerStore(app.engine).events_head()


def _entries(
    app: App,
    query: HistoryQuery,
    placements: bool,
    after: tuple[int, int],
    until: tuple[int, int],
) -> list[HistoryEntry]:
    """The entries past ``after`` and up to ``until`` (positions in each log), by time."""
    sources = history_sources(app, query, placements=placements, after=after)
    merged = heapq.merge(*sources, key=lambda e: e.recorded_at)
    return [e for e in merged if e.position <= until[1 if e.log == "placements" else 0]]
