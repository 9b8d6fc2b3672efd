"""Each node's placement generation: told with every heartbeat, so an agent reads its
placements only when they may have changed.

An agent used to read ``GET /v1/placements?node=`` every tick, and each read costs the
server the whole placement state (every placement, its state, the cordons): at 100,000
nodes every 10 s, 10,000 such reads a second. Whatever changes what that read answers a
node's agent is written with an event of the placement trail naming the node (a round's
``placement.placed``, ``removed``, ``updated``, ``replica.failed``; a report's
``replica.<state>``, which names every node of the replica; a cordon). So a node's
*generation* is the position of the last trail event naming it, followed here from the
trail (one indexed read of the events past the last one seen, once a second, by the
lease writer's thread), and every node not named since this process started has the
position the trail had then. A generation is only compared for equality: an agent
holding the placements it read under generation G need not read them again while its
heartbeats are answered G. A new process, or another replica that started at another
position, answers another G for the same placements: its agents read them once more,
which is all that costs.

The agent reads its placements anyway after any full report, at least every
``full_report_every``, and every tick while it runs a part of a replica spanning nodes
(its head's endpoint is reported by another node, not always with an event).
"""

from __future__ import annotations

import threading

import structlog

from scheduler.persistence.audit_trail import nodes_named_after
from scheduler.persistence.store import SchedulerStore

log = structlog.get_logger("llmgw.api")

PAGE = 10_000


class PlacementGenerations:
    def __init__(self, store: SchedulerStore) -> None:
        self._store = store
        # The trail's position when this process started following it (None: not yet
        # read), every node's generation until an event names it.
        self._base: int | None = None
        self._after = 0
        # node -> the position of the last event naming it since: written by the one
        # thread that follows the trail, read (one lookup) by the listener's and the API's.
        self._named: dict[str, int] = {}
        self._lock = threading.Lock()

    def of(self, node: str) -> int | None:
        """The node's generation; None before the trail was first read."""
        base = self._base
        if base is None:
            return None
        return self._named.get(node, base)

    def follow(self) -> int:
        """Read the trail past the last event seen; how many events were read."""
        with self._lock:
            if self._base is None:
                head = self._store.events_head()
                self._base = self._after = head
                return 0
            read = 0
            while True:
                with self._store.engine.connect() as conn:
                    page = nodes_named_after(conn, after=self._after, limit=PAGE)
                for position, nodes in page:
                    if nodes is None:
                        # Which nodes it named is not known: every node's generation moves.
                        self._named = {}
                        self._base = position
                        log.warning("api.placement_generation_reset", position=position)
                    else:
                        for node in nodes:
                            self._named[node] = position
                    self._after = max(self._after, position)
                read += len(page)
                if len(page) < PAGE:
                    return read
