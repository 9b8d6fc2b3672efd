"""What a recorded round is kept as: versioned JSON, upcast on reading like catalog events. Pure.

A round records the exact inputs its plan was made from (``placement_rounds``
and ``inventories``), so that ``llmgw explain --round`` can plan it again years
later. Those rows are JSON, and their shape changes with the planner's inputs;
like a catalog event's payload (``events.core.upcast``), a stored record is never
rewritten: it carries the version it was written in and is upcast, one step
at a time, to the shape this code reads.

Where the version lives, without a migration: a round's version is the
``schema_version`` key of its policy object (the one JSON object every round
row has; it versions the whole row: policy, placements before the round,
report times, lifecycle), and a node's is a key of its content in the
inventory (an inventory is shared by every round with the same digest, so it
is versioned apart from the rounds). A record without the key was written
before versions: version 1, which is every shape releases wrote until then.
An older release reading a newer row ignores the key.

Decoding checks every value's type and raises ``UnreadableRow`` with the reason;
callers skip and name such a row (``scheduler.persistence.row_decoding``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from scheduler.lifecycle.inputs import CORDONED, DRAINING, Lifecycle
from scheduler.lifecycle.replica_reports import PLACED, STORED_STATES
from scheduler.lifecycle.staleness import StalenessPolicy
from scheduler.planner.fleet.inventory import FRESH, Node
from scheduler.planner.fleet.placements import Placement

VERSION = "schema_version"
ROUND = "round"
NODE = "node"
# The version this code reads, per kind of record. A round recorded in full is written at
# ``FULL_ROUND`` (what releases before revision 0024 read too); one recorded by reference to
# an earlier round (``scheduler.persistence.round_chain``) at 3, so that an older release
# names it newer than it reads rather than reading it as something it is not.
CURRENT_SCHEMA = {ROUND: 3, NODE: 2}
FULL_ROUND = 2
BY_REFERENCE = 3

Record = dict[str, Any]


class UnreadableRow(Exception):
    """A stored row this code cannot interpret; readers skip it with this reason."""


@dataclass(frozen=True, slots=True)
class PlacementEvent:
    position: int
    round_id: int
    type: str
    model: str
    replica: int
    profile: str
    nodes: tuple[str, ...]
    reason: str
    catalog_position: int
    recorded_at: datetime
    actor: str = ""


@dataclass(frozen=True, slots=True)
class RecordedRound:
    """A round as recorded: the exact inputs its plan was made from."""

    id: int
    planned_at: datetime
    catalog_position: int
    nodes: tuple[Node, ...]
    current: tuple[Placement, ...]
    policy: StalenessPolicy
    placed: int
    removed: int
    unplaced: int
    lifecycle: Lifecycle = field(default_factory=Lifecycle)


# -- writing ------------------------------------------------------------------


def node_content(node: Node) -> Record:
    """A node's reported content, without the time it was reported (what the digest covers)."""
    return {
        "name": node.name,
        "gpu_class": node.gpu_class,
        "gpus": node.gpus,
        "gpus_reserved": node.gpus_reserved,
        "memory_gb": node.memory_gb,
        "labels": dict(sorted(node.labels.items())),
        "fabric": node.fabric,
    }


def inventory_digest(nodes: Iterable[Node]) -> str:
    """A digest of what the nodes reported (not when): equal inventories, equal digests."""
    content = sorted((node_content(n) for n in nodes), key=lambda c: c["name"])
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def inventory_json(nodes: Iterable[Node]) -> str:
    """An inventory row's content: each node's content, with its version."""
    content = sorted((node_content(n) for n in nodes), key=lambda c: c["name"])
    return json.dumps([{**c, VERSION: CURRENT_SCHEMA[NODE]} for c in content])


def placement_record(p: Placement) -> Record:
    return {
        "model": p.model,
        "replica": p.replica,
        "profile": p.profile,
        "nodes": list(p.nodes),
        "gpus_per_node": p.gpus_per_node,
        "gpu_class": p.gpu_class,
        "memory_gb_per_node": p.memory_gb_per_node,
        "fingerprint": p.fingerprint,
        "version": p.version,
        "moving": p.moving,
        "moving_for": p.moving_for,
    }


