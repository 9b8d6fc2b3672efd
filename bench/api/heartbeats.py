"""``python -m bench heartbeats``: a fleet's heartbeats as node leases, beside full reports.

    python -m bench heartbeats --nodes 100000 --interval 10 [--servers N]
        [--store sqlite|postgresql] [--duration 60] [--json]

Real ``llmgw serve`` processes (``--servers``, on one database) and simulated agents,
many per client process, each node with its own agent token (an auth file of one token
per node) and its own messages. One run, in this order:

1. every node's first full report (HTTP ``PUT /v1/nodes/{name}``), then placements
   seeded as a cluster of that size has them (``bench.reports``: about one replica a node);
2. the idle cost of a heartbeat connection: server CPU and memory with ``--idle``
   connections open and silent;
3. **today's protocol** (old agents): every node's full report every interval, paced,
   over ``--http-connections`` keep-alive connections, for ``--old-duration`` seconds;
4. **heartbeats** (new agents): every node's heartbeat every interval on the
   heartbeat listener, ``--connections`` long-lived connections shared by the nodes (a
   client process sends each connection's due lines in one write), with one node in
   1,000 changing a label each interval and one replica state change a second (full
   reports, by HTTP, as an agent sends them on change), warm-up then ``--duration``;
5. staleness: one node stops beating at the window's end, and the lease it left in the
   database is read as a round reads it until the node is ``stale`` and then ``lost``
   (``--stale-after`` and ``--grace`` are the servers' policy for the run);
6. the scheduler's round: the planner on a synthetic fleet of the same size
   (``bench.fleets``, two replicas a node), nothing changed and one node lost, beside
   reading the nodes of the run's database as a round does.

Each message's latency is from when it was sent to when its answer was read. A message
is *dropped* when it was due in the window and no answer came before the phase ended
(or it could not be sent within an interval of its time). CPU is the servers' own
(``/proc``), so the figure per heartbeat says what a server core takes, whatever the
simulated agents (which share this machine) cost; theirs is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

from bench.shared import common

KEYS = (
    "nodes",
    "interval_s",
    "servers",
    "store",
    "offered_per_s",
    "achieved_per_s",
    "dropped",
    "server_cpu_ms_per_heartbeat",
    "server_cpu_ms_per_report",
    "agent_p99_ms",
    "stale_detect_s",
    "round_idle_cpu_ms",
    "round_change_cpu_ms",
)
# One node in CHANGE_PER of them changes each interval (a label), as the issue's
# realistic rate says; and one replica state change a second across the fleet.
CHANGE_PER = 1000
STATE_CHANGES_PER_S = 1.0
TICK_S = 0.02
# Heartbeat lines per datagram (a simulated host's nodes; ~100 bytes a line).
DATAGRAM_LINES = 40
# The probe: one more node, beaten from the benchmark's own (otherwise idle) process,
# PROBE_PER_S heartbeats a second, each answer's arrival stamped by the kernel.
PROBE = "probe"
PROBE_PER_S = 20.0
# How often a client process's loop is asked to wake, to measure how late it does.
LAG_TICK_S = 0.005
# SO_TIMESTAMPNS (Linux): the kernel stamps each segment or datagram as it arrives.
SO_TIMESTAMPNS = 35


def _name(i: int) -> str:
    return f"n{i:05d}"  # bench.reports' seeded placements name nodes so


def _body(i: int, version: int, state: str | None = None) -> bytes:
    body: dict[str, Any] = {
        "gpu_class": "A100",
        "gpus": 8,
        "memory_gb": 1024,
        "labels": {"zone": f"z{i % 4}", "rack": f"r{i % 40}", "v": str(version)},
    }
    if state is not None:
        # The replica bench.reports seeds on this node (``_placements``).
        message = "loading" if state == "starting" else "exited with code 1"
        body["replicas"] = [
            {"model": f"m{i % 100:02d}", "replica": i // 100, "state": state, "message": message}
        ]
    return json.dumps(body).encode()


# -- the simulated agents (client processes) ------------------------------------------


@dataclass
class Stats:
    due: int = 0  # messages due in the window
    answered: int = 0  # of those, answered before the phase ended
    heartbeats: int = 0  # heartbeats answered OK in the window
    asked: int = 0  # heartbeats answered REPORT (anywhere in the phase)
    reports: int = 0  # full reports answered 200 in the window
    failures: list[str] = field(default_factory=list)
    latencies: array[float] = field(default_factory=lambda: array("d"))  # ms, in the window
    report_latencies: array[float] = field(default_factory=lambda: array("d"))
    # ms a client's loop woke after it asked to, in the window: time an answer that has
    # arrived waits before the simulated agent reads it (its own process's scheduling).
    loop_lags: array[float] = field(default_factory=lambda: array("d"))
    cpu_s: float = 0.0
    heartbeat_ports: dict[int, int] = field(default_factory=dict)  # server -> listener port

    def merge(self, other: Stats) -> None:
        self.due += other.due
        self.answered += other.answered
        self.heartbeats += other.heartbeats
        self.asked += other.asked
        self.reports += other.reports
        self.failures += other.failures[: max(0, 5 - len(self.failures))]
        self.latencies.extend(other.latencies)
        self.report_latencies.extend(other.report_latencies)
        self.loop_lags.extend(other.loop_lags)
        self.cpu_s += other.cpu_s
        self.heartbeat_ports.update(other.heartbeat_ports)


@dataclass
class Phase:
    kind: str  # "first", "old" or "new"
    start_at: float = 0.0
    window: tuple[float, float] = (0.0, 0.0)
    end_at: float = 0.0
    stop_node: int | None = None  # stops beating at the window's end (staleness)


class _Http:
    """One raw HTTP/1.1 keep-alive connection (as lean as an agent could be, as in
    bench.reports): PUT a report, read the whole answer."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def put(self, name: str, token: str, body: bytes) -> tuple[int, bytes]:
        """The answer's status and body; status 0 when the server closed the connection
        first (an overloaded server's keep-alive or body bounds): counted as not
        answered, and the next report opens a new connection, as an agent's would."""
        try:
            return await self._put(name, token, body)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.close()
            self.reader = self.writer = None
            return 0, f"the server closed the connection ({type(exc).__name__})".encode()

    async def _put(self, name: str, token: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(
            (
                f"PUT /v1/nodes/{name} HTTP/1.1\r\nHost: {self.host}\r\n"
                f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value)
        return int(head[9:12]), await self.reader.readexactly(length) if length else b""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _Beats(asyncio.Protocol, asyncio.DatagramProtocol):
    """One heartbeat connection, or one datagram socket: lines out in batches, each answer
    matched to its node's heartbeat by the node's name (a datagram lost is one unanswered)."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: Any = None
        self.buffer = b""
        # node name -> (node, sent at, due in the window)
        self.sent: dict[bytes, tuple[int, float, bool]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def send(self, lines: list[bytes]) -> None:
        if self.client.datagrams:
            for k in range(0, len(lines), DATAGRAM_LINES):
                self.transport.sendto(b"".join(lines[k : k + DATAGRAM_LINES]))
        else:
            self.transport.write(b"".join(lines))

    def data_received(self, data: bytes) -> None:
        lines = (self.buffer + data).split(b"\n")
        self.buffer = lines.pop()
        self._answers(lines)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self._answers(data.split(b"\n")[:-1])

    def _answers(self, lines: list[bytes]) -> None:
        now = time.time()
        for line in lines:
            parts = line.split(b" ", 2)
            entry = self.sent.pop(parts[1], None) if len(parts) > 1 else None
            if entry is None:
                if len(self.client.stats.failures) < 5:
                    self.client.stats.failures.append(f"unexpected answer {line[:200]!r}")
                continue
            node, sent_at, counted = entry
            self.client.answered_beat(node, line, now - sent_at, counted)


class _Client:
    """The nodes of one client process, their tokens and the ids of their last reports."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.nodes: list[int] = job["nodes"]
        self.tokens: dict[int, str] = job["tokens"]
        self.host: str = job["host"]
        self.ports: list[int] = job["ports"]  # each server's API port
        self.interval: float = job["interval"]
        self.total: int = job["total"]
        self.connections: int = job["connections"]
        self.http_connections: int = job["http_connections"]
        self.datagrams: bool = job["transport"] == "udp"
        self.ids: dict[int, str] = {}
        self.versions: dict[int, int] = {}
        self.states: dict[int, str] = {}
        self.heartbeat_ports: dict[int, int] = {}  # server index -> its listener's port
        self.stats = Stats()
        self.phase = Phase("first")
        self.rng = random.Random(self.nodes[0] if self.nodes else 0)
        self.stopped: set[int] = set()
        self.last_beat: dict[int, float] = {}
        # Nodes whose full report is to be sent, by server.
        self.changes: dict[int, asyncio.Queue[int]] = {}

    def server_of(self, i: int) -> int:
        return i % len(self.ports)

    def offset(self, i: int) -> float:
        """Each node's place in the interval: spread evenly over it."""
        return (i / self.total) * self.interval

    def in_window(self, t: float) -> bool:
        return self.phase.window[0] <= t < self.phase.window[1]

    # -- full reports ------------------------------------------------------------------

    async def report(self, http: _Http, i: int, counted_from: float | None = None) -> None:
        sent = time.time()
        status, answer = await http.put(
            _name(i), self.tokens[i], _body(i, self.versions.get(i, 0), self.states.get(i))
        )
        now = time.time()
        due = sent if counted_from is None else counted_from
        if status != 200:
            # A report due outside the measured window is not counted either way (one
            # sent as the servers stop finds its connection closed).
            if (status != 0 or self.in_window(due)) and len(self.stats.failures) < 5:
                self.stats.failures.append(f"{status} {_name(i)}: {answer[:200]!r}")
            return
        data = json.loads(answer)
        if data.get("report_id"):
            self.ids[i] = data["report_id"]
            self.heartbeat_ports[self.server_of(i)] = data["heartbeat_port"]
        if self.in_window(due):
            self.stats.reports += 1
            self.stats.report_latencies.append((now - due) * 1000)
            if self.phase.kind == "old":  # the only message of the turn: counted as such
                self.stats.answered += 1
                self.stats.latencies.append((now - due) * 1000)

    async def first(self) -> None:
        """Each node's first report, ``http_connections`` at a time."""
        queues = {
            s: deque(i for i in self.nodes if self.server_of(i) == s)
            for s in range(len(self.ports))
        }

        async def worker(server: int) -> None:
            http, queue = _Http(self.host, self.ports[server]), queues[server]
            try:
                while queue:
                    await self.report(http, queue.popleft())
            finally:
                http.close()

        await asyncio.gather(*(worker(k % len(self.ports)) for k in range(self.http_connections)))
        self.stats.heartbeat_ports = dict(self.heartbeat_ports)

    # -- today's protocol: a full report every interval ----------------------------------

    async def old(self) -> None:
        per = max(1, self.http_connections)
        shares = [self.nodes[k::per] for k in range(per)]

        async def connection(nodes: list[int]) -> None:
            if not nodes:
                return
            # Each node's report to its own server (a share holds nodes of every server
            # when there are more servers than client processes: sent all to the first
            # node's, they left report ids the heartbeats' servers did not hold, and the
            # heartbeat phase began with a storm of REPORT answers).
            https = {s: _Http(self.host, port) for s, port in enumerate(self.ports)}
            # Each node's turns, in time order; one request in flight, as an agent has.
            turns = sorted(
                (self.phase.start_at + self.offset(i) + k * self.interval, i)
                for i in nodes
                for k in range(int((self.phase.end_at - self.phase.start_at) / self.interval))
            )
            try:
                for due, i in turns:
                    if due >= self.phase.end_at:
                        break
                    counted = self.in_window(due)
                    self.stats.due += counted
                    now = time.time()
                    if now < due:
                        await asyncio.sleep(due - now)
                    elif now - due > self.interval:
                        continue  # a whole interval late: dropped
                    await self.report(https[self.server_of(i)], i, counted_from=due)
            finally:
                for http in https.values():
                    http.close()

        await asyncio.gather(*(connection(share) for share in shares))

    # -- heartbeats ------------------------------------------------------------------------

    def answered_beat(self, i: int, line: bytes, seconds: float, counted: bool) -> None:
        word = line.split(b" ", 1)[0]
        if word == b"OK":
            self.last_beat[i] = time.time()
            if counted:
                self.stats.heartbeats += 1
                self.stats.answered += 1
                self.stats.latencies.append(seconds * 1000)
            return
        if word == b"REPORT":
            self.stats.asked += 1
            self.ids.pop(i, None)
            self.changes[self.server_of(i)].put_nowait(i)  # send the full report
            return
        if len(self.stats.failures) < 5:
            self.stats.failures.append(f"{_name(i)}: {line[:200]!r}")

    async def new(self) -> None:
        loop = asyncio.get_running_loop()
        self.changes = {s: asyncio.Queue() for s in range(len(self.ports))}
        by_server: dict[int, list[_Beats]] = {}
        per_server = max(1, self.connections // len(self.ports))
        for server, port in self.heartbeat_ports.items():
            conns = []
            for _ in range(per_server):
                proto: _Beats
                if self.datagrams:
                    _, proto = await loop.create_datagram_endpoint(
                        lambda: _Beats(self), remote_addr=(self.host, port)
                    )
                else:
                    _, proto = await loop.create_connection(lambda: _Beats(self), self.host, port)
                conns.append(proto)
            by_server[server] = conns
        conn_of = {
            i: by_server[self.server_of(i)][k % per_server] for k, i in enumerate(self.nodes)
        }
        workers = [self._reporter(s) for s in range(len(self.ports)) for _ in range(2)]
        tasks = [asyncio.ensure_future(w) for w in workers]
        tasks.append(asyncio.ensure_future(self._changes()))
        tasks.append(asyncio.ensure_future(self._lag()))
        try:
            await self._beat(conn_of)
            # The answers still on their way count until the phase ends.
            while time.time() < self.phase.end_at + 2 and any(c.sent for c in conn_of.values()):
                await asyncio.sleep(0.05)
        finally:
            for t in tasks:
                t.cancel()
            for conns in by_server.values():
                for c in conns:
                    if c.transport is not None:
                        c.transport.close()

    async def _beat(self, conn_of: dict[int, _Beats]) -> None:
        """Send each node's heartbeat at its time; the lines due together in one write."""
        start, end = self.phase.start_at, self.phase.end_at
        order = sorted(self.nodes, key=self.offset)
        offsets = [self.offset(i) for i in order]
        k, turn = 0, 0
        while True:
            due = start + turn * self.interval + offsets[k]
            if due >= end:
                return
            now = time.time()
            if due > now:
                await asyncio.sleep(max(due - now, TICK_S))
                now = time.time()
            batches: dict[_Beats, list[bytes]] = {}
            while True:
                due = start + turn * self.interval + offsets[k]
                if due > now or due >= end:
                    break
                i = order[k]
                counted = self.in_window(due)
                report_id = self.ids.get(i)
                if i in self.stopped or (self.phase.stop_node == i and due >= self.phase.window[1]):
                    self.stopped.add(i)
                elif report_id is None:
                    pass  # changed: its full report is this turn's message, on its way
                else:
                    self.stats.due += counted
                    conn = conn_of[i]
                    conn.sent[_name(i).encode()] = (i, now, counted)
                    batches.setdefault(conn, []).append(
                        f"HB {_name(i)} {self.tokens[i]} {report_id}\n".encode()
                    )
                k += 1
                if k == len(order):
                    k, turn = 0, turn + 1
            for conn, lines in batches.items():
                conn.send(lines)

    async def _lag(self) -> None:
        """How late this process's loop wakes (``Stats.loop_lags``)."""
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            if self.in_window(time.time()):
                self.stats.loop_lags.append((time.perf_counter() - asked - LAG_TICK_S) * 1000)

    async def _changes(self) -> None:
        """The fleet's changes: one node in CHANGE_PER a label each interval, one replica
        state change a second (this process's share of both)."""
        share = len(self.nodes) / self.total
        labels_per_s = self.total / CHANGE_PER / self.interval * share
        states_per_s = STATE_CHANGES_PER_S * share
        rate = labels_per_s + states_per_s
        if rate <= 0:
            return
        while True:
            await asyncio.sleep(self.rng.expovariate(rate))
            i = self.rng.choice(self.nodes)
            if self.rng.random() < labels_per_s / rate:
                self.versions[i] = self.versions.get(i, 0) + 1
            else:
                self.states[i] = "failed" if self.states.get(i) == "starting" else "starting"
            self.ids.pop(i, None)  # changed: the next message is the full report
            self.changes[self.server_of(i)].put_nowait(i)

    async def _reporter(self, server: int) -> None:
        http, queue = _Http(self.host, self.ports[server]), self.changes[server]
        try:
            while True:
                i = await queue.get()
                if i in self.stopped:
                    continue  # a stopped agent sends nothing (its lease must age)
                await self.report(http, i, counted_from=time.time())
        finally:
            http.close()


def _client_main(job: dict[str, Any], commands: Any, answers: Any) -> None:
    if job["own_session"]:
        os.setsid()  # its own autogroup, as the servers (``_serve``)
    client = _Client(job)

    async def main() -> None:
        while True:
            phase: Phase | None = commands.get()
            if phase is None:
                return
            client.phase = phase
            client.stats = Stats()
            began = time.process_time()
            if phase.kind == "first":
                await client.first()
            elif phase.kind == "old":
                await asyncio.sleep(max(0.0, phase.start_at - time.time()))
                await client.old()
            else:
                await asyncio.sleep(max(0.0, phase.start_at - time.time()))
                await client.new()
            client.stats.cpu_s = time.process_time() - began
            stop = phase.stop_node
            answers.put((client.stats, None if stop is None else client.last_beat.get(stop)))

    common.run_fast(main())


# -- the servers ------------------------------------------------------------------------


def _serve(
    workdir: Path, db_url: str, auth: Path, k: int, args: argparse.Namespace
) -> tuple[subprocess.Popen[bytes], int]:
    env = {
        **os.environ,
        "LLMGW_DATABASE_URL": db_url,
        "LLMGW_LOG_LEVEL": "WARNING",
        "LLMGW_STALE_AFTER": f"{args.stale_after}s",
        "LLMGW_GRACE": f"{args.grace}s",
    }
    for name in ("LLMGW_CONFIG", "LLMGW_TOKENS", "LLMGW_OPEN_READS", "LLMGW_SETTINGS"):
        env.pop(name, None)
    if args.server_tree:
        env["PYTHONPATH"] = args.server_tree  # that tree's packages first (bench.shared.ab)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmgw",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--auth-file",
            str(auth),
        ],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=(workdir / f"serve-{k}.log").open("wb"),
        # A session of its own, as a server started by its own service manager has: with
        # the kernel's autogroups, a process shares the CPU of its session's group, so a
        # server left in the benchmark's session shared one group's share of a loaded
        # machine with the simulated agents that load it (docs/benchmarks/heartbeats.md).
        start_new_session=not args.same_session,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"llmgw serve did not start: {(workdir / f'serve-{k}.log').read_text()}")
    port = int(line.rsplit(":", 1)[1])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("llmgw serve never listened")


def _cpu(procs: Sequence[subprocess.Popen[bytes]]) -> float:
    total = 0.0
    for p in procs:
        t = psutil.Process(p.pid).cpu_times()
        total += t.user + t.system
    return total


def _p99(values: Sequence[float], q: float = 0.99) -> float | None:
    """The ``q`` quantile (the 99th percentile unless told)."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 2)


# -- staleness and rounds ---------------------------------------------------------------


def _detect(
    db_url: str, node: int, start_at: float, stale_after: float, grace: float
) -> dict[str, float]:
    """When (the clock's time) a round, reading the node's lease from the database as it
    does, first judges it stale, and lost; read from ``start_at`` on, every 50 ms."""
    from events.database.connection import make_engine
    from scheduler.lifecycle.staleness import Freshness, StalenessPolicy, freshness

    policy = StalenessPolicy(
        stale_after=timedelta(seconds=stale_after), grace=timedelta(seconds=grace)
    )
    engine = make_engine(db_url)
    found: dict[Freshness, float] = {}
    try:
        from sqlalchemy import text

        time.sleep(max(0.0, start_at - time.time()))
        deadline = time.time() + stale_after + grace + 60
        while Freshness.LOST not in found and time.time() < deadline:
            with engine.connect() as conn:
                row = conn.execute(
                    text("SELECT reported_at FROM nodes WHERE name = :n"), {"n": _name(node)}
                ).one()
            reported = row[0]
            if isinstance(reported, str):
                reported = datetime.fromisoformat(reported)
            reported = reported.replace(tzinfo=UTC) if reported.tzinfo is None else reported
            state = freshness(reported, datetime.now(UTC), policy)
            if state is not Freshness.FRESH:
                found.setdefault(Freshness.STALE, time.time())
            if state is Freshness.LOST:
                found[Freshness.LOST] = time.time()
            time.sleep(0.05)
    finally:
        engine.dispose()
    return {state.value: at for state, at in found.items()}


def _rounds(nodes: int, db_url: str) -> dict[str, float | None]:
    """The scheduler's round at this size: reading the nodes (this run's database), and
    the planner on a synthetic fleet of as many nodes and twice as many replicas
    (``bench.placement.round_scale``, in a process of its own).

    Reading the nodes: every node (``round_read_nodes_cpu_ms``, what a round read before
    issue 42 and what a placer's first round reads) and what a later round reads, the
    nodes changed since and those not fresh (``round_read_changes_cpu_ms``: a placer's
    ``NodeFeed``, at the newest lease's time, nothing having changed since its first
    read, and its ``PlacementFeed``'s read with nothing written). The idle and change
    figures add the latter to the planner's incremental round.
    """
    from sqlalchemy import func, select

    from events.database.connection import make_engine
    from scheduler.lifecycle.staleness import DEFAULT_STALENESS
    from scheduler.persistence.inventory_store import nodes_t
    from scheduler.persistence.store import SchedulerStore

    engine = make_engine(db_url)
    try:
        store = SchedulerStore(engine)
        began = time.process_time()
        store.nodes()
        read_ms = (time.process_time() - began) * 1000
        with engine.connect() as conn:
            newest = conn.execute(select(func.max(nodes_t.c.reported_at))).scalar_one()
        feed = store.node_feed()
        feed.read(newest, DEFAULT_STALENESS.stale_after)
        began = time.process_time()
        feed.read(newest + timedelta(seconds=1), DEFAULT_STALENESS.stale_after)
        changes_ms = (time.process_time() - began) * 1000
        # The placements as a later round reads them (``PlacementFeed``, nothing written
        # since its first read); this run's database holds none: bench.placement.round_reads
        # measures it at 200,000.
        placements = store.placement_feed()
        placements.read(newest)
        began = time.process_time()
        placements.read(newest + timedelta(seconds=1))
        changes_ms += (time.process_time() - began) * 1000
    finally:
        engine.dispose()
    common.progress(f"heartbeats: the planner's round on {nodes:,} nodes, from nothing first")
    done = subprocess.run(
        [sys.executable, "-m", "bench.placement.round_scale", "--nodes", str(nodes)],
        capture_output=True,
        text=True,
        check=True,
        cwd=common.REPO,
    )
    planned = json.loads(done.stdout)
    return {
        "round_idle_cpu_ms": round(planned["round_idle_cpu_ms"] + changes_ms, 1),
        "round_change_cpu_ms": round(planned["round_change_cpu_ms"] + changes_ms, 1),
        "round_fresh_cpu_ms": round(planned["plan_fresh_cpu_ms"] + read_ms, 1),
        "round_read_nodes_cpu_ms": round(read_ms, 1),
        "round_read_changes_cpu_ms": round(changes_ms, 1),
        "round_plan_full_idle_cpu_ms": planned["plan_idle_cpu_ms"],
        "round_plan_full_change_cpu_ms": planned["plan_change_cpu_ms"],
        "round_replicas": planned["replicas"],
    }


# -- the run ----------------------------------------------------------------------------


def _store_url(store: str) -> str:
    if store == "postgresql":
        reason = common.pg_available()
        if reason is not None:
            raise SystemExit(reason)
        common.pg_recreate("llmgw_bench_heartbeats")
        return common.pg_url("llmgw_bench_heartbeats")
    scratch = common.CACHE / "heartbeats"
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "llmgw.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def _auth(workdir: Path, nodes: int) -> tuple[Path, dict[int, str]]:
    """An auth file of one agent token per node (each node's own credential)."""
    from llmgw.api.guards.tokens import issue_token

    tokens: dict[int, str] = {}
    lines = []
    for i in range(nodes):
        issued = issue_token(f"agent-{_name(i)}", "agent", [_name(i)])
        tokens[i] = issued.token
        lines.append(issued.entry.to_toml())
    probe = issue_token(f"agent-{PROBE}", "agent", [PROBE])
    tokens[-1] = probe.token
    lines.append(probe.entry.to_toml())
    path = workdir / "auth.toml"
    path.write_text("\n".join(lines))
    return path, tokens


@dataclass
class Probe:
    """Heartbeats of one more node from this (otherwise idle) process, each waiting for
    its answer: ``server_ms`` from the send to the answer's arrival as the kernel stamped
    it (the server's share: its process waking, answering, writing), ``seen_ms`` to when
    this thread read it."""

    server_ms: array[float] = field(default_factory=lambda: array("d"))
    seen_ms: array[float] = field(default_factory=lambda: array("d"))
    failures: list[str] = field(default_factory=list)


def _probe(api_port: int, token: str, udp: bool, window: tuple[float, float]) -> Probe:
    import urllib.request

    out = Probe()
    request = urllib.request.Request(
        f"http://127.0.0.1:{api_port}/v1/nodes/{PROBE}",
        data=json.dumps({"gpus": 0, "labels": {}}).encode(),
        method="PUT",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        accepted = json.loads(answer.read())
    line = f"HB {PROBE} {token} {accepted['report_id']}\n".encode()
    address = ("127.0.0.1", accepted["heartbeat_port"])
    if udp:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect(address)
    else:
        sock = socket.create_connection(address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.settimeout(10.0)
    try:
        time.sleep(max(0.0, window[0] - time.time()))
        while time.time() < window[1]:
            sent = time.time()
            sock.send(line)
            data, ancillary, _, _ = sock.recvmsg(256, socket.CMSG_SPACE(16))
            seen = time.time()
            if not data.startswith(b"OK ") and len(out.failures) < 5:
                out.failures.append(f"probe: {data[:200]!r}")
            for level, kind, stamp in ancillary:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    seconds, nanos = struct.unpack("qq", stamp[:16])
                    out.server_ms.append((seconds + nanos / 1e9 - sent) * 1000)
            out.seen_ms.append((seen - sent) * 1000)
            time.sleep(max(0.0, sent + 1 / PROBE_PER_S - time.time()))
    except OSError as exc:
        out.failures.append(f"probe: {exc}")
    finally:
        sock.close()
    return out


def _idle(
    ports: Sequence[int], count: int, procs: Sequence[subprocess.Popen[bytes]]
) -> dict[str, float]:
    """Server CPU and memory with ``count`` heartbeat connections open and silent."""
    seconds = 5.0
    rss = sum(psutil.Process(p.pid).memory_info().rss for p in procs)
    before = _cpu(procs)
    time.sleep(seconds)
    quiet = _cpu(procs) - before
    socks = []
    try:
        for k in range(count):
            socks.append(socket.create_connection(("127.0.0.1", ports[k % len(ports)])))
        time.sleep(1.0)
        rss_open = sum(psutil.Process(p.pid).memory_info().rss for p in procs)
        before = _cpu(procs)
        time.sleep(seconds)
        busy = _cpu(procs) - before
    finally:
        for s in socks:
            s.close()
    return {
        "idle_connections": count,
        "idle_connection_cpu_ms_per_s": round(max(busy - quiet, 0) / seconds / count * 1000, 5),
        "idle_connection_kib": round((rss_open - rss) / count / 1024, 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:  # noqa: PLR0915 (the phases, in order)
    nodes, interval = args.nodes, args.interval
    load_before = os.getloadavg()
    db_url = _store_url(args.store)
    clients = max(1, min(args.clients, nodes))
    common.progress(f"heartbeats: {nodes:,} tokens, {args.servers} server(s) on {args.store}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        auth, tokens = _auth(workdir, nodes)
        # The first server migrates the database; the others start on it after.
        servers = [_serve(workdir, db_url, auth, 0, args)]
        servers += [_serve(workdir, db_url, auth, k, args) for k in range(1, args.servers)]
        procs = [p for p, _ in servers]
        ports = [port for _, port in servers]
        ctx = multiprocessing.get_context("spawn")
        answers: Any = ctx.Queue()
        pipes = []
        workers = []
        stop_node = nodes - 1
        seen: dict[str, float] = {}
        probed: list[Probe] = []
        try:
            for c in range(clients):
                mine = [i for i in range(c, nodes, clients) if i != stop_node or c == 0]
                if c == 0 and stop_node not in mine:
                    mine.append(stop_node)
                job = {
                    "nodes": mine,
                    "tokens": {i: tokens[i] for i in mine},
                    "host": "127.0.0.1",
                    "ports": ports,
                    "interval": interval,
                    "total": nodes,
                    "connections": max(1, args.connections // clients),
                    "http_connections": max(1, args.http_connections // clients),
                    "transport": args.transport,
                    "own_session": not args.same_session,
                }
                commands: Any = ctx.Queue()
                proc = ctx.Process(target=_client_main, args=(job, commands, answers))
                proc.start()
                pipes.append(commands)
                workers.append(proc)

            def phase(p: Phase) -> tuple[Stats, float | None]:
                for q in pipes:
                    q.put(p)
                total, last = Stats(), None
                for _ in pipes:
                    stats, beat = answers.get()
                    total.merge(stats)
                    last = beat if beat is not None else last
                return total, last

            common.progress(f"heartbeats: first report of each of {nodes:,} nodes")
            first, _ = phase(Phase("first"))
            if first.failures:
                raise RuntimeError(f"first reports failed: {first.failures}")
            from bench.api.reports import _seed

            common.progress("heartbeats: seeding placements")
            _seed(db_url, nodes)
            listener_ports = [first.heartbeat_ports[k] for k in range(len(ports))]
            common.progress(f"heartbeats: {args.idle:,} idle heartbeat connections")
            idle = _idle(listener_ports, args.idle, procs)

            def timed(kind: str, seconds: float) -> tuple[Stats, float, float | None]:
                start = time.time() + 2.0
                window = (start + args.warmup, start + args.warmup + seconds)
                extra = args.stale_after + args.grace + 5 if kind == "new" else 0
                p = Phase(kind, start, window, window[1] + extra, stop_node)
                # The servers' CPU over the window exactly: read at its edges.
                edges: list[float] = []

                def sample() -> None:
                    time.sleep(max(0.0, window[0] - time.time()))
                    edges.append(_cpu(procs))
                    time.sleep(max(0.0, window[1] - time.time()))
                    edges.append(_cpu(procs))

                t = threading.Thread(target=sample, daemon=True)
                t.start()
                watcher = probing = None
                if kind == "new":

                    def probe() -> None:
                        probed.append(_probe(ports[0], tokens[-1], args.transport == "udp", window))

                    probing = threading.Thread(target=probe, daemon=True)
                    probing.start()

                    # The stopped node's lease is read while the other nodes keep beating.
                    def watch() -> None:
                        seen.update(
                            _detect(db_url, stop_node, window[1], args.stale_after, args.grace)
                        )

                    watcher = threading.Thread(target=watch, daemon=True)
                    watcher.start()
                stats, last = phase(p)
                t.join()
                if watcher is not None:
                    watcher.join()
                if probing is not None:
                    probing.join()
                return stats, edges[1] - edges[0], last

            common.progress(f"heartbeats: today's full reports, {args.old_duration:.0f} s")
            old, old_cpu, _ = timed("old", args.old_duration)
            common.progress(f"heartbeats: heartbeats, {args.duration:.0f} s + staleness")
            new, new_cpu, last = timed("new", args.duration)
            stale_s, lost_s = (
                (round(seen[k] - last, 2) if k in seen and last is not None else None)
                for k in ("stale", "lost")
            )
        finally:
            for q in pipes:
                q.put(None)
            for w in workers:
                w.join(60)
                if w.is_alive():
                    w.kill()
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
    # The messages' figures now (stderr): the round at a large size takes minutes.
    common.progress(
        "heartbeats: "
        + json.dumps({"new": [new.answered, new.due, new_cpu, new.heartbeats, new.reports,
                              _p99(new.latencies)],
                      "old": [old.answered, old.due, old_cpu, old.reports, _p99(old.latencies)],
                      "stale": stale_s, "lost": lost_s, **idle})
    )  # fmt: skip
    rounds = _rounds(nodes, db_url) if args.rounds else {}
    probe = probed[0] if probed else Probe(failures=["probe: none ran"])
    per_report = old_cpu / old.reports if old.reports else None
    # The window's server CPU, less its full reports at today's cost, over its heartbeats.
    beats_cpu = new_cpu - (per_report or 0.0) * new.reports
    result: dict[str, Any] = {
        "nodes": nodes,
        "interval_s": interval,
        "servers": args.servers,
        "store": args.store,
        "offered_per_s": round(nodes / interval, 1),
        "achieved_per_s": round(new.answered / args.duration, 1),
        "dropped": max(new.due - new.answered, 0),
        "server_cpu_ms_per_heartbeat": (
            round(beats_cpu / new.heartbeats * 1000, 4) if new.heartbeats else None
        ),
        "server_cpu_ms_per_report": round(per_report * 1000, 3) if per_report else None,
        "agent_p99_ms": _p99(new.latencies),
        "stale_detect_s": stale_s,
        "round_idle_cpu_ms": rounds.get("round_idle_cpu_ms"),
        "round_change_cpu_ms": rounds.get("round_change_cpu_ms"),
        # Beyond the keys the issue names:
        "lost_detect_s": lost_s,
        "stale_after_s": args.stale_after,
        "grace_s": args.grace,
        "duration_s": args.duration,
        "heartbeats_per_s": round(new.heartbeats / args.duration, 1),
        "reports_per_s": round(new.reports / args.duration, 2),
        "heartbeats_asked_for_report": new.asked,
        "report_p99_ms": _p99(new.report_latencies),
        # Where an agent's latency goes (docs/benchmarks/heartbeats.md): the simulated
        # agents' loops waking late, against the probe's, from an idle process.
        "agent_p50_ms": _p99(new.latencies, 0.5),
        "agent_loop_lag_p99_ms": _p99(new.loop_lags),
        "probe_server_p50_ms": _p99(probe.server_ms, 0.5),
        "probe_server_p99_ms": _p99(probe.server_ms),
        "probe_seen_p99_ms": _p99(probe.seen_ms),
        "probe_heartbeats": len(probe.seen_ms),
        "server_cpu_cores": round(new_cpu / args.duration, 3),
        "client_cpu_ms_per_message": (
            round(new.cpu_s / max(new.answered, 1) * 1000, 4) if new.answered else None
        ),
        "transport": args.transport,
        "connections": args.connections,
        "nodes_per_connection": round(nodes / max(args.connections, 1), 1),
        "client_processes": clients,
        **idle,
        "full_report_protocol": {
            "offered_per_s": round(nodes / interval, 1),
            "achieved_per_s": round(old.answered / args.old_duration, 1),
            "dropped": max(old.due - old.answered, 0),
            "server_cpu_ms_per_report": round(per_report * 1000, 3) if per_report else None,
            "agent_p99_ms": _p99(old.latencies),
            "server_cpu_cores": round(old_cpu / args.old_duration, 3),
            "http_connections": args.http_connections,
            "duration_s": args.old_duration,
        },
        **{k: v for k, v in rounds.items() if k not in KEYS},
        "failures": (old.failures + new.failures + probe.failures)[:5],
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "machine": common.machine(),
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench heartbeats",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between messages")
    parser.add_argument("--servers", type=int, default=1, help="llmgw serve processes")
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=None, help="default: one interval")
    parser.add_argument(
        "--old-duration",
        type=float,
        default=None,
        help="measured seconds of today's protocol (default: --duration)",
    )
    parser.add_argument(
        "--connections",
        type=int,
        default=None,
        help="heartbeat connections in all (default: nodes / 50, 1 to 2,000)",
    )
    parser.add_argument(
        "--http-connections",
        type=int,
        default=200,
        help="keep-alive connections for full reports (the API takes 800)",
    )
    parser.add_argument(
        "--transport",
        choices=("tcp", "udp"),
        default="tcp",
        help="heartbeats on connections, or as datagrams (--connections: sockets)",
    )
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--idle", type=int, default=1000, help="idle connections measured")
    parser.add_argument("--stale-after", type=float, default=15.0)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument(
        "--no-rounds",
        dest="rounds",
        action="store_false",
        help="skip the scheduler's round figures",
    )
    parser.add_argument(
        "--same-session",
        action="store_true",
        help="leave the servers and simulated agents in this session (one autogroup: "
        "they share one share of the CPU), as the benchmark did before",
    )
    parser.add_argument(
        "--server-tree",
        default=None,
        help="run the servers from this tree (another version, to compare: run the "
        "benchmark with and without it, alternated)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if args.nodes < 2 or args.interval <= 0 or args.duration <= 0 or args.servers < 1:
        parser.error("--nodes >= 2, --interval and --duration > 0, --servers >= 1")
    args.warmup = args.interval if args.warmup is None else args.warmup
    args.old_duration = args.duration if args.old_duration is None else args.old_duration
    if args.connections is None:
        args.connections = max(1, min(2000, args.nodes // 50))
    args.connections = max(args.connections, args.servers * max(1, args.clients))
    args.idle = min(args.idle, 5000)
    common.quiet_logs()
    result = run(args)
    if args.json:
        print(json.dumps(result, sort_keys=False))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
