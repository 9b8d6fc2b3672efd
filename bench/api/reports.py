"""Node reports through the API: how many a second one ``llmgw serve`` process takes.

A cluster of 10,000 nodes whose agents report every 10 s sends 1,000 reports a
second, so that is the goal. The server is a real ``llmgw serve`` (one process,
fresh database, migrated by itself); the load comes from client processes on
the same machine: one process of ``AGENTS`` asyncio agents, each on its own
keep-alive connection with an agent token for its share of the nodes, as a fleet
of agents would be. The clients speak raw HTTP/1.1 (about as lean as a real
agent could be): on this shared 2-core machine every bit of CPU a client spends
is CPU the server does not get, so their cost is printed too, beside the
server's own CPU per report, which says what one server core can take whatever
the clients cost.

Every node reports once before the clock starts (its first report inserts its
row); timed reports then repeat each node's content, as almost all heartbeats
do, with one in ``CHANGE_EVERY`` changing a label, so both paths are paid for.
Before the clock starts, placements are seeded as a cluster of that size has
them (``_seed``): about one replica per node, one in ``WIDE_EVERY`` of them on
two nodes, written as a round is (``SchedulerStore.apply``), since each batch's
answer says how many replicas each of its nodes hosts. The answers are checked:
every timed report's ``replicas`` must be what was seeded for its node.
The reference in the same run is ``GET /healthz`` with the same clients: the
most this HTTP stack and these clients can do on this machine, whatever the
store. With ``LLMGW_BENCH_BASE=TREE`` (a directory holding another version of
the packages, as for ``bench.shared.ab``), each store is also measured with that
version's server, alternating with this one's, for a before/after ratio; a tree
whose server predates the httptools dependency runs on h11, as it shipped.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil

from bench.shared import common
from scheduler.planner.fleet.placements import Placement, Plan

GOAL = 1000.0
NODES, QUICK_NODES = 10_000, 1_000
SECONDS, QUICK_SECONDS = 10.0, 3.0
CLIENT_PROCESSES = 1
AGENTS = 50
CHANGE_EVERY = 50
ROUNDS = 2
# Seeded placements: a replica per node, and one in WIDE_EVERY nodes also starts a
# replica spanning it and the next node (tensor parallel across two nodes).
WIDE_EVERY = 10
LLMGW = str(Path(sys.executable).parent / "llmgw")


def _body(node: int, k: int) -> dict[str, object]:
    labels = {"zone": f"z{node % 4}", "rack": f"r{node % 40}"}
    if k % CHANGE_EVERY == CHANGE_EVERY - 1:
        labels["seen"] = str(k)
    return {"gpu_class": "A100", "gpus": 8, "memory_gb": 1024, "labels": labels}


async def _agent(
    address: tuple[str, int],
    token: str,
    nodes: list[int],
    path: str,
    *,
    end: float,
    total: int,
    failures: list[str],
) -> int:
    """One agent on one keep-alive connection: send, read the whole answer, repeat.

    Raw HTTP/1.1 on asyncio streams rather than an HTTP library: the clients share
    the machine with the server, and what a request costs the client is CPU the
    server does not get. This is about as lean as a real agent could be.
    """
    host, port = address
    reader, writer = await asyncio.open_connection(host, port)
    head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
    sent = 0
    try:
        # "first": each node once (its row is inserted), then stop.
        while time.time() < end if path != "first" else sent < len(nodes):
            node = nodes[sent % len(nodes)]
            if path != "healthz":
                body = json.dumps(_body(node, sent)).encode()
                request = (
                    f"PUT /v1/nodes/n{node:05d} HTTP/1.1\r\n{head}"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode() + body
            else:
                request = f"GET /healthz HTTP/1.1\r\n{head}\r\n".encode()
            writer.write(request)
            status, answer = await _answer(reader)
            # A report's answer must say how many replicas its node hosts, as seeded.
            wrong = status != 200 or (
                path == "report" and json.loads(answer)["replicas"] != _hosted(node, total)
            )
            if wrong and len(failures) < 5:
                failures.append(f"{status} n{node:05d}: {answer[:200]!r}")
            sent += 1
    finally:
        writer.close()
    return sent


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length) if length else b""


def _client(
    url: str,
    tokens: list[tuple[str, list[int]]],
    job: tuple[str, int],
    window: tuple[float, float],
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    """One client process: an agent (a connection) per token, each cycling through its nodes.

    ``job`` is what to send and how many nodes there are (their seeded replicas).
    """
    path, total = job
    start_at, seconds = window
    host, port = url.removeprefix("http://").rsplit(":", 1)
    failures: list[str] = []

    cpu = [0.0]

    async def main() -> int:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        end = start_at + seconds
        began = time.process_time()
        counts = await asyncio.gather(
            *(
                _agent((host, int(port)), t, nodes, path, end=end, total=total, failures=failures)
                for t, nodes in tokens
            )
        )
        cpu[0] = time.process_time() - began
        return sum(counts)

    sent = asyncio.run(main())
    out.put((sent, failures, cpu[0]))


def _drive(
    url: str, shares: list[list[tuple[str, list[int]]]], path: str, seconds: float, total: int
) -> tuple[float, list[str], float]:
    """Requests a second (or sent, for "first"), the first failures, client CPU a request."""
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 1.0
    procs = [
        multiprocessing.Process(
            target=_client, args=(url, share, (path, total), (start_at, seconds), out)
        )
        for share in shares
    ]
    for p in procs:
        p.start()
    total, failures, cpu = 0, [], 0.0
    for _ in procs:
        n, f, c = out.get()
        total += n
        failures += f
        cpu += c
    for p in procs:
        p.join()
    return total / seconds if seconds else float(total), failures, cpu / max(total, 1)


def _serve(
    workdir: Path, db_url: str, tokens_env: str, tree: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    env = {
        **os.environ,
        "LLMGW_DATABASE_URL": db_url,
        "LLMGW_TOKENS": tokens_env,
        "LLMGW_LOG_LEVEL": "WARNING",
    }
    for name in ("LLMGW_CONFIG", "LLMGW_AUTH_FILE", "LLMGW_OPEN_READS", "LLMGW_SETTINGS"):
        env.pop(name, None)
    if tree is not None:
        env["PYTHONPATH"] = tree  # that tree's packages first, as bench.shared.ab does
        server = Path(tree, "llmgw", "api", "server.py")
        if server.exists() and "httptools" not in server.read_text(encoding="utf-8"):
            # A tree from before httptools was a dependency ran on h11, as it shipped.
            env["PYTHONPATH"] += os.pathsep + str(_without_httptools())
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "serve", "--host", "127.0.0.1", "--port", "0"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=(workdir / "serve.log").open("wb"),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"llmgw serve did not start: {(workdir / 'serve.log').read_text()}")
    url = line.split("listening on ", 1)[1].strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("llmgw serve never answered /healthz")


@dataclass(frozen=True)
class Measured:
    reports: float  # a second
    health: float  # GET /healthz a second, same clients
    server_cpu: float  # seconds of the server process's CPU a report
    client_cpu: float  # seconds of the clients' CPU a report
    failures: list[str]


def _without_httptools() -> Path:
    """A directory whose ``httptools`` cannot be imported: uvicorn's "auto" then picks h11."""
    shim = common.CACHE / "without-httptools"
    (shim / "httptools").mkdir(parents=True, exist_ok=True)
    (shim / "httptools" / "__init__.py").write_text(
        'raise ImportError("hidden by bench.api.reports: the base tree ran without httptools")\n'
    )
    return shim


