"""Heartbeats end to end: a real `llmgw serve`, a real `llmgw agent` that sends heartbeats
between its full reports, and an agent of before heartbeats (full reports only) beside it.

A heartbeat naming a report the server does not hold (the node forgotten, the server
restarted) is answered "send the full report", and the agent's report in that tick heals it.
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.server import ApiServer, Tokens
from tests.e2e.agents import SIM, AgentProc, Cluster, cluster, eventually

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class OldAgent:
    """What an agent sent before heartbeats: the full report, every tick, by HTTP."""

    def __init__(self, c: Cluster, node: str) -> None:
        self.url = f"{c.server.url}/v1/nodes/{node}"
        self.token = c.tokens.agents[node]
        self.body = {"gpu_class": "SIM", "gpus": 2, "memory_gb": 16, "labels": {}, "replicas": []}
        self.stop = threading.Event()
        self.answers: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        auth = {"Authorization": f"Bearer {self.token}"}
        while not self.stop.wait(0.2):
            try:
                answer = httpx.put(self.url, json=self.body, headers=auth, timeout=10)
                self.answers.append(answer.status_code)
            except httpx.TransportError:
                self.answers.append(0)  # the server is restarting


def _puts(c: Cluster, node: str) -> int:
    return sum(
        1
        for x in c.server.logs("api.request")
        if x["method"] == "PUT" and x["path"] == f"/v1/nodes/{node}" and x["status"] == 200
    )


def _metric(c: Cluster, name: str) -> float:
    with c.server.client(c.tokens.reader) as client:
        text = client.get("/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _nodes(c: Cluster) -> dict[str, dict[str, Any]]:
    with c.server.client(c.tokens.reader) as client:
        return {n["name"]: n for n in client.get("/v1/nodes").json()}


def _healed(c: Cluster, agent: AgentProc, puts: int) -> None:
    """The agent was asked for its full report by a heartbeat, and sent it in the same
    tick: the first thing it sent past that heartbeat is the full report (its placements
    are read after the report, in a tick)."""
    eventually(lambda: agent.logs("agent.report_asked"), f"{agent.node} asked to report")
    eventually(lambda: _puts(c, agent.node) > puts, f"{agent.node}'s full report")
    mine = [x for x in c.server.logs("api.request") if x.get("actor") == f"agent-{agent.node}"]
    asked = datetime.fromisoformat(agent.logs("agent.report_asked")[0]["timestamp"])
    after = [x for x in mine if datetime.fromisoformat(x["timestamp"]) >= asked]
    assert (after[0]["method"], after[0]["path"]) == ("PUT", f"/v1/nodes/{agent.node}"), after[0]


def test_old_and_new_agents_coexist_and_a_heartbeat_after_a_restart_gets_the_full_report(
    tmp_path: Path, sqlite_url: str
) -> None:
    api_port, heartbeat_port = _free_port(), _free_port()
    settings = tmp_path / "llmgw.toml"
    settings.write_text(f"[server]\nheartbeat_port = {heartbeat_port}\n")
    with cluster(
        tmp_path,
        sqlite_url,
        ["new", "old", "udp"],
        server_args=["--port", str(api_port)],
        models=[],
    ) as c:
        c.server.env["LLMGW_SETTINGS"] = str(settings)
        c.server.stop()
        c.server.start()
        old = OldAgent(c, "old")
        old.thread.start()
        try:
            new = c.agent("new", "--full-report-every", "300")
            udp = c.agent("udp", "--full-report-every", "300", "--heartbeat-transport", "udp")
            # The new agent reports once, then its ticks (every 0.2 s) are heartbeats.
            eventually(
                lambda: _metric(c, "llmgw_node_heartbeats_total") >= 10, "ten heartbeats taken"
            )
            for name in ("new", "udp"):
                assert _puts(c, name) <= 2, f"the {name} agent sends heartbeats, not reports"
            before = {
                n: datetime.fromisoformat(_nodes(c)[n]["reported_at"]) for n in ("new", "udp")
            }

            def renewed() -> bool:
                nodes = _nodes(c)
                return all(
                    nodes[n]["state"] == "fresh"
                    and datetime.fromisoformat(nodes[n]["reported_at"]) > before[n]
                    for n in ("new", "udp")
                )

            # The lease is written (a batch a second): the node's reported_at moves on.
            eventually(renewed, "the new nodes' leases renewed by heartbeats alone")
            for name in ("new", "udp"):
                assert _puts(c, name) <= 2, f"the {name} agent sends heartbeats, not reports"
            old_puts = _puts(c, "old")
            eventually(lambda: _puts(c, "old") > old_puts, "the old agent still reports")
            assert _nodes(c)["old"]["state"] == "fresh"

            # A heartbeat naming a report the server no longer holds (the node forgotten:
            # its lease write finds no row and drops the report) is answered "send the full
            # report"; the agent sends it in the tick that was told, within one interval.
            puts = {name: _puts(c, name) for name in ("new", "udp")}
            for name in ("new", "udp"):
                done = c.cli("nodes", "forget", name)
                assert done.returncode == 0, done.stderr
            for agent in (new, udp):
                _healed(c, agent, puts[agent.node])
            # One heartbeat each was answered "send the full report", and none after it.
            assert _metric(c, "llmgw_node_heartbeats_refused_total") == 2

            # A new process on the same ports holds no report: the agents heal by a full
            # report (told so by a heartbeat, or sent after finding the server gone).
            c.server.stop()
            c.server.start()
            eventually(
                lambda: _metric(c, "llmgw_node_heartbeats_total") >= 5,
                "heartbeats taken again after the full report",
            )
            eventually(lambda: all(_puts(c, n) >= 1 for n in ("new", "udp")), "full reports")
            nodes = _nodes(c)
            assert {nodes[n]["state"] for n in ("new", "old", "udp")} == {"fresh"}
            assert old.answers[-1] == 200
        finally:
            old.stop.set()
            old.thread.join(30)


def test_an_agent_token_issued_after_the_server_started_may_send_heartbeats(
    tmp_path: Path, sqlite_url: str
) -> None:
    """The listener checks each line against the tokens in force, not the ones of its
    start: a newcomer's agent, given a token from `llmgw token new` after the replica
    started, was answered DENIED "unknown token" every tick (its reports were taken)."""
    heartbeat_port = _free_port()
    settings = tmp_path / "llmgw.toml"
    settings.write_text(f"[server]\nheartbeat_port = {heartbeat_port}\n")
    with cluster(tmp_path, sqlite_url, ["first"], models=[]) as c:
        c.server.env["LLMGW_SETTINGS"] = str(settings)
        c.server.stop()
        c.server.start()
        issued = c.cli("token", "new", "late", "--role", "agent", "--node", "late")
        assert issued.returncode == 0, issued.stderr
        token = issued.stdout.splitlines()[0].strip()
        auth = {"Authorization": f"Bearer {token}"}
        eventually(
            lambda: httpx.get(f"{c.server.url}/v1/placements", headers=auth).status_code == 200,
            "the API takes the new token",
        )
        late = AgentProc(c.workdir, c.server.url, "late", token, "--full-report-every", "300",
                         gpus="SIM:2")  # fmt: skip
        c.agents["late"] = late
        late.start()
        eventually(lambda: _metric(c, "llmgw_node_heartbeats_total") >= 10, "ten heartbeats taken")
        assert _puts(c, "late") <= 2, "the agent sends heartbeats, not reports"
        assert not late.logs("agent.heartbeat_refused")


def _placement_reads(c: Cluster) -> int:
    return sum(
        1
        for x in c.server.logs("api.request")
        if x["method"] == "GET" and x["path"] == "/v1/placements"
    )


def test_an_agent_reads_its_placements_only_when_its_heartbeats_say_they_moved(
    tmp_path: Path, sqlite_url: str
) -> None:
    """Each heartbeat's answer carries the node's placement generation: while it stays
    the one the agent read its placements under, the agent does not read them again (it
    read them every tick, a whole placement state's read for the server each time); a
    round that places a replica on the node moves it, and the agent reads and starts it."""
    with cluster(tmp_path, sqlite_url, ["solo"], models=[]) as c:
        agent = c.agent("solo", "--full-report-every", "300")
        eventually(lambda: _metric(c, "llmgw_node_heartbeats_total") >= 5, "five heartbeats")
        reads = _placement_reads(c)
        beats = _metric(c, "llmgw_node_heartbeats_total")
        eventually(
            lambda: _metric(c, "llmgw_node_heartbeats_total") >= beats + 10, "ten more heartbeats"
        )
        assert _placement_reads(c) <= reads + 1, "placements read on ticks where none moved"
        assert _puts(c, "solo") <= 2

        # A round places a replica here: the node's generation moves with the round's
        # event naming it, the agent reads its placements and starts the engine.
        c.add({**SIM, "scaling": {"min": 1}})
        c.place()
        eventually(lambda: c.ready("chat", 1), "the replica placed by the round, ready")
        assert agent.logs("agent.engine_started")


def _node(server: ApiServer, token: str, name: str) -> dict[str, Any]:
    with server.client(token) as client:
        return next(n for n in client.get("/v1/nodes").json() if n["name"] == name)


def test_two_servers_on_one_database_judge_a_node_that_stopped_beating_alike(
    tmp_path: Path, pg_url: str
) -> None:
    """Heartbeats renew a lease in the one server that takes them, written to the shared
    table; every replica judges the node from that table: the one that never heard a
    heartbeat sees the same renewed lease, and both call the node stale, then lost, once
    it stops."""
    tokens = Tokens.issue(agent_nodes=["gone"])
    env = {"LLMGW_STALE_AFTER": "3s", "LLMGW_GRACE": "2s"}
    servers = [
        ApiServer(tmp_path, pg_url, tokens=tokens, env=env, declared={"models": []})
        for _ in range(2)
    ]
    for server in servers:
        server.start()
    taking, other = servers
    try:
        token = tokens.agents["gone"]
        with taking.client(token) as client:
            answer = client.put("/v1/nodes/gone", json={"gpus": 0, "labels": {}})
        assert answer.status_code == 200, answer.text
        accepted = answer.json()
        reported = datetime.fromisoformat(accepted["reported_at"])
        line = f"HB gone {token} {accepted['report_id']}\n".encode()
        with socket.create_connection(("127.0.0.1", accepted["heartbeat_port"])) as beat:
            for _ in range(3):
                time.sleep(0.4)  # the heartbeats' pace, not a bound on anything
                beat.sendall(line)
                assert beat.recv(256).startswith(b"OK gone"), "the heartbeat was taken"

        def alike() -> set[datetime] | None:
            seen = {datetime.fromisoformat(_node(s, tokens.reader, "gone")["reported_at"])
                    for s in servers}  # fmt: skip
            return seen if len(seen) == 1 and min(seen) > reported else None

        eventually(alike, "both servers read the lease the heartbeats renewed, alike")

        def states() -> set[str]:
            return {_node(s, tokens.reader, "gone")["state"] for s in servers}

        eventually(lambda: states() == {"stale"}, "both servers judge the node stale")
        eventually(lambda: states() == {"lost"}, "both servers judge the node lost")
        assert not other.logs("api.heartbeats_refused")
    finally:
        for server in servers:
            server.stop()
