"""`llmgw usage`: the usage ledger, summed from the log's ``usage.recorded`` events and
the flushed rows not yet rolled up into them (events.read.ledger), read straight from
the database like `llmgw history`."""

from __future__ import annotations

import argparse
import sys

from events.read.ledger import LedgerQuery, summarise
from events.storage.history import usage_events
from events.storage.usage_pending import pending_rows
from llmgw.cli.shared.context import App, parse_when, print_json
from llmgw.cli.shared.tables import table

COLUMNS = ["requests", "prompt_tokens", "cached_tokens", "completion_tokens", "total_tokens"]


def cmd_usage(app: App, args: argparse.Namespace) -> int:
    query = LedgerQuery(
        client=args.client,
        model=args.model,
        since=None if args.since is None else parse_when(args.since),
        by=args.by,
    )
    engine = app.store.engine
    ledger = summarise(
        usage_events(engine, query.since), query, pending=pending_rows(engine, query.since)
    )
    data = ledger.to_json()
    for skipped in ledger.skipped:
        sys.stderr.write(
            f"skipped usage {_where(skipped.position, skipped.event_id)}: {skipped.reason}\n"
        )
    if ledger.skipped_count > len(ledger.skipped):
        sys.stderr.write(f"... {ledger.skipped_count - len(ledger.skipped)} more skipped\n")
    if args.json:
        print_json(data)
        return 0
    keys = list(ledger.keys)
    rows = [
        [str(g[k]) for k in keys] + [str(g[c]) for c in COLUMNS] + [_outcomes(g["outcomes"])]
        for g in data["groups"]
    ]
    total = data["total"]
    rows.append(
        ["total", *([""] * (len(keys) - 1))]
        + [str(total[c]) for c in COLUMNS]
        + [_outcomes(total["outcomes"])]
    )
    sys.stdout.write(table([*keys, *COLUMNS, "outcomes"], rows))
    return 0


def _outcomes(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in outcomes.items())


def _where(position: int, name: str) -> str:
    """An event by position and id; a pending row (position 0) by its name."""
    return f"event at position {position} ({name})" if position else f"row {name}"
