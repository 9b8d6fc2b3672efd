"""Rounds recorded by reference: a round kept as what changed since the round before. Pure.

A recorded round holds the exact inputs of its plan (``record_format``): every node with
its report time, every placement before the round, every replica's state. At 100,000
nodes and 200,000 replicas that is tens of megabytes of JSON for a round that moved a few
replicas, and writing it cost 10-15 s of a round after one node was lost (issue 42). So a
round the writer can relate to the round it recorded last (same process, the round just
before) is recorded as its changes since that round (revision 0024: ``base_round``,
``changes``):

- the nodes added or whose content changed (``nodes``), and those gone (``nodes_gone``);
- the report times that changed (``reported_at``). A fresh node's recorded time is often
  the round's freshness boundary itself (``IncrementalRounds.nodes``), which moves with
  every round: such a time is kept as "at the boundary" (null) and each row names its
  boundary (``boundary``), so a node that stays at the boundary is no change;
- the placements added or changed (``current``) and removed (``current_gone``);
- the replica states added or changed (``statuses``) and gone (``statuses_gone``);
- the rest of the lifecycle (cordons, failures, back-off, running copies: small), whole.

A full record (a "keyframe", the shape every round had before 0024, and still readable by
releases before it) is written when there is no base (a process's first round, another
process wrote the round before, the write before was refused), every ``KEYFRAME_EVERY``
rows of a chain, when the changes since the chain's full record reach a
``1/LARGE_FRACTION`` of a full record, and when the placements are not in key order (the
order a chain rebuilds them in). A chain is therefore at most ``KEYFRAME_EVERY`` rows, and
reading a round costs at most its full record plus a bounded share of it again.

Reading rebuilds the documents the full record would have held (``Rebuilt``: from the
chain's full record, each later row's changes applied in order), then decodes them exactly
as a full record is decoded (``record_format.recorded_round``), so a round rebuilt from its
chain equals the round recorded in full (a hypothesis test holds them equal,
tests/unit/scheduler/test_round_chain.py). A link that cannot be read makes every round
recorded against it unreadable, with the link and its reason named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import compress, pairwise
from operator import attrgetter, is_not
from typing import Any

from scheduler.lifecycle.inputs import Lifecycle, status_json
from scheduler.lifecycle.replica_reports import ReplicaStatus
from scheduler.persistence.record_format import (
    CURRENT_SCHEMA,
    NODE,
    VERSION,
    Record,
    UnreadableRow,
    checked,
    json_list,
    json_object,
    node_content,
    placement_record,
    shown,
)
from scheduler.planner.fleet.inventory import FRESH, Node
from scheduler.planner.fleet.placements import Placement

Key = tuple[str, int]

# A full record at least every this many rows of a chain (its first row included).
KEYFRAME_EVERY = 64
# A full record once the entries changed since the chain's full record pass this share of
# a full record's entries (nodes, placements and replica states): reading a round then
# costs at most its full record and a quarter of one again.
LARGE_FRACTION = 4
# A reader follows at most this many links: a longer chain is not one this code wrote.
MAX_CHAIN = 1_000

# Every field of a node but its report time: what a content change is judged by.
_content = attrgetter("name", "gpu_class", "gpus", "memory_gb", "labels", "fabric", "gpus_reserved")


# -- writing ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChainHead:
    """What a writer keeps of the last round it recorded: enough to record the next one
    as its changes, compared position by position (a placer's inputs are, from round to
    round, mostly the same objects in the same order). ``times``: each node's recorded
    report time, in the order of ``nodes``, None when it was the round's freshness
    boundary; ``current``: the placements in key order (None: they were not, and the next
    round is recorded in full); ``statuses``: the replica states, a copy of the lifecycle's
    (one object: a tuple of their items was 170,000 more objects alive, which the cycle
    collector walked at the end of every round that wrote)."""

    round_id: int
    # The inventory digest of the chain's full record (what a row by reference names).
    digest: str
    # Rows recorded by reference since the full record, and the entries they changed.
    depth: int
    changed: int
    nodes: tuple[Node, ...]
    times: tuple[datetime | None, ...]
    current: tuple[Placement, ...] | None
    statuses: Mapping[Key, ReplicaStatus]


def _same_time(a: datetime | None, b: datetime | None) -> bool:
    """Whether two kept times are written the same (an ISO time shows its offset)."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    return a == b and a.utcoffset() == b.utcoffset()


