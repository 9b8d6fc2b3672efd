"""Recorded rounds: writing the exact inputs of a round's plan, and rebuilding them.

``explain --round`` plans a recorded round again from what is kept here. The
JSON is versioned and upcast (``scheduler.persistence.record_format``); a round whose row cannot
be read is skipped and named, and asking for the last round (or the last at a
time) then gives the one before it. Since revision 0024 a round may be recorded by
reference to the round before, as what changed (``scheduler.persistence.round_chain``):
read, it is rebuilt from its chain, and a link that cannot be read makes it unreadable
with the link named.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select

from scheduler.lifecycle.inputs import Lifecycle
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.persistence.record_format import (
    BY_REFERENCE,
    RecordedRound,
    UnreadableRow,
    full_record,
    inventory_digest,
    inventory_json,
    policy_json,
    recorded_round,
    upcast_round,
)
from scheduler.persistence.round_chain import (
    MAX_CHAIN,
    ChainHead,
    Rebuilt,
    changes_since,
    full_changes,
    full_head,
)
from scheduler.persistence.row_decoding import (
    ROUND_LIMITS,
    STORED_LIMITS,
    Row,
    Unreadable,
    decode_each,
    decode_one,
    json_column,
    raw,
)
from scheduler.persistence.tables import InventoryRow, PlacementRoundRow, table
from scheduler.planner.fleet.inventory import Node
from scheduler.planner.fleet.placements import Placement

rounds_t = table(PlacementRoundRow)
inventories_t = table(InventoryRow)

# Rounds fetched at a time while looking back for one that can be read.
SEARCH_BATCH = 50


class RoundUnreadable(Exception):
    """A recorded round that exists but cannot be read, with the reason (as
    ``scheduler.row_skipped`` logs it)."""

    def __init__(self, round_id: int, reason: str) -> None:
        super().__init__(f"round {round_id} is recorded but cannot be read: {reason}")
        self.round_id = round_id
        self.reason = reason


def record_round(
    conn: Connection,
    *,
    round_id: int,
    now: datetime,
    catalog_position: int,
    nodes: Sequence[Node],
    current: Sequence[Placement],
    policy: StalenessPolicy,
    lifecycle: Lifecycle,
    counts: tuple[int, int, int],
    leader: tuple[str, int] | None = None,
    chain: ChainHead | None = None,
) -> ChainHead | None:
    """Write a round's row: by reference to the round before when ``chain`` (the head the
    writer kept of the last round it recorded) allows (``round_chain.changes_since``), else
    in full, with its inventory unless one with the same digest is stored. ``leader``: the
    holder and epoch of the leadership lease it was written under. Returns the head to
    keep for the next round, once this one's transaction commits."""
    boundary = now - policy.stale_after
    placed, removed, unplaced = counts
    row = {
        "id": round_id,
        "planned_at": now,
        "catalog_position": catalog_position,
        "placed": placed,
        "removed": removed,
        "unplaced": unplaced,
        "leader": None if leader is None else leader[0],
        "epoch": None if leader is None else leader[1],
    }
    by_reference = changes_since(
        chain, round_id, boundary=boundary, nodes=nodes, current=current, lifecycle=lifecycle
    )
    if by_reference is not None:
        changes, head = by_reference
        conn.execute(
            insert(rounds_t),
            {
                **row,
                # The chain's full record's inventory: stored, so that a release before
                # 0024 reads on to the version and names the row newer than it reads.
                "inventory_digest": head.digest,
                "reported_at": "{}",
                "current": "[]",
                "lifecycle": None,
                "policy": policy_json(policy, BY_REFERENCE),
                "base_round": round_id - 1,
                "changes": json.dumps(changes),
            },
        )
        return head
    digest = inventory_digest(nodes)
    stored = conn.execute(
        select(inventories_t.c.digest).where(inventories_t.c.digest == digest)
    ).first()
    if stored is None:
        conn.execute(insert(inventories_t), {"digest": digest, "nodes": inventory_json(nodes)})
    conn.execute(
        insert(rounds_t),
        {
            **row,
            "inventory_digest": digest,
            **full_record(nodes, current, policy, lifecycle, boundary),
            "base_round": None,
            "changes": json.dumps(full_changes(boundary)),
        },
    )
    return full_head(
        round_id, digest, boundary=boundary, nodes=nodes, current=current, lifecycle=lifecycle
    )


def read_recorded_round(
    conn: Connection, *, round_id: int | None = None, at: datetime | None = None
) -> RecordedRound | None:
    """A recorded round by id, or the last readable one planned at or before ``at``, or the last.

    None when no such round is recorded. A round asked for by id whose row cannot be
    read raises ``RoundUnreadable``: "not recorded" would send an operator looking
    for a round that is there (the reason is otherwise only in the server's log).
    """
    query = raw(rounds_t)
    if round_id is not None:
        row = conn.execute(query.where(rounds_t.c.id == round_id)).mappings().first()
        if row is None:
            return None
        found = decode_one(
            conn,
            row,
            table="placement_rounds",
            key=("id",),
            decode=lambda r: _round(conn, r),
            times=("planned_at",),
        )
        if isinstance(found, Unreadable):
            raise RoundUnreadable(round_id, found.reason)
        return found
    if at is not None:
        query = query.where(rounds_t.c.planned_at <= at)
    query = query.order_by(rounds_t.c.id.desc())
    offset = 0
    # Rounds found unreadable through a link of a later round's chain, and why: the rounds
    # before it in the search share that chain, and were each rebuilt again up to the
    # same link (a chain's full record that cannot be read: every round of the chain
    # decoded it again, some 64 times 60 MB at issue 42's scale).
    unreadable: dict[int, str] = {}
    while True:
        batch = conn.execute(query.limit(SEARCH_BATCH).offset(offset)).mappings().all()
        if not batch:
            return None
        for row in batch:
            readable = decode_each(
                conn,
                [row],
                table="placement_rounds",
                key=("id",),
                decode=lambda r: _round(conn, r, unreadable),
                times=("planned_at",),
            )
            if readable:
                return readable[0]
        offset += SEARCH_BATCH


