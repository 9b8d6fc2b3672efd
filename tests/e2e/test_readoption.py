"""A node the control plane gave up comes back: its engines are kept, not restarted.

Real `llmgw serve` (rounds every 0.3 s, a node lost after 2 s + 2 s of silence), real
agents and their sim engines. The node's agent is frozen (SIGSTOP) for longer than
``stale_after + grace``: to the control plane that is a node it cannot hear, as in a
partition or its own outage, and the round gives the node up and unplaces (or moves)
its replicas. The engines themselves run on throughout. Back, the node's agent holds
them (``agent.runtime``) and reports them, and the round places each replica again
where it runs (``scheduler.planner.readoption``) unless a replacement is ready elsewhere.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest

from tests.e2e.agents import SIM, AgentProc, Cluster, cluster, eventually

pytestmark = pytest.mark.slow

ARGS = ["--with-scheduler", "--interval", "0.3", "--stale-after", "2", "--grace", "2"]
ONE = {**SIM, "scaling": {"min": 1}}


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "llmgw.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


def _frozen(agent: AgentProc) -> int:
    assert agent.proc is not None
    os.kill(agent.proc.pid, signal.SIGSTOP)
    return agent.proc.pid


def test_a_node_back_after_it_was_given_up_keeps_its_engine_and_its_replica(
    tmp_path: Path, sqlite_url: str
) -> None:
    with cluster(tmp_path, sqlite_url, ["n1"], models=[ONE], server_args=ARGS) as c:
        agent = c.agent("n1")
        eventually(lambda: c.ready("chat", 1), "chat[0] ready on n1")
        (engine,) = agent.live_engines()
        pid = _frozen(agent)
        try:
            # Nowhere else to go: the node's replica is unplaced.
            eventually(lambda: c.placements() == [], "n1 given up and chat[0] unplaced")
        finally:
            os.kill(pid, signal.SIGCONT)
        (back,) = eventually(lambda: c.ready("chat", 1), "chat[0] placed again and ready")
        assert back["nodes"] == ["n1"]
        assert back["endpoint"] == engine["endpoint"]
        (still,) = agent.live_engines()
        assert (still["pid"], still["start_time"]) == (engine["pid"], engine["start_time"])
        assert agent.logs("agent.engine_stopped") == []
        assert len(agent.logs("agent.engine_started")) == 1
        assert [e["engines"] for e in agent.logs("agent.back")][-1] == 1
        held = agent.logs("agent.stop_held")
        assert [(e["model"], e["replica"]) for e in held] == [("chat", 0)]


def test_a_node_back_after_its_replica_is_ready_elsewhere_stops_its_copy(
    tmp_path: Path, sqlite_url: str
) -> None:
    with cluster(tmp_path, sqlite_url, ["n1", "n2"], models=[ONE], server_args=ARGS) as c:
        for node in ("n1", "n2"):
            c.agent(node)
        (first,) = eventually(lambda: c.ready("chat", 1), "chat[0] ready")
        gone = c.agents[first["nodes"][0]]
        other = c.agents["n2" if gone.node == "n1" else "n1"]
        (engine,) = gone.live_engines()
        pid = _frozen(gone)
        try:

            def elsewhere() -> list[dict[str, object]] | None:
                ready = c.ready("chat", 1)
                return ready if ready and ready[0]["nodes"] == [other.node] else None

            (moved,) = eventually(elsewhere, f"chat[0] ready on {other.node}")
        finally:
            os.kill(pid, signal.SIGCONT)
        (replacement,) = other.live_engines()
        # The returning node's copy is stopped (after the agent's hold) and the one
        # already serving stays: two engines of one replica are not kept.
        (stopped,) = eventually(
            lambda: gone.logs("agent.engine_stopped"), f"{gone.node}'s copy stopped"
        )
        assert stopped["reason"] == "no longer placed on this node"
        assert gone.live_engines() == []
        assert not any(r["pid"] == engine["pid"] for r in gone.live_engines())
        (kept,) = eventually(lambda: c.ready("chat", 1), "chat[0] ready")
        assert kept["nodes"] == [other.node] and kept["endpoint"] == moved["endpoint"]
        assert [r["pid"] for r in other.live_engines()] == [replacement["pid"]]


@contextmanager
def _silent_node(c: Cluster, name: str) -> Iterator[None]:
    """A node that reports, a card free, but never starts what is placed on it: a
    replacement placed there stays ``placed``, never ready."""
    stop = threading.Event()
    body = {"gpu_class": "SIM", "gpus": 1, "address": "127.0.0.1", "replicas": []}

    def beat() -> None:
        with c.server.client(c.tokens.agents[name]) as http:
            while not stop.is_set():
                with suppress(httpx.HTTPError):
                    http.put(f"/v1/nodes/{name}", json=body)
                stop.wait(0.3)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def test_a_node_back_takes_its_replica_back_from_a_replacement_not_ready_yet(
    tmp_path: Path, sqlite_url: str
) -> None:
    with cluster(tmp_path, sqlite_url, ["n1", "n2"], models=[ONE], server_args=ARGS) as c:
        agent = c.agent("n1")
        eventually(lambda: c.ready("chat", 1), "chat[0] ready on n1")
        (engine,) = agent.live_engines()
        with _silent_node(c, "n2"):
            pid = _frozen(agent)
            try:

                def replaced() -> bool:
                    return [p["nodes"] for p in c.placements()] == [["n2"]]

                eventually(replaced, "n1 given up and chat[0] placed on n2")
            finally:
                os.kill(pid, signal.SIGCONT)

            def back() -> list[dict[str, object]] | None:
                ready = c.ready("chat", 1)
                return ready if ready and ready[0]["nodes"] == ["n1"] else None

            (again,) = eventually(back, "chat[0] placed again on n1, ready")
        assert again["endpoint"] == engine["endpoint"]
        (still,) = agent.live_engines()
        assert (still["pid"], still["start_time"]) == (engine["pid"], engine["start_time"])
        assert agent.logs("agent.engine_stopped") == []
        removed = c.cli.json("history", "--placements", "--type", "placement.removed")
        assert any("its engine still runs on n1" in e["reason"] for e in removed), removed