def _times(nodes: Sequence[Node], boundary: datetime) -> list[datetime | None]:
    """Each node's report time as a chain keeps it: None if it is ``boundary`` (written the
    same: equal, in the same offset) or ``FRESH`` (recorded at the boundary:
    ``record_format.recorded_time``). A placer's nodes at the boundary share one time
    object, compared by identity once one is known to be it."""
    offset = boundary.utcoffset()
    known: datetime | None = None
    out: list[datetime | None] = []
    for n in nodes:
        when = n.reported_at
        if when is FRESH or when is known or (when == boundary and when.utcoffset() == offset):
            known = when
            out.append(None)
        else:
            out.append(when)
    return out


def _in_key_order(current: Sequence[Placement]) -> bool:
    keys = [(p.model, p.replica) for p in current]
    return all(a < b for a, b in pairwise(keys))


def full_head(
    round_id: int,
    digest: str,
    *,
    boundary: datetime,
    nodes: Sequence[Node],
    current: Sequence[Placement],
    lifecycle: Lifecycle,
) -> ChainHead | None:
    """The head after a full record of these inputs; None when a chain cannot follow it
    (a node named twice: a chain keeps one of each)."""
    if len({n.name for n in nodes}) != len(nodes):
        return None
    return ChainHead(
        round_id=round_id,
        digest=digest,
        depth=0,
        changed=0,
        nodes=tuple(nodes),
        times=tuple(_times(nodes, boundary)),
        current=tuple(current) if _in_key_order(current) else None,
        statuses=dict(lifecycle.statuses),
    )


def changes_since(
    head: ChainHead | None,
    round_id: int,
    *,
    boundary: datetime,
    nodes: Sequence[Node],
    current: Sequence[Placement],
    lifecycle: Lifecycle,
) -> tuple[Record, ChainHead] | None:
    """Round ``round_id``'s inputs as their changes since ``head`` (the ``changes`` JSON of
    its row) and the head after it; None when the round is to be recorded in full.

    O(inputs), but mostly by identity, position by position: 0.56 s of CPU at 100,000
    nodes and 170,000 replicas by name and key, about a tenth of it so."""
    if (
        head is None
        or head.round_id != round_id - 1
        or head.depth + 1 >= KEYFRAME_EVERY
        or head.current is None
    ):
        return None
    times = _times(nodes, boundary)
    node_doc = _node_changes(head, nodes, times)
    placement_doc = _placement_changes(head.current, current)
    if node_doc is None or placement_doc is None:
        return None
    statuses = lifecycle.statuses
    status_doc = _status_changes(head.statuses, statuses)
    changed = sum(len(v) for doc in (node_doc, placement_doc, status_doc) for v in doc.values())
    size = len(nodes) + len(current) + len(statuses)
    if (head.changed + changed) * LARGE_FRACTION > size:
        return None  # large: a full record reads faster than the chain
    rest = dataclasses.replace(lifecycle, statuses={}).to_json()
    del rest["statuses"]
    document: Record = {
        "boundary": boundary.isoformat(),
        **node_doc,
        **placement_doc,
        **status_doc,
        "lifecycle": rest,
    }
    return document, ChainHead(
        round_id=round_id,
        digest=head.digest,
        depth=head.depth + 1,
        changed=head.changed + changed,
        nodes=tuple(nodes),
        times=tuple(times),
        current=tuple(current),
        statuses=dict(statuses),
    )


def _node_doc(contents: list[Node], gone: list[str], times: dict[str, datetime | None]) -> Record:
    return {
        "nodes": [{**node_content(n), VERSION: CURRENT_SCHEMA[NODE]} for n in contents],
        "nodes_gone": gone,
        "reported_at": {name: None if at is None else at.isoformat() for name, at in times.items()},
    }


def _node_changes(
    head: ChainHead, nodes: Sequence[Node], times: list[datetime | None]
) -> Record | None:
    """The nodes' changes: content added or changed (``nodes``), gone (``nodes_gone``),
    report times changed (``reported_at``). None if a node is named twice. Position by
    position while the names are the round before's, in its order; else by name."""
    old_nodes, old_times = head.nodes, head.times
    if len(old_nodes) == len(nodes):
        contents: list[Node] = []
        moved: dict[str, datetime | None] = {}
        for o, n, was, at in zip(old_nodes, nodes, old_times, times, strict=True):
            if o is not n:
                if o.name != n.name:
                    break
                if _content(o) != _content(n):
                    contents.append(n)
            if was is not at and not _same_time(was, at):
                moved[n.name] = at
        else:
            return _node_doc(contents, [], moved)
    return _nodes_by_name(head, nodes, times)