def _placements(nodes: int) -> list[Placement]:
    """A replica on each node, and one on two nodes starting at every ``WIDE_EVERY``th."""
    one = [
        Placement(f"m{i % 100:02d}", i // 100, "one", (f"n{i:05d}",), 8, "A100", 80)
        for i in range(nodes)
    ]
    two = [
        Placement(
            f"wide{i % 10}", i // 10, "two", (f"n{i:05d}", f"n{(i + 1) % nodes:05d}"), 8, "A100", 80
        )
        for i in range(0, nodes, WIDE_EVERY)
    ]
    return one + two


def _hosted(node: int, nodes: int) -> int:
    """How many of ``_placements(nodes)`` run on ``node``."""
    return 1 + (node % WIDE_EVERY == 0) + ((node - 1) % nodes % WIDE_EVERY == 0)


def _seed(db_url: str, nodes: int) -> None:
    """Write ``_placements`` as one round would, from this process, while the server idles."""
    from events.database.connection import make_engine
    from scheduler.lifecycle.staleness import StalenessPolicy
    from scheduler.persistence.store import SchedulerStore

    engine = make_engine(db_url)
    try:
        store = SchedulerStore(engine)
        store.apply(
            Plan(keep=(), place=tuple(_placements(nodes)), remove=(), unplaced=()),
            based_on=store.state(),
            catalog_position=0,
            nodes=store.nodes(),
            now=datetime.now(UTC),
            policy=StalenessPolicy(),
        )
    finally:
        engine.dispose()


def _measure(db_url: str, nodes: int, seconds: float, tree: str | None = None) -> Measured:
    from llmgw.api.guards.tokens import issue_token

    agents = AGENTS
    issued = []
    for a in range(agents):
        mine = list(range(a, nodes, agents))
        issued.append((issue_token(f"agent-{a}", "agent", [f"n{i:05d}" for i in mine]), mine))
    env = ";".join(t.entry.to_env() for t, _ in issued)
    shares = [
        [(t.token, mine) for t, mine in issued[p::CLIENT_PROCESSES]]
        for p in range(CLIENT_PROCESSES)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _serve(Path(tmp), db_url, env, tree)
        try:
            common.progress(f"reports: first report of each of {nodes} nodes")
            _, failures, _ = _drive(url, shares, "first", 0.0, nodes)
            assert not failures, failures
            common.progress(f"reports: seeding {len(_placements(nodes)):,} placements")
            _seed(db_url, nodes)
            common.progress(f"reports: {seconds:.0f}s of /healthz, then of reports")
            health, _, _ = _drive(url, shares, "healthz", seconds, nodes)
            server = psutil.Process(proc.pid)
            before = server.cpu_times()
            reports, failures, client = _drive(url, shares, "report", seconds, nodes)
            after = server.cpu_times()
            cpu = (after.user - before.user) + (after.system - before.system)
            # The clients share the machine: the server's own CPU per report is the figure
            # that says how many one server process can take, whatever the clients cost.
            per_report = cpu / max(reports * seconds, 1)
            return Measured(reports, health, per_report, client, failures)
        finally:
            proc.terminate()
            proc.wait(30)


def run(quick: bool) -> list[common.Table]:
    nodes = QUICK_NODES if quick else NODES
    seconds = QUICK_SECONDS if quick else SECONDS
    rounds = 1 if quick else ROUNDS
    table = common.Table(
        f"Node reports: {nodes} nodes, {AGENTS} agents ({CLIENT_PROCESSES} client process, "
        f"raw HTTP/1.1 keep-alive), {seconds:.0f} s, one `llmgw serve`, best of {rounds}",
        [
            "store",
            "reports/s",
            "goal",
            "GET /healthz/s (same clients)",
            "server CPU/report",
            "reports/s per server core",
            "client CPU/report",
            "failures",
        ],
    )
    stores: list[tuple[str, Callable[[], str]]] = []
    scratch = common.CACHE / "reports"
    scratch.mkdir(parents=True, exist_ok=True)

    def sqlite_url() -> str:
        path = scratch / "llmgw.db"
        path.unlink(missing_ok=True)
        return f"sqlite:///{path}"

    def pg() -> str:
        common.pg_recreate("llmgw_bench_reports")
        return common.pg_url("llmgw_bench_reports")

    stores.append(("SQLite", sqlite_url))
    reason = common.pg_available()
    if reason is None:
        stores.append(("PostgreSQL", pg))
    base = os.environ.get("LLMGW_BENCH_BASE")
    for name, make in stores:
        # Base and ours alternate, so a moment of load elsewhere slows both; best of each.
        best: dict[str | None, Measured] = {}
        for _ in range(rounds):
            for tree in (base, None) if base else (None,):
                common.progress(f"reports: {name}{' (base)' if tree else ''}")
                got = _measure(make(), nodes, seconds, tree)
                if tree not in best or got.reports > best[tree].reports:
                    best[tree] = got
        rows = [(base, f"{name} (base)")] if base else []
        for tree, label in [*rows, (None, name)]:
            m = best[tree]
            table.add(
                label,
                f"{m.reports:,.0f}",
                f"{GOAL:,.0f}",
                f"{m.health:,.0f}",
                f"{m.server_cpu * 1000:.2f} ms",
                f"{1 / m.server_cpu:,.0f}" if m.server_cpu else "-",
                f"{m.client_cpu * 1000:.2f} ms",
                len(m.failures),
            )
            for f in m.failures[:2]:
                table.note(f"{label}: {f}")
        if base:
            before, after = best[base], best[None]
            table.note(
                f"{name}: {after.reports / before.reports:.2f}x the base's reports/s; "
                f"{before.server_cpu / after.server_cpu:.2f}x less server CPU per report"
            )
        ours = best[None]
        verdict = "met" if ours.reports >= GOAL else "not met"
        table.note(
            f"{name}: goal {GOAL:,.0f} reports/s on one server process: {verdict} as measured "
            f"({ours.reports:,.0f}/s with the clients on the same cores); the server's own CPU "
            f"allows {1 / ours.server_cpu:,.0f}/s on one core"
        )
    if reason is not None:
        table.note(reason)
    return [table]