def recorded_time(node: Node, boundary: datetime) -> datetime:
    """A node's report time as a round records it: ``FRESH`` (a fresh node as a placer's
    rounds plan on it, ``IncrementalRounds.planned_nodes``) at the round's freshness
    boundary, which plans the same (it is fresh), any other as it is."""
    return boundary if node.reported_at == FRESH else node.reported_at


def full_record(
    nodes: Sequence[Node],
    current: Sequence[Placement],
    policy: StalenessPolicy,
    lifecycle: Lifecycle,
    boundary: datetime | None = None,
) -> dict[str, str]:
    """The JSON columns of a round recorded in full: when each node reported (``FRESH``
    at ``boundary``: ``recorded_time``), the placements before the round, the policy and
    the lifecycle (the nodes' content is its inventory's: ``inventory_json``)."""
    return {
        "reported_at": json.dumps(
            {
                n.name: (
                    n.reported_at if boundary is None else recorded_time(n, boundary)
                ).isoformat()
                for n in nodes
            },
            sort_keys=True,
        ),
        "current": json.dumps([placement_record(p) for p in current]),
        "policy": policy_json(policy),
        "lifecycle": json.dumps(lifecycle.to_json()),
    }


def policy_json(policy: StalenessPolicy, version: int = FULL_ROUND) -> str:
    """The round's policy object, which also carries the round record's version."""
    return json.dumps(
        {
            "stale_after_s": policy.stale_after.total_seconds(),
            "grace_s": policy.grace.total_seconds(),
            "mass_loss_fraction": policy.mass_loss_fraction,
            "preemption": policy.preemption,
            "defragment": policy.defragment,
            "repair_spread": policy.repair_spread,
            VERSION: version,
        }
    )


# -- upcasting ----------------------------------------------------------------


def _round_v1_to_v2(record: Record) -> Record:
    """v1 rounds: before 0005 no lifecycle (None: nothing to plan around), before the
    switch no ``preemption`` (planned without priorities, where preemption evicts
    nothing: on is the same), before rollouts no fingerprint ("")."""
    policy = {"preemption": True, **record["policy"]}
    lifecycle = record["lifecycle"]
    current = [
        {"memory_gb_per_node": 0, "fingerprint": "", **_object(p, "a placement")}
        for p in _list(record["current"], "current")
    ]
    if lifecycle is None:
        lifecycle = Lifecycle().to_json()
    return {**record, "policy": policy, "current": current, "lifecycle": lifecycle}


def _node_v1_to_v2(content: Record) -> Record:
    """v1 node content: the fields with defaults may be missing."""
    return {"labels": {}, "fabric": None, "gpus_reserved": 0, **content}


def _round_v2_to_v3(record: Record) -> Record:
    """v3 differs from v2 only in where it is kept (by reference to an earlier round,
    rebuilt by ``scheduler.persistence.round_chain`` before it is read): the same record."""
    return record


# (kind, from_version) -> the record at from_version + 1
UPCASTERS: dict[tuple[str, int], Callable[[Record], Record]] = {
    (ROUND, 1): _round_v1_to_v2,
    (ROUND, 2): _round_v2_to_v3,
    (NODE, 1): _node_v1_to_v2,
}


def upcast(kind: str, version: Any, record: Record) -> Record:
    readable_version(kind, version)
    current = CURRENT_SCHEMA[kind]
    while version < current:
        record = UPCASTERS[(kind, version)](record)
        version += 1
    return record


def readable_version(kind: str, version: Any) -> int:
    """``version`` if this code reads records of ``kind`` at it; else why not."""
    current = CURRENT_SCHEMA[kind]
    if type(version) is not int:
        raise UnreadableRow(f"{kind} {VERSION} {_shown(version)} is not a version")
    if version > current:
        raise UnreadableRow(
            f"{kind} {VERSION} {version} is newer than this code reads ({current}); "
            "upgrade llmgw to read it"
        )
    if version < 1:
        raise UnreadableRow(f"{kind} {VERSION} {version} is not a version")
    return version