def _nodes_by_name(
    head: ChainHead, nodes: Sequence[Node], times: list[datetime | None]
) -> Record | None:
    old_nodes = {n.name: n for n in head.nodes}
    old_times = {n.name: at for n, at in zip(head.nodes, head.times, strict=True)}
    names: set[str] = set()
    contents: list[Node] = []
    moved: dict[str, datetime | None] = {}
    for n, at in zip(nodes, times, strict=True):
        name = n.name
        names.add(name)
        old = old_nodes.get(name)
        if old is None or (old is not n and _content(old) != _content(n)):
            contents.append(n)
        if old is None or not _same_time(old_times[name], at):
            moved[name] = at
    if len(names) != len(nodes):
        return None
    return _node_doc(contents, sorted(old_nodes.keys() - names), moved)


def _placement_changes(old: tuple[Placement, ...], current: Sequence[Placement]) -> Record | None:
    """The placements' changes: added or changed (``current``) and gone (``current_gone``),
    both in key order, merged by key where they are not the same objects. None unless
    ``current`` is in key order (how a chain rebuilds them), each key once."""
    records: list[Record] = []
    gone: list[Key] = []
    i = j = 0
    n_old, n_new = len(old), len(current)
    last: Key | None = None  # the key of current[j - 1], when it was compared
    while j < n_new:
        b = current[j]
        if i < n_old:
            a = old[i]
            if a is b:
                i += 1
                j += 1
                last = None
                continue
            ka = (a.model, a.replica)
        else:
            ka = None
        kb = (b.model, b.replica)
        if last is None and j:
            p = current[j - 1]
            last = (p.model, p.replica)
        if last is not None and not last < kb:
            return None  # not in key order, or a key twice
        if ka is not None and ka < kb:
            gone.append(ka)
            i += 1
            continue
        if ka == kb:
            i += 1
            if a != b:
                records.append(placement_record(b))
        else:
            records.append(placement_record(b))
        j += 1
        last = kb
    gone.extend((p.model, p.replica) for p in old[i:])
    return {"current": records, "current_gone": [list(k) for k in gone]}


def _status_changes(old: Mapping[Key, ReplicaStatus], new: Mapping[Key, ReplicaStatus]) -> Record:
    """The replica states' changes: added or changed (``statuses``, in ``new``'s order) and
    gone (``statuses_gone``, in key order). A key whose state is the very object it was
    is no change, found in C (a placer's feed keeps the objects of the states it did not
    read again); the others are compared by value."""
    keys = list(new)
    moved = compress(keys, map(is_not, map(old.get, keys), new.values()))
    entries: list[Record] = []
    came = 0
    for key in moved:
        was, now = old.get(key), new[key]
        if was is None:
            came += 1
        if was is None or was != now:
            entries.append(status_json(key, now))
    gone = sorted(old.keys() - new.keys()) if len(old) + came != len(new) else []
    return {"statuses": entries, "statuses_gone": [list(k) for k in gone]}


def full_changes(boundary: datetime) -> Record:
    """The ``changes`` JSON of a full record: the boundary its chain's next row refers to."""
    return {"boundary": boundary.isoformat()}


# -- reading ------------------------------------------------------------------------------


