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

import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from bench import common

GOAL = 1000.0
NODES, QUICK_NODES = 10_000, 1_000
SECONDS, QUICK_SECONDS = 10.0, 3.0
CLIENT_PROCESSES = 2
THREADS_PER_PROCESS = 16
CHANGE_EVERY = 50
LLMGW = str(Path(sys.executable).parent / "llmgw")


def _body(node: int, k: int) -> dict[str, object]:
    labels = {"zone": f"z{node % 4}", "rack": f"r{node % 40}"}
    if k % CHANGE_EVERY == CHANGE_EVERY - 1:
        labels["seen"] = str(k)
    return {"gpu_class": "A100", "gpus": 8, "memory_gb": 1024, "labels": labels}


def _client(
    url: str,
    tokens: list[tuple[str, list[int]]],
    path: str,
    window: tuple[float, float],
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    """One client process: a thread per token, each cycling through its nodes."""
    start_at, seconds = window
    counts = [0] * len(tokens)
    failures: list[str] = []

    def loop(i: int) -> None:
        token, nodes = tokens[i]
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            while time.time() < start_at:
                time.sleep(0.001)
            end = start_at + seconds
            k = 0
            while time.time() < end:
                node = nodes[k % len(nodes)]
                if path == "report":
                    answer = http.put(f"/v1/nodes/n{node:05d}", json=_body(node, k))
                else:
                    answer = http.get("/healthz")
                if answer.status_code != 200 and len(failures) < 5:
                    failures.append(f"{answer.status_code}: {answer.text[:200]}")
                counts[i] += 1
                k += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(tokens))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((sum(counts), failures))


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
    return total / seconds, failures


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

    agents = CLIENT_PROCESSES * THREADS_PER_PROCESS
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
            first = [(t, [m]) for t, mine in issued for m in mine]
            with httpx.Client(base_url=url, timeout=60) as http:
                for token, (node,) in ((t.token, m) for t, m in first):
                    answer = http.put(
                        f"/v1/nodes/n{node:05d}",
                        json=_body(node, 0),
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    assert answer.status_code == 200, answer.text
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
        f"Node reports: {nodes} nodes, {CLIENT_PROCESSES * THREADS_PER_PROCESS} agents "
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