# -- reading ------------------------------------------------------------------


def node_from_content(content: Any, reported_at: datetime) -> Node:
    """A node from its stored content (any version), given when it reported."""
    content = _object(content, "a node's content")
    c = upcast(NODE, content.get(VERSION, 1), content)
    labels = _object(c["labels"], "labels")
    if not all(type(k) is str and type(v) is str for k, v in labels.items()):
        raise UnreadableRow("labels are not text to text")
    return Node(
        name=checked(c, "name", str),
        gpu_class=checked(c, "gpu_class", str, None),
        gpus=checked(c, "gpus", int),
        gpus_reserved=checked(c, "gpus_reserved", int),
        memory_gb=checked(c, "memory_gb", int, float, None),
        labels=labels,
        fabric=checked(c, "fabric", str, None),
        reported_at=reported_at,
    )


def placement_from_record(data: Any) -> Placement:
    p = _object(data, "a placement")
    return Placement(
        model=checked(p, "model", str),
        replica=checked(p, "replica", int),
        profile=checked(p, "profile", str),
        nodes=names(p.get("nodes")),
        gpus_per_node=checked(p, "gpus_per_node", int),
        gpu_class=checked(p, "gpu_class", str, None),
        memory_gb_per_node=checked(p, "memory_gb_per_node", int),
        fingerprint=checked(p, "fingerprint", str),
        # Rounds recorded before versions have none: nothing was pinned.
        version=checked({"version": "", **p}, "version", str),
        # Rounds recorded before moves have none under way.
        moving=checked({"moving": "", **p}, "moving", str),
        moving_for=checked({"moving_for": "", **p}, "moving_for", str),
    )


def names(value: Any) -> tuple[str, ...]:
    """A stored list of node names."""
    if not isinstance(value, list) or not all(type(n) is str for n in value):
        raise UnreadableRow(f"nodes {_shown(value)} is not a list of names")
    return tuple(value)


def recorded_round(
    columns: Mapping[str, Any], documents: Mapping[str, Any], inventory: Any
) -> RecordedRound:
    """A round from its row: ``columns`` the plain ones (times already read),
    ``documents`` its JSON columns decoded, ``inventory`` its inventory's nodes."""
    record = upcast_round(documents)
    reported = _object(record["reported_at"], "reported_at")
    nodes = []
    for content in _list(inventory, "the inventory"):
        name = _object(content, "a node's content").get("name")
        when = reported.get(name) if type(name) is str else None
        if type(when) is not str:
            raise UnreadableRow(f"no report time for node {_shown(name)}")
        nodes.append(node_from_content(content, datetime.fromisoformat(when)))
    return RecordedRound(
        id=checked(columns, "id", int),
        planned_at=columns["planned_at"],
        catalog_position=checked(columns, "catalog_position", int),
        nodes=tuple(nodes),
        current=tuple(placement_from_record(c) for c in _list(record["current"], "current")),
        policy=_policy(record["policy"]),
        placed=checked(columns, "placed", int),
        removed=checked(columns, "removed", int),
        unplaced=checked(columns, "unplaced", int),
        lifecycle=_lifecycle(record["lifecycle"]),
    )


def upcast_round(documents: Mapping[str, Any]) -> Record:
    """A round's documents (its JSON columns decoded) upcast to the current version, by
    the version its policy object carries."""
    policy = _object(documents["policy"], "policy")
    return upcast(ROUND, policy.get(VERSION, 1), {**documents, "policy": policy})


def policy_from_record(data: Any) -> StalenessPolicy:
    """A policy object alone, as a round records it (any version): what ``llmgw status``
    and the other views judge by (``scheduler.persistence.serving_policy``), read without
    the rest of its round's row."""
    policy = json_object(data, "policy")
    if readable_version(ROUND, policy.get(VERSION, 1)) == 1:
        policy = {"preemption": True, **policy}  # as _round_v1_to_v2 upcasts it
    return _policy(policy)


