"""Node reports through the API: how many a second one ``llmgw serve`` process takes.

A cluster of 10,000 nodes whose agents report every 10 s sends 1,000 reports a
second, so that is the goal. The server is a real ``llmgw serve`` (one process,
fresh database, migrated by itself); the load comes from client processes on
the same machine, each a few threads with keep-alive connections, each thread
an agent token for its share of the nodes, as a fleet of agents would be.

Every node reports once before the clock starts (its first report inserts its
row); timed reports then repeat each node's content, as almost all heartbeats
do, with one in ``CHANGE_EVERY`` changing a label, so both paths are paid for.
The reference in the same run is ``GET /healthz`` with the same clients: the
most this HTTP stack and these clients can do on this machine, whatever the
store. With ``LLMGW_BENCH_BASE=TREE`` (a directory holding another version of
the packages, as for ``bench.ab``), each store is also measured with that
version's server, alternating with this one's, for a before/after ratio.
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
from pathlib import Path

import httpx
import psutil

from bench import common

GOAL = 1000.0
NODES, QUICK_NODES = 10_000, 1_000
SECONDS, QUICK_SECONDS = 10.0, 3.0
CLIENT_PROCESSES = 1
AGENTS = 50
CHANGE_EVERY = 50
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
            if status != 200 and len(failures) < 5:
                failures.append(f"{status}: {answer[:200]!r}")
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
    path: str,
    window: tuple[float, float],
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    """One client process: an agent (a connection) per token, each cycling through its nodes."""
    start_at, seconds = window
    host, port = url.removeprefix("http://").rsplit(":", 1)
    failures: list[str] = []

    async def main() -> int:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        end = start_at + seconds
        counts = await asyncio.gather(
            *(
                _agent((host, int(port)), t, nodes, path, end=end, failures=failures)
                for t, nodes in tokens
            )
        )
        return sum(counts)

    out.put((asyncio.run(main()), failures))


def _drive(
    url: str, shares: list[list[tuple[str, list[int]]]], path: str, seconds: float
) -> tuple[float, list[str]]:
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 1.0
    procs = [
        multiprocessing.Process(target=_client, args=(url, share, path, (start_at, seconds), out))
        for share in shares
    ]
    for p in procs:
        p.start()
    total, failures = 0, []
    for _ in procs:
        n, f = out.get()
        total += n
        failures += f
    for p in procs:
        p.join()
    return total / seconds if seconds else float(total), failures


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
        env["PYTHONPATH"] = tree  # that tree's packages first, as bench.ab does
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


def _measure(
    db_url: str, nodes: int, seconds: float, tree: str | None = None
) -> tuple[float, float, float, list[str]]:
    from llmgw.api.auth import issue_token

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
            _, failures = _drive(url, shares, "first", 0.0)
            assert not failures, failures
            common.progress(f"reports: {seconds:.0f}s of /healthz, then of reports")
            health, _ = _drive(url, shares, "healthz", seconds)
            server = psutil.Process(proc.pid)
            before = server.cpu_times()
            reports, failures = _drive(url, shares, "report", seconds)
            after = server.cpu_times()
            cpu = (after.user - before.user) + (after.system - before.system)
            # The clients share the machine: the server's own CPU per report is the figure
            # that says how many one server process can take, whatever the clients cost.
            per_report = cpu / max(reports * seconds, 1)
            return reports, health, per_report, failures
        finally:
            proc.terminate()
            proc.wait(30)


def run(quick: bool) -> list[common.Table]:
    nodes = QUICK_NODES if quick else NODES
    seconds = QUICK_SECONDS if quick else SECONDS
    table = common.Table(
        f"Node reports: {nodes} nodes, {AGENTS} agents "
        f"({CLIENT_PROCESSES} client processes), {seconds:.0f} s, one `llmgw serve`",
        [
            "store",
            "reports/s",
            "goal",
            "GET /healthz/s (stack ceiling)",
            "of ceiling",
            "server CPU/report",
            "reports/s per server core",
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
    runs: list[tuple[str, Callable[[], str], str | None]] = []
    for name, make in stores:
        if base:
            runs.append((f"{name} (base)", make, base))
        runs.append((name, make, None))
    ours: dict[str, float] = {}
    cpus: dict[str, float] = {}
    for name, make, tree in runs:
        common.progress(f"reports: {name}")
        reports, health, cpu, failures = _measure(make(), nodes, seconds, tree)
        ours[name] = reports
        cpus[name] = cpu
        if base and tree is None:
            base_name = name + " (base)"
            table.note(
                f"{name}: {reports / ours[base_name]:.2f}x the base's reports/s; "
                f"{cpus[base_name] / cpu:.2f}x less server CPU per report"
            )
        table.add(
            name,
            f"{reports:,.0f}",
            f"{GOAL:,.0f}",
            f"{health:,.0f}",
            f"{reports / health:.2f}" if health else "-",
            f"{cpu * 1000:.2f} ms",
            f"{1 / cpu:,.0f}" if cpu else "-",
            len(failures),
        )
        for f in failures[:2]:
            table.note(f"{name}: {f}")
    if reason is not None:
        table.note(reason)
    return [table]
