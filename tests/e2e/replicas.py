"""Several `llmgw serve` replicas on one PostgreSQL database, with agents and gateways
that are given every replica's URL: the cluster issue 38 asks to be tested as it fails.

Each replica listens on a port fixed at the start, so a replica restarted after a
SIGKILL comes back where its clients look for it.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.api.server import ApiServer, Tokens
from tests.e2e.agents import AgentProc
from tests.e2e.gateways import GatewayProc, GatewayTokens
from tests.polling import poll_interval


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def plain(url: str) -> str:
    """A SQLAlchemy URL as psycopg takes it."""
    return url.replace("postgresql+psycopg://", "postgresql://")


@dataclass
class Replicas:
    workdir: Path
    db_url: str
    declared: dict[str, Any]
    interval: float = 0.5
    count: int = 3
    tokens: Tokens = field(init=False)
    gw_tokens: GatewayTokens = field(init=False)
    ports: list[int] = field(init=False)
    servers: list[ApiServer] = field(init=False)
    stopped: set[int] = field(default_factory=set)
    agents: list[AgentProc] = field(default_factory=list)
    gateways: list[GatewayProc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens = Tokens.issue(agent_nodes=[f"node-{i}" for i in range(3)])
        self.gw_tokens = GatewayTokens.issue()
        self.ports = free_ports(self.count)
        self.servers = [self._server(i) for i in range(self.count)]

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.ports]

    def rotated(self, first: int) -> str:
        """Every replica's URL, starting at ``first`` (clients spread over the replicas)."""
        urls = self.urls
        return ",".join(urls[first:] + urls[:first])

    def _server(self, i: int) -> ApiServer:
        return ApiServer(
            self.workdir,
            self.db_url,
            tokens=self.tokens,
            args=[
                "--with-scheduler",
                "--interval",
                str(self.interval),
                "--port",
                str(self.ports[i]),
            ],
            declared=self.declared,
            env={"LLMGW_TOKENS": self.tokens.env + ";" + self.gw_tokens.env},
        )

    def start_server(self, i: int) -> ApiServer:
        server = self.servers[i] = self._server(i)
        server.start(timeout=90)
        self.stopped.discard(i)
        return server

    def ready(self, i: int) -> bool:
        try:
            return httpx.get(self.urls[i] + "/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def signal(self, i: int, signum: int) -> None:
        proc = self.servers[i].proc
        assert proc is not None
        proc.send_signal(signum)
        if signum == signal.SIGSTOP:
            self.stopped.add(i)
        elif signum == signal.SIGCONT:
            self.stopped.discard(i)

    def kill(self, i: int) -> None:
        proc = self.servers[i].proc
        assert proc is not None
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def agent(self, n: int) -> AgentProc:
        node = f"node-{n}"
        proc = AgentProc(
            self.workdir,
            self.rotated(n % self.count),
            node,
            self.tokens.agents[node],
            gpus="SIM:2",
        )
        self.agents.append(proc)
        return proc.start()

    def gateway(self, n: int) -> GatewayProc:
        proc = GatewayProc(
            self.workdir,
            self.rotated(n % self.count),
            self.gw_tokens.gateway,
            "--gateway-id",
            f"gw-{n}",
            admin=self.tokens.reader,
        )
        self.gateways.append(proc)
        return proc.start()

    def lease(self) -> tuple[str, int, bool] | None:
        """(holder, epoch, live) of the scheduler's leadership lease, by the database."""
        with psycopg.connect(plain(self.db_url)) as conn:
            row = conn.execute(
                "SELECT holder, epoch, expires_at > clock_timestamp() FROM leadership_lease"
            ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), bool(row[2]))

    def leader(self) -> int | None:
        """The index of the replica holding a live lease, if any."""
        lease = self.lease()
        if lease is None or not lease[2]:
            return None
        for i, url in enumerate(self.urls):
            if lease[0].startswith(url + " "):
                return i
        return None

    def query(self, sql: str) -> Sequence[tuple[Any, ...]]:
        with psycopg.connect(plain(self.db_url)) as conn:
            return conn.execute(sql).fetchall()

    def diagnose(self) -> str:
        """What a failed wait shows: the lease, and each replica's last leadership lines."""
        lines = [f"lease: {self.lease()}"]
        for i, server in enumerate(self.servers):
            said = [
                e
                for e in server.logs()
                if str(e.get("event", "")).startswith(("leadership.", "placement.round_failed",
                                                         "placement.fenced", "placement.lease"))
            ]  # fmt: skip
            lines.append(f"replica {i} ({self.urls[i]}): {said[-6:]}")
        # Who holds what on the database: a frozen replica's session that still holds a
        # lock (active, not idle, so no idle-in-transaction timeout ends it) shows here.
        try:
            sessions = self.query(
                "SELECT a.pid, a.application_name, a.state, a.wait_event_type, a.wait_event,"
                " now() - a.xact_start, left(a.query, 120),"
                " (SELECT string_agg(l.locktype || ':' || l.mode || ':' || l.granted::text, ' ')"
                "  FROM pg_locks l WHERE l.pid = a.pid AND l.locktype <> 'virtualxid')"
                " FROM pg_stat_activity a WHERE a.datname = current_database()"
                " AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL"
            )
        except psycopg.Error as exc:
            sessions = [(f"pg_stat_activity unreadable: {exc}",)]
        lines.extend(f"session: {row}" for row in sessions)
        return "\n".join(lines)

    def close(self) -> None:
        for i in list(self.stopped):
            self.signal(i, signal.SIGCONT)
        for gw in self.gateways:
            gw.stop()
        for a in self.agents:
            a.stop(signal.SIGKILL)
        for a in self.agents:
            a.kill_engines()
        for server in self.servers:
            server.stop()


def wait_until(check: Any, what: str, timeout: float = 90) -> Any:
    started = time.monotonic()
    deadline = started + timeout
    while True:
        value = check()
        if value:
            return value
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"never happened within {timeout}s: {what}")
        time.sleep(poll_interval(now - started))
