"""A test agent: reports its nodes' replicas to a real ``llmgw serve`` over HTTP.

Each tick it asks the server what runs on each of its nodes (``GET
/v1/placements?node=``) and reports the node with those replicas' states:
``starting`` the first time it sees a replica, ``ready`` the next (or never,
for a node that cannot start anything, or no states at all, for an agent that
predates them). Between ticks it counts the ready replicas of the models it
watches, so a test can say the count never fell below a floor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

NORMAL = "normal"  # starting, then ready
NEVER_READY = "never-ready"  # starting forever
OLD_AGENT = "old"  # no replica states at all


@dataclass
class AgentNode:
    name: str
    token: str
    inventory: Mapping[str, Any]
    mode: str = NORMAL
    seen: set[tuple[str, int, str]] = field(default_factory=set)


class ReportingAgent:
    def __init__(
        self, url: str, nodes: Iterable[AgentNode], reader: str, watch: Iterable[str] = ()
    ) -> None:
        self.url = url
        self.nodes = list(nodes)
        self.reader = reader
        self.watch = list(watch)
        self.ready: dict[str, list[int]] = {m: [] for m in self.watch}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-agent", daemon=True)

    def start(self) -> ReportingAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def tick(self, client: httpx.Client) -> None:
        for n in self.nodes:
            headers = {"Authorization": f"Bearer {n.token}"}
            placed = client.get(
                f"{self.url}/v1/placements", params={"node": n.name}, headers=headers
            ).json()
            body: dict[str, Any] = dict(n.inventory)
            if n.mode != OLD_AGENT:
                body["replicas"] = [self._state(n, p) for p in placed]
            answer = client.put(f"{self.url}/v1/nodes/{n.name}", json=body, headers=headers)
            if answer.status_code != 200:
                self.errors.append(f"{n.name}: {answer.status_code} {answer.text}")
        headers = {"Authorization": f"Bearer {self.reader}"}
        for model in self.watch:
            listed = client.get(
                f"{self.url}/v1/placements", params={"model": model}, headers=headers
            ).json()
            self.ready[model].append(sum(p["state"] in ("ready", "unreported") for p in listed))

    def _state(self, n: AgentNode, p: Mapping[str, Any]) -> dict[str, Any]:
        # A replica is known by its slot and its fingerprint: a new placement in
        # an old slot starts again.
        key = (p["model"], p["replica"], p["fingerprint"])
        first = key not in n.seen
        n.seen.add(key)
        state = "starting" if first or n.mode == NEVER_READY else "ready"
        out: dict[str, Any] = {"model": p["model"], "replica": p["replica"], "state": state}
        if state == "ready":
            out["endpoint"] = f"http://{n.name}:{8000 + p['replica']}"
        return out

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    self.tick(client)
                except httpx.HTTPError as exc:  # a server restart: try again next tick
                    self.errors.append(repr(exc))
                self._stop.wait(0.1)