def _round(conn: Connection, r: Row, unreadable: dict[int, str] | None = None) -> RecordedRound:
    """Round ``r`` as recorded; ``unreadable``: rounds already known not to be, and why,
    told here of the rounds found so along ``r``'s chain."""
    known = {} if unreadable is None else unreadable
    if r["id"] in known:
        raise UnreadableRow(known[r["id"]])
    if r["base_round"] is None:
        documents, inventory = _full_documents(conn, r)
        return recorded_round(r, documents, inventory)
    # Recorded by reference: its chain, back to the full record it starts from.
    policy = json_column(r["policy"], "policy", STORED_LIMITS)
    links: list[Mapping[Any, Any]] = [r]
    # The chain's changes together within one column's bounds (as the writer keeps them:
    # at most a quarter of a full record): each link's alone is, and a chain of
    # ``MAX_CHAIN`` links each near ``ROUND_LIMITS`` would otherwise be held and rebuilt.
    held = _length(r["changes"])
    while links[-1]["base_round"] is not None:
        if len(links) > MAX_CHAIN:
            raise UnreadableRow(f"its chain of rounds is longer than {MAX_CHAIN}")
        link = links[-1]
        base = link["base_round"]
        if type(base) is not int or not 0 < base < link["id"]:
            reason = f"base_round {base!r} of round {link['id']} is not an earlier round"
            known.update((later["id"], reason) for later in links)
            raise UnreadableRow(reason)
        # A link's own columns but its changes are not read: a row by reference holds
        # none, and a hostile one's (a gigabyte each) were held for every link.
        found = conn.execute(_LINK.where(rounds_t.c.id == base)).mappings().first()
        if found is not None and found["base_round"] is None:
            found = conn.execute(raw(rounds_t).where(rounds_t.c.id == base)).mappings().first()
        if found is None:
            reason = f"it is recorded by reference to round {base}, which is not stored"
            known.update((later["id"], reason) for later in links)
            raise UnreadableRow(reason)
        links.append(found)
        held += _length(found["changes"])
        if held > ROUND_LIMITS.max_bytes:
            raise UnreadableRow(
                f"the changes of its chain of rounds (to round {base}) hold more than "
                f"{ROUND_LIMITS.max_bytes} bytes"
            )
    chain = links[::-1]  # the full record first, this row last
    link = chain[0]
    try:
        documents, inventory = _full_documents(conn, link)
        rebuilt = Rebuilt.full(upcast_round(documents), inventory, _changes(link))
        for link in chain[1:]:
            rebuilt.apply(_changes(link))
    except UnreadableRow as exc:
        if link is r:
            raise
        reason = f"it is recorded by reference to round {link['id']}, which cannot be read: {exc}"
        # Every round after that link in this chain is rebuilt through it.
        at = next(i for i, each in enumerate(chain) if each is link)
        known.update((later["id"], reason) for later in chain[at + 1 :])
        raise UnreadableRow(reason) from None
    documents, nodes = rebuilt.documents(policy)
    return recorded_round(r, documents, nodes)


# What the walk along a chain reads of each link (the full record it ends at, whole).
_LINK = raw(rounds_t, "id", "base_round", "changes")


def _length(changes: object) -> int:
    return len(changes) if isinstance(changes, str) else 0


def _changes(r: Row) -> object:
    if r["changes"] is None:
        raise UnreadableRow("it holds no changes (a full record written before revision 0024)")
    return json_column(r["changes"], "changes", ROUND_LIMITS)


def _full_documents(conn: Connection, r: Row) -> tuple[dict[str, Any], Any]:
    """A full record's documents, upcast to the current version, and its inventory."""
    digest = r["inventory_digest"]
    content = conn.execute(
        raw(inventories_t, "nodes").where(inventories_t.c.digest == digest)
    ).scalar()
    if content is None:
        raise UnreadableRow(f"its inventory {digest!r} is not stored")
    documents = {
        name: json_column(r[name], name, ROUND_LIMITS)
        for name in ("reported_at", "current", "policy")
    }
    # Within a round's bounds: every replica's state, 4 MB at 17,000 replicas, was read
    # within a node list's (1 MB), and any round of more than some 4,000 replicas was
    # unreadable.
    documents["lifecycle"] = (
        None if r["lifecycle"] is None else json_column(r["lifecycle"], "lifecycle", ROUND_LIMITS)
    )
    return documents, json_column(content, "inventory nodes", ROUND_LIMITS)
