"""What the agent tells the control plane of each replica on its node. Pure.

Of a replica spanning nodes, the head reports its state; a worker speaks only
when its engine fails (the gang cannot serve without it), and not again once
the control plane holds the replica failed, so two nodes never take turns
overwriting one replica's state. A head still gathering its workers reports
its endpoint already: that is how they find it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from agent.placements import Key
from agent.processes import printable
from agent.state import Record

# The control plane takes a message of up to 1000 printable characters.
MAX_REPORTED_MESSAGE = 1000
MAX_CONTEXT_DETAIL = 200


def replica_states(
    records: Mapping[Key, Record],
    waits: Mapping[Key, str],
    *,
    node: str,
    worker_keys: Collection[Key] = (),
    known_failed: Collection[Key] = (),
) -> list[dict[str, Any]]:
    """Each replica's state as this node sees it, in key order."""
    states = []
    for key in sorted({*records, *waits}):
        record = records.get(key)
        worker = key in worker_keys or (record is not None and record.worker)
        if worker and (record is None or record.alive or key in known_failed):
            continue
        entry: dict[str, Any]
        if record is None:
            entry = {"state": "starting", "message": waits[key]}
        elif not record.alive:
            message = record.message
            if record.worker:
                message = f"node {node} (rank {record.rank}): {message}"
            entry = {"state": "failed", "message": message}
        elif record.ready:
            entry = {"state": "ready", "message": "", "endpoint": record.endpoint}
            if record.context_tokens is not None:
                entry["effective_context_length"] = record.context_tokens
                entry["context_detail"] = printable(record.context_detail)[:MAX_CONTEXT_DETAIL]
        elif record.nnodes > 1:
            entry = {
                "state": "starting",
                "message": f"{record.engine} on port {record.port}, gathering "
                f"{record.nnodes - 1} worker node(s) at port {record.port + 1}",
                "endpoint": record.endpoint,
            }
        else:
            entry = {"state": "starting", "message": f"{record.engine} on port {record.port}"}
        entry["message"] = printable(str(entry["message"]))[:MAX_REPORTED_MESSAGE]
        if record is not None and record.version:
            # Only to a control plane that pins versions (it sent this one).
            entry["version"] = record.version
            if record.profile:
                # What a control plane that gave the node up needs to place it here again.
                entry["profile"] = record.profile
        states.append({"model": key.model, "replica": key.replica, **entry})
    return states
