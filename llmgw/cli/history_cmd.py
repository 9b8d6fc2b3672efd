"""`llmgw history`: who changed what, and when, from the catalog's log and, with
--placements, the scheduler's (merged by time)."""

from __future__ import annotations

import argparse
import heapq
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from events.history import HistoryQuery, history
from llmgw.cli.context import App, parse_when, print_json
from llmgw.cli.render import table
from llmgw.cli.times import whole_day
from llmgw.views import iso

if TYPE_CHECKING:
    from events.types import StoredEvent
    from scheduler.store import PlacementEvent

HISTORY_KEYS = ["position", "recorded_at", "type", "model", "actor", "reason"]


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
        return cls(
            event.position, event.recorded_at, event.type, event.model, event.actor, event.reason
        )

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
        since=None if args.since is None else parse_when(args.since),
        until=None if args.until is None else _until(args.until),
    )


def _until(text: str) -> datetime:
    when = parse_when(text)
    if whole_day(text):  # a date alone, today or yesterday: up to the end of that day
        when += timedelta(days=1) - timedelta(microseconds=1)
    return when


def history_sources(
    app: App, query: HistoryQuery, *, placements: bool = False
) -> list[Iterable[HistoryEntry]]:
    """The logs ``history`` reads, each in time order, all filtered by ``query``.

    With ``placements``, the scheduler's ``placement_events`` are a second
    source (actor "scheduler"), merged by time by ``cmd_history``.
    """
    if not placements:
        return [(HistoryEntry.of(e) for e in history(app.store.engine, query))]
    catalog = (replace(HistoryEntry.of(e), log="catalog") for e in history(app.store.engine, query))
    sources: list[Iterable[HistoryEntry]] = [catalog]
    from scheduler.store import SchedulerStore  # only with --placements: a second store

    events = SchedulerStore(app.engine).events(
        model=query.model, since=query.since, until=query.until
    )
    sources.append(
        entry
        for entry in (HistoryEntry.of_placement(e) for e in events)
        if (query.type is None or entry.type == query.type)
        and (query.actor is None or entry.actor == query.actor)
    )
    return sources


def cmd_history(app: App, args: argparse.Namespace) -> int:
    sources = history_sources(app, history_query(args), placements=args.placements)
    entries: Iterator[HistoryEntry] = heapq.merge(*sources, key=lambda e: e.recorded_at)
    rows = [e.to_json() for e in entries]
    if args.json:
        print_json(rows)
        return 0
    keys = [*HISTORY_KEYS, "log"] if args.placements else HISTORY_KEYS
    sys.stdout.write(table(keys, [[str(r[h] or "") for h in keys] for r in rows]))
    return 0