def _policy(p: Any) -> StalenessPolicy:
    p = _object(p, "policy")
    try:
        return StalenessPolicy(
            stale_after=timedelta(seconds=checked(p, "stale_after_s", int, float)),
            grace=timedelta(seconds=checked(p, "grace_s", int, float)),
            mass_loss_fraction=checked(p, "mass_loss_fraction", int, float),
            preemption=checked(p, "preemption", bool),
            # Rounds recorded before defragmentation planned without it.
            defragment=checked({"defragment": False, **p}, "defragment", bool),
            # Rounds recorded before the policy repaired spreads by model opt-in only.
            repair_spread=checked({"repair_spread": False, **p}, "repair_spread", bool),
        )
    except (ValueError, OverflowError) as exc:  # negative, NaN or past timedelta's range
        raise UnreadableRow(f"policy: {exc}") from None


_LIFECYCLE_ENTRIES: dict[str, dict[str, tuple[type | None, ...]]] = {
    "statuses": {
        "model": (str,),
        "replica": (int,),
        "state": (str,),
        "since": (str,),
        "placed_at": (str,),
        "message": (str,),
        "endpoint": (str, None),
        "reported": (bool,),
    },
    "cordons": {"node": (str,), "mode": (str,), "actor": (str,), "reason": (str,), "since": (str,)},
    "failures": {
        "model": (str,),
        "node": (str,),
        "failures": (int,),
        "last_failed_at": (str,),
        "last_reason": (str,),
    },
}


def replica_state(data: Mapping[str, Any], key: str = "state") -> str:
    """A stored replica state: one of ``STORED_STATES`` (null, from before replica
    states were stored, is placed); any other value makes its row unreadable."""
    state = checked(data, key, str, None)
    if state is None:
        return PLACED
    if state not in STORED_STATES:
        raise UnreadableRow(
            f"{key} {_shown(state)} is not a replica state ({', '.join(STORED_STATES)})"
        )
    return str(state)


def _lifecycle(data: Any) -> Lifecycle:
    data = _object(data, "lifecycle")
    for key, spec in _LIFECYCLE_ENTRIES.items():
        for item in _list(data.get(key), f"lifecycle {key}"):
            entry = _object(item, f"a lifecycle {key} entry")
            for name, kinds in spec.items():
                checked(entry, name, *kinds)
            # The same values a live row may hold, for the same reasons (explain replays
            # the round on them).
            if key == "statuses":
                replica_state(entry)
                # Optional: rounds recorded before engines' context was read lack them.
                if "effective_context_length" in entry:
                    checked(entry, "effective_context_length", int, None)
                if "context_detail" in entry:
                    checked(entry, "context_detail", str)
            if key == "cordons" and entry["mode"] not in (CORDONED, DRAINING):
                raise UnreadableRow(
                    f"lifecycle cordon mode {_shown(entry['mode'])} is neither "
                    f"{CORDONED} nor {DRAINING}"
                )
    backoff = _object(data.get("backoff"), "lifecycle backoff")
    checked(backoff, "base_s", int, float)
    checked(backoff, "cap_s", int, float)
    return Lifecycle.from_json(data)


def checked(data: Mapping[str, Any], key: str, *kinds: type | None) -> Any:
    """``data[key]`` if it is of one of ``kinds`` (None: null); bool is not an int here."""
    if key not in data:
        raise UnreadableRow(f"{key} is missing")
    value = data[key]
    if value is None and None in kinds:
        return value
    if type(value) in kinds or (float in kinds and type(value) is int):
        return value
    raise UnreadableRow(f"{key} {_shown(value)} is not {_kinds(kinds)}")


def _kinds(kinds: tuple[type | None, ...]) -> str:
    return " or ".join("null" if k is None else k.__name__ for k in kinds)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UnreadableRow(f"{what} is not a JSON object: {_shown(value)}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise UnreadableRow(f"{what} is not a JSON list: {_shown(value)}")
    return value


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else ``UnreadableRow`` naming ``what``."""
    return _object(value, what)


def json_list(value: Any, what: str) -> list[Any]:
    """``value`` if it is a JSON list, else ``UnreadableRow`` naming ``what``."""
    return _list(value, what)


def shown(value: Any) -> str:
    """A stored value as a reason shows it: its repr, cut short."""
    return _shown(value)
