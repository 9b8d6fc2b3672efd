"""Room in the process's descriptor limit for the heartbeat listener's connections.

Every heartbeat connection holds a descriptor of ``llmgw serve``, and anyone who can
reach the heartbeat port can open one without a token. Were ``heartbeat_connections``
(10,000 by default) more than the process may open (``RLIMIT_NOFILE``: 1,024 by
default under systemd and most shells), idle connections would take every descriptor
and the API, ``/healthz`` included, could accept nothing. So at start the soft limit is
raised toward the hard one, and the heartbeat connections are held to what is left once
the API keeps its own ``max_connections`` and ``RESERVED`` more (the database's
connections, the log, the declared file's watcher, the scheduler).
"""

from __future__ import annotations

import resource
from typing import NamedTuple

import structlog

log = structlog.get_logger("llmgw.api")

# Descriptors kept beside the API's connections for everything else the process opens.
RESERVED = 256


class Room(NamedTuple):
    soft: int  # the soft descriptor limit to set
    connections: int  # heartbeat connections allowed at once


def room(wanted: int, api_connections: int, soft: int, hard: int) -> Room:
    """The soft limit to ask for (at most ``hard``, never lower than now) and the
    heartbeat connections that fit under it beside the API's."""
    keep = api_connections + RESERVED
    need = wanted + keep
    if hard != resource.RLIM_INFINITY:
        need = min(need, hard)
    new_soft = soft if soft == resource.RLIM_INFINITY else max(soft, need)
    if new_soft == resource.RLIM_INFINITY:
        return Room(new_soft, wanted)
    return Room(new_soft, max(0, min(wanted, new_soft - keep)))


def make_room(wanted: int, api_connections: int) -> int:
    """Raise the soft descriptor limit as far as needed (and allowed); the heartbeat
    connections to allow, logged with the limits they were judged by."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    chosen = room(wanted, api_connections, soft, hard)
    if chosen.soft != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (chosen.soft, hard))
        except (ValueError, OSError) as exc:
            log.warning("api.descriptor_limit_unchanged", soft=soft, hard=hard, error=str(exc))
            chosen = room(wanted, api_connections, soft, soft)
    fields = {
        "heartbeat_connections": chosen.connections,
        "configured": wanted,
        "api_connections": api_connections,
        "reserved": RESERVED,
        "soft_limit": chosen.soft,
        "hard_limit": hard,
    }
    if chosen.connections < wanted:
        log.warning(
            "api.heartbeat_connections_clamped",
            detail="the descriptor limit leaves room for fewer heartbeat connections than"
            " [server] heartbeat_connections; raise LimitNOFILE (ulimit -n) to allow more;"
            " the agents beyond them are answered BUSY and send full reports",
            **fields,
        )
    else:
        log.info("api.heartbeat_connections", **fields)
    return chosen.connections