@dataclass(slots=True)
class Rebuilt:
    """A round's documents as they are rebuilt along its chain (JSON values, as stored).
    ``times``: each node's report time, None for "at the round's boundary"."""

    boundary: str
    inventory: dict[str, Record]
    times: dict[str, str | None]
    current: dict[Key, Record]
    statuses: dict[Key, Record]
    rest: Record

    @classmethod
    def full(cls, documents: Mapping[str, Any], inventory: Any, changes: Any) -> Rebuilt:
        """From a full record's documents (upcast to the current version), its
        inventory's nodes, and its ``changes`` (which names its boundary)."""
        boundary = _boundary(changes)
        by_name: dict[str, Record] = {}
        for content in json_list(inventory, "the inventory"):
            c = json_object(content, "a node's content")
            by_name[checked(c, "name", str)] = c
        reported = json_object(documents["reported_at"], "reported_at")
        times: dict[str, str | None] = {}
        for name in by_name:
            when = reported.get(name)
            if type(when) is not str:
                raise UnreadableRow(f"no report time for node {shown(name)}")
            times[name] = None if when == boundary else when
        lifecycle = json_object(documents["lifecycle"], "lifecycle")
        rest = {k: v for k, v in lifecycle.items() if k != "statuses"}
        return cls(
            boundary=boundary,
            inventory=by_name,
            times=times,
            current=_keyed(documents["current"], "current", "a placement"),
            statuses=_keyed(lifecycle.get("statuses"), "lifecycle statuses", "a replica state"),
            rest=rest,
        )

    def apply(self, changes: Any) -> None:
        """The next row's ``changes`` applied (any value that is not what a writer writes
        makes the row unreadable, with the reason)."""
        c = json_object(changes, "changes")
        self.boundary = _boundary(c)
        for name in _names(c.get("nodes_gone"), "nodes_gone"):
            self.inventory.pop(name, None)
            self.times.pop(name, None)
        for content in json_list(c.get("nodes"), "changes nodes"):
            node = json_object(content, "a node's content")
            self.inventory[checked(node, "name", str)] = node
        times = json_object(c.get("reported_at"), "changes reported_at")
        for name, when in times.items():
            if when is not None and type(when) is not str:
                raise UnreadableRow(f"report time {shown(when)} of {shown(name)} is not a time")
            self.times[name] = when
        for key in _keys(c.get("current_gone"), "current_gone"):
            self.current.pop(key, None)
        self.current.update(_keyed(c.get("current"), "changes current", "a placement"))
        for key in _keys(c.get("statuses_gone"), "statuses_gone"):
            self.statuses.pop(key, None)
        self.statuses.update(_keyed(c.get("statuses"), "changes statuses", "a replica state"))
        self.rest = json_object(c.get("lifecycle"), "changes lifecycle")

    def documents(self, policy: Any) -> tuple[dict[str, Any], list[Record]]:
        """The documents and inventory nodes the full record would hold, with ``policy``
        (the row's own): what ``record_format.recorded_round`` decodes."""
        names = sorted(self.inventory)
        reported: dict[str, str] = {}
        for name in names:
            if name not in self.times:
                raise UnreadableRow(f"no report time for node {shown(name)}")
            when = self.times[name]
            reported[name] = self.boundary if when is None else when
        documents = {
            "reported_at": reported,
            "current": [self.current[k] for k in sorted(self.current)],
            "policy": policy,
            "lifecycle": {
                "statuses": [self.statuses[k] for k in sorted(self.statuses)],
                **self.rest,
            },
        }
        return documents, [self.inventory[n] for n in names]


def _boundary(changes: Any) -> str:
    c = json_object(changes, "changes")
    boundary = c.get("boundary")
    if type(boundary) is not str:
        raise UnreadableRow(f"changes boundary {shown(boundary)} is not a time")
    try:
        datetime.fromisoformat(boundary)
    except ValueError:
        raise UnreadableRow(f"changes boundary {shown(boundary)} is not a time") from None
    return boundary


def _key(value: Mapping[str, Any]) -> Key:
    return (checked(value, "model", str), checked(value, "replica", int))


def _keyed(value: Any, where: str, what: str) -> dict[Key, Record]:
    """A list of records with a model and a replica, by (model, replica)."""
    out: dict[Key, Record] = {}
    for item in json_list(value, where):
        record = json_object(item, what)
        out[_key(record)] = record
    return out


def _names(value: Any, where: str) -> list[str]:
    names = json_list(value, where)
    if not all(type(n) is str for n in names):
        raise UnreadableRow(f"{where} {shown(names)} is not a list of names")
    return names


def _keys(value: Any, where: str) -> list[Key]:
    keys = []
    for item in json_list(value, where):
        pair = json_list(item, f"a key of {where}")
        if len(pair) != 2 or type(pair[0]) is not str or type(pair[1]) is not int:
            raise UnreadableRow(f"{where} {shown(pair)} is not a (model, replica) key")
        keys.append((pair[0], pair[1]))
    return keys
