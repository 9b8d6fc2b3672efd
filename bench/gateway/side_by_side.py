"""``python -m bench.gateway``: a gateway's added latency, side by side with its peers.

Measured the way the public gateway benchmarks do it: one upstream stub fast enough not to
be the limit (``bench.gateway.stub``, uvloop), each gateway in front of that same stub, and
**added latency = latency through the gateway minus latency straight to the stub**, each
percentile taken from a window through the gateway minus the same percentile of the direct
window of the same round. The gateways: the LiteLLM proxy and ``vllm-router`` (from
``.venv-peers``: ``make bench-peers``), ours (``llmgw gateway``, when the ``llmgw`` given
has it) and, to choose ours' HTTP stack by measurement, minimal pass-throughs on each
candidate server and client (``bench.gateway.candidates``). How each is started:
``bench.gateway.targets``; the control plane ours follows: ``bench.gateway.control``.

Runs are interleaved: for each round, each concurrency (1, 16, 64 clients) and each mode
(plain, streamed), every gateway and the direct path get one window in turn, the order
rotating from round to round, so a moment of load elsewhere on this shared machine falls on
all of them rather than on one. A figure is the median over the rounds (at least 3). The
load comes from a separate process (``bench.gateway.load``: raw HTTP/1.1 keep-alive on
uvloop, closed loop, one connection per client) whose own CPU is printed: the direct row is
the most the load generator and the stub can do together, and is the proof that neither is
what limits a gateway's figures.

Reported per gateway: added p50/p99 (plain), added time to first event, whole stream and per
streamed event (p99 of the time between successive events) for streams, requests/s, the
gateway's CPU per request (its process and all its descendants, user + system), and its
memory (RSS) at the start and the end. ``--soak N`` is the separate long mode: N requests
through one gateway (ours by default) in ten windows, its RSS after each.

Progress goes to stderr; stdout holds the markdown tables. ``--json PATH`` writes every
window's raw figures and the summary, for docs and charts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.gateway.candidates import KINDS
from bench.gateway.control import MODEL, Unavailable
from bench.gateway.load import Job
from bench.gateway.targets import (
    OURS_DEFAULT,
    Target,
    candidate,
    direct,
    litellm,
    ours,
    tree_usage,
    vllm_router,
)
from bench.shared import common

MODES = ("plain", "stream")
PEERS = ("litellm", "vllm-router")
# The goals for ours (one process), checked against this run's figures.
GOAL_P50_C1 = 0.0005
GOAL_P99_C1 = 0.002
GOAL_P99_C64 = 0.015
GOAL_CHUNK_P99 = 0.001
GOAL_X_LITELLM = 30.0
GOAL_X_ROUTER = 0.5


@dataclass(frozen=True)
class Settings:
    repeats: int = 3
    concurrency: tuple[int, ...] = (1, 16, 64)
    modes: tuple[str, ...] = MODES
    seconds: float = 3.0
    min_requests: int = 300
    chunks: int = 16
    chunk_delay_ms: float = 1.0
    peers: tuple[str, ...] = PEERS
    candidates: tuple[str, ...] = KINDS
    ours: str | None = None  # the command line template, or None to leave ours out
    # Other variants of ours measured in the same run (before/after a change, --workers):
    # (label, command line template), each following a control plane of its own.
    variants: tuple[tuple[str, str], ...] = ()
    llmgw: str = str(Path(sys.executable).parent / "llmgw")
    # `llmgw token new` flags for the client token of ours and its variants (limits).
    client_limits: tuple[str, ...] = ()
    # The model's profile ``slots`` in a gateway's control plane, by ``ours`` or a
    # variant's name (``--slots NAME=N``): the queue stage in (N) or out (none).
    slots: tuple[tuple[str, int], ...] = ()
    peers_venv: Path = common.REPO / ".venv-peers"
    # Stubs, each a replica of the model: ours and vllm-router spread over them all
    # (LiteLLM and the pass-throughs stay in front of the first; direct is the first).
    replicas: int = 1
    # The model's routing profile in ours' catalog ("": the default, least-loaded).
    routing: str = ""
    # LLMGW_BENCH_BASE: another tree whose control plane and gateway are the variant
    # ``base`` (run as ``python -m llmgw`` with that tree first on the path).
    base_tree: Path | None = None


@dataclass
class Measured:
    """One window of one target: the load generator's figures and the gateway's cost."""

    key: str
    round: int
    clients: int
    mode: str
    window: dict[str, Any]
    cpu: float  # the gateway's CPU seconds in the window (0 for direct)
    stub_cpu: float  # all the stubs'

    rss: int  # the gateway's RSS after the window


@dataclass
class Run:
    settings: Settings
    labels: dict[str, str] = field(default_factory=dict)
    measured: list[Measured] = field(default_factory=list)
    rss_start: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    load: list[tuple[float, float, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def body(stream: bool) -> str:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say hello in five words."}],
            "max_tokens": 16,
            "stream": stream,
        }
    )


@contextmanager
def stub(settings: Settings, workdir: Path) -> Iterator[tuple[psutil.Process, int]]:
    """The upstream stub in a process of its own; its process (for its CPU) and port."""
    with (workdir / "stub.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.gateway.stub",
                "--chunks",
                str(settings.chunks),
                "--chunk-delay-ms",
                str(settings.chunk_delay_ms),
            ],
            cwd=common.REPO,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if "listening on " not in line:
            raise RuntimeError(f"the stub did not start: {line!r}")
        yield psutil.Process(proc.pid), int(line.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def stubs(settings: Settings, workdir: Path) -> Iterator[list[tuple[psutil.Process, int]]]:
    """``settings.replicas`` stubs, each in a process of its own (and its log)."""
    with contextlib.ExitStack() as stack:
        started = []
        for i in range(max(1, settings.replicas)):
            home = workdir if i == 0 else workdir / f"stub-{i}"
            home.mkdir(exist_ok=True)
            started.append(stack.enter_context(stub(settings, home)))
        yield started


def check(target: Target, timeout: float = 60.0) -> None:
    """One plain and one streamed answer through the target, whole and right, before any
    window (our gateway answers once it has its table: it is given up to ``timeout``)."""
    deadline = time.monotonic() + timeout
    last = ""
    with httpx.Client(base_url=target.url, headers=target.headers, timeout=30) as client:
        while time.monotonic() < deadline:
            plain = client.post(target.path, content=body(False), headers=_json)
            streamed = client.post(target.path, content=body(True), headers=_json)
            if (
                plain.status_code == 200
                and "chat.completion" in plain.text
                and streamed.status_code == 200
                and "[DONE]" in streamed.text
            ):
                return
            last = f"{plain.status_code} {plain.text[:200]} / {streamed.status_code}"
            time.sleep(0.5)
    raise Unavailable(f"{target.label} does not answer right: {last}")


_json = {"content-type": "application/json"}


class Load:
    """One load-generator process on one target: warm, then timed windows on demand."""

    def __init__(self, target: Target, job: Job) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.gateway.load", json.dumps(asdict(job))],
            cwd=common.REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.target = target
        line = self._line()
        if line != "warm":
            raise RuntimeError(f"load generator on {target.label}: {line!r}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def window(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self._line()
        if not line.startswith("{"):
            raise RuntimeError(f"load generator on {self.target.label} ended: {line!r}")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def job_for(target: Target, clients: int, stream: bool, settings: Settings, requests: int) -> Job:
    return Job(
        host="127.0.0.1",
        port=target.port,
        path=target.path,
        headers=target.headers,
        body=body(stream),
        connections=clients,
        seconds=settings.seconds,
        min_requests=settings.min_requests,
        requests=requests,
        # Each connection warms its path once or more; bounded so the slowest peer's warm-up
        # stays a few seconds at 64 clients.
        warmup=max(2, min(20, 200 // clients)),
    )


def measure(
    target: Target,
    stub_procs: Sequence[psutil.Process],
    clients: int,
    mode: str,
    *,
    settings: Settings,
    rnd: int,
) -> Measured:
    load = Load(target, job_for(target, clients, mode == "stream", settings, 0))
    try:
        cpu0, _ = tree_usage(target.process())
        stub0 = sum(tree_usage(p)[0] for p in stub_procs)
        window = load.window()
        cpu1, rss = tree_usage(target.process())
        stub1 = sum(tree_usage(p)[0] for p in stub_procs)
    finally:
        load.close()
    return Measured(target.key, rnd, clients, mode, window, cpu1 - cpu0, stub1 - stub0, rss)


def start_targets(
    settings: Settings, upstream: str, workdir: Path, run: Run, more: tuple[str, ...] = ()
) -> list[Target]:
    """``more``: the other stubs, replicas too for ours and vllm-router."""
    wanted: list[Target] = []
    try:
        return _start(settings, upstream, workdir, run, wanted, more=more)
    except BaseException:
        # A failure that is not a target's own Unavailable (a bad --variant, ^C, a
        # control plane that broke mid-start) must not leave the control planes and
        # gateways started so far running after the benchmark has ended.
        for target in wanted:
            target.stop()
        raise


def _start(
    settings: Settings,
    upstream: str,
    workdir: Path,
    run: Run,
    wanted: list[Target],
    *,
    more: tuple[str, ...],
) -> list[Target]:
    have_peers = (settings.peers_venv / "bin" / "python").exists()
    for peer in settings.peers:
        if not have_peers:
            run.skipped[peer] = f"no peers' venv at {settings.peers_venv}: run `make bench-peers`"
            continue
        if peer == "litellm":
            wanted.append(litellm(settings.peers_venv, upstream, workdir))
        elif peer == "vllm-router":
            wanted.append(vllm_router(settings.peers_venv, upstream, more))
    if settings.ours is not None:
        try:
            wanted.append(
                ours(
                    settings.ours,
                    settings.llmgw,
                    upstream,
                    workdir,
                    client_limits=settings.client_limits,
                    more_upstreams=more,
                    routing=settings.routing,
                    slots=dict(settings.slots).get("ours", 0),
                )
            )
        except Unavailable as exc:
            run.skipped["ours"] = str(exc)
    for name, command in settings.variants:
        key = f"ours:{name}"
        llmgw, limits, routing = settings.llmgw, settings.client_limits, settings.routing
        if name == "base" and settings.base_tree is not None:
            llmgw, limits, routing = _base_side(settings, settings.base_tree, workdir, run)
        try:
            wanted.append(
                ours(
                    command,
                    llmgw,
                    upstream,
                    workdir,
                    key=key,
                    label=f"llmgw {name}",
                    client_limits=limits,
                    more_upstreams=more,
                    routing=routing,
                    slots=dict(settings.slots).get(name, 0),
                )
            )
        except Unavailable as exc:
            run.skipped[key] = str(exc)
    wanted.extend(candidate(kind, upstream) for kind in settings.candidates)
    started: list[Target] = []
    for target in wanted:
        common.progress(f"gateway: starting {target.label}")
        try:
            target.start(workdir)
            check(target)
        except Unavailable as exc:
            run.skipped[target.key] = str(exc)
            target.stop()
            continue
        started.append(target)
        run.labels[target.key] = target.label
    return started


def _base_side(
    settings: Settings, tree: Path, workdir: Path, run: Run
) -> tuple[str, tuple[str, ...], str]:
    """The base tree's ``llmgw`` (a script running it from ``tree``: its control plane
    too, since an older gateway may refuse a newer table), the base's client token
    limits (none when it has no ``--rpm``: what a limited token costs is measured against
    the tree before limits) and its routing profile (the catalog's default when it does
    not know this run's)."""
    script = workdir / "base-llmgw"
    script.write_text(
        f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(tree))} exec {shlex.quote(sys.executable)} "
        '-m llmgw "$@"\n'
    )
    script.chmod(0o755)
    known = subprocess.run(
        [
            sys.executable,
            "-c",
            "from catalog.definition.routing_profiles import KNOWN; print(' '.join(KNOWN))",
        ],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,  # (python puts its working directory first on the path)
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    routing = settings.routing
    if routing and routing not in known:
        run.notes.append(
            f"llmgw base has no routing profile {routing!r}: its model has the default"
        )
        routing = ""
    flags = subprocess.run(
        [str(script), "token", "new", "--help"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    limits = settings.client_limits
    if limits and "--rpm" not in flags:
        run.notes.append("llmgw base has no client token limits: its client token is plain")
        limits = ()
    return str(script), limits, routing


def rounds(run: Run, targets: Sequence[Target], stub_procs: Sequence[psutil.Process]) -> None:
    settings = run.settings
    for rnd in range(settings.repeats):
        # The order rotates from round to round: no gateway is always first after a change.
        order = list(targets[rnd % len(targets) :]) + list(targets[: rnd % len(targets)])
        for clients in settings.concurrency:
            for mode in settings.modes:
                for target in order:
                    common.progress(
                        f"gateway: round {rnd + 1}/{settings.repeats}, {clients} clients, "
                        f"{mode}, {target.label}"
                    )
                    run.measured.append(
                        measure(target, stub_procs, clients, mode, settings=settings, rnd=rnd)
                    )
        run.load.append(os.getloadavg())


def execute(settings: Settings) -> Run:
    run = Run(settings)
    run.load.append(os.getloadavg())
    with (
        tempfile.TemporaryDirectory(prefix="llmgw-bench-gateway-") as tmp,
        stubs(settings, Path(tmp)) as started,
    ):
        workdir = Path(tmp)
        stub_procs = [proc for proc, _ in started]
        stub_port = started[0][1]
        upstream = f"http://127.0.0.1:{stub_port}"
        more = tuple(f"http://127.0.0.1:{port}" for _, port in started[1:])
        targets: list[Target] = []
        try:
            targets = start_targets(settings, upstream, workdir, run, more)
            targets.append(direct(stub_port))
            run.labels["direct"] = targets[-1].label
            for target in targets:
                run.rss_start[target.key] = tree_usage(target.process())[1]
            rounds(run, targets, stub_procs)
        finally:
            for target in targets:
                target.stop()
            _keep_logs(workdir)
    return run


def _keep_logs(workdir: Path) -> None:
    """Each gateway's log, kept under bench/results/gateway/ for a look after the run."""
    into = common.BENCH_DIR / "results" / "gateway"
    into.mkdir(parents=True, exist_ok=True)
    for log in [*workdir.glob("*.log"), *workdir.glob("control/*.log")]:
        (into / log.name).write_bytes(log.read_bytes()[-1_000_000:])


# --- figures -------------------------------------------------------------------------------

ROW_ORDER = ("litellm", "vllm-router", "ours")


def _ordered(run: Run) -> list[str]:
    keys = [k for k in ROW_ORDER if k in run.labels]
    keys += [f"ours:{name}" for name, _ in run.settings.variants if f"ours:{name}" in run.labels]
    keys += sorted(k for k in run.labels if k.startswith("cand:"))
    return [*keys, "direct"] if "direct" in run.labels else keys


class Figures:
    """Medians over the rounds of what one target did at one concurrency and mode."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.by: dict[tuple[str, int, str, int], Measured] = {
            (m.key, m.clients, m.mode, m.round): m for m in run.measured
        }

    def _pairs(self, key: str, clients: int, mode: str) -> Iterator[tuple[Measured, Measured]]:
        for rnd in range(self.run.settings.repeats):
            mine = self.by.get((key, clients, mode, rnd))
            ref = self.by.get(("direct", clients, mode, rnd))
            if mine is not None and ref is not None:
                yield mine, ref

    def added(self, key: str, clients: int, mode: str, what: str, q: str) -> float | None:
        """Median over rounds of (this percentile through the target - the direct one)."""
        diffs = [
            mine.window[what][q] - ref.window[what][q]
            for mine, ref in self._pairs(key, clients, mode)
            if q in mine.window[what] and q in ref.window[what]
        ]
        return statistics.median(diffs) if diffs else None

    def _median(self, key: str, clients: int, mode: str, value: Any) -> float | None:
        values = [
            value(m)
            for rnd in range(self.run.settings.repeats)
            if (m := self.by.get((key, clients, mode, rnd))) is not None and m.window["requests"]
        ]
        return statistics.median(values) if values else None

    def rate(self, key: str, clients: int, mode: str) -> float | None:
        return self._median(
            key, clients, mode, lambda m: m.window["requests"] / m.window["seconds"]
        )

    def cpu(self, key: str, clients: int, mode: str) -> float | None:
        """The gateway's CPU seconds a request (the stub's, for the direct path)."""
        return self._median(
            key,
            clients,
            mode,
            lambda m: (m.stub_cpu if key == "direct" else m.cpu) / m.window["requests"],
        )

    def client_load(self, key: str, clients: int, mode: str) -> float | None:
        """The load generator's CPU as a share of one core during the window."""
        return self._median(
            key, clients, mode, lambda m: m.window["client_cpu"] / m.window["seconds"]
        )

    def errors(self, key: str, clients: int, mode: str) -> int:
        return sum(
            m.window["errors"]
            for rnd in range(self.run.settings.repeats)
            if (m := self.by.get((key, clients, mode, rnd))) is not None
        )

    def served(self, key: str) -> int:
        return sum(m.window["requests"] for m in self.run.measured if m.key == key)

    def rss_end(self, key: str) -> int:
        last = [m for m in self.run.measured if m.key == key]
        return last[-1].rss if last else 0


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    value = seconds * 1000
    return f"{value:.2f} ms" if abs(value) < 10 else f"{value:,.1f} ms"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _times(ours: float | None, ref: float | None) -> str:
    return "-" if ours is None or not ref else f"{ours / ref:.2f}x"


def _mib(value: int) -> str:
    return f"{value / 1024 / 1024:,.0f} MiB" if value else "-"


def tables(run: Run) -> list[common.Table]:
    settings = run.settings
    fig = Figures(run)
    keys = _ordered(run)
    out: list[common.Table] = []
    head = f"median of {settings.repeats} interleaved rounds"
    if "plain" in settings.modes:
        plain = common.Table(
            f"Gateway added latency, plain chat completions ({head})",
            [
                "gateway",
                "clients",
                "added p50",
                "added p99",
                "req/s",
                "x LiteLLM",
                "x vllm-router",
                "CPU/request",
                "load gen CPU",
                "errors",
            ],
        )
        for clients in settings.concurrency:
            for key in keys:
                rate = fig.rate(key, clients, "plain")
                is_ref = key == "direct"
                plain.add(
                    run.labels[key],
                    clients,
                    "(reference)"
                    if is_ref
                    else _ms(fig.added(key, clients, "plain", "latency", "p50")),
                    "(reference)"
                    if is_ref
                    else _ms(fig.added(key, clients, "plain", "latency", "p99")),
                    _rate(rate),
                    _times(rate, fig.rate("litellm", clients, "plain")),
                    _times(rate, fig.rate("vllm-router", clients, "plain")),
                    _ms(fig.cpu(key, clients, "plain")) + (" (stub)" if is_ref else ""),
                    _share(fig.client_load(key, clients, "plain")),
                    fig.errors(key, clients, "plain"),
                )
        out.append(plain)
    if "stream" in settings.modes:
        stream = common.Table(
            f"Gateway added latency, streamed chat completions ({settings.chunks} tokens "
            f"{settings.chunk_delay_ms:g} ms apart; {head})",
            [
                "gateway",
                "clients",
                "added first event p50",
                "added first event p99",
                "added whole stream p99",
                "added per event p99",
                "req/s",
                "CPU/request",
                "errors",
            ],
        )
        for clients in settings.concurrency:
            for key in keys:
                is_ref = key == "direct"

                added = [
                    "(reference)" if is_ref else _ms(fig.added(key, clients, "stream", what, q))
                    for what, q in (("first", "p50"), ("first", "p99"), ("latency", "p99"))
                ]
                per_event = (
                    "(reference)"
                    if is_ref
                    else _ms(fig.added(key, clients, "stream", "gap", "p99"))
                )
                stream.add(
                    run.labels[key],
                    clients,
                    *added,
                    per_event,
                    _rate(fig.rate(key, clients, "stream")),
                    _ms(fig.cpu(key, clients, "stream")) + (" (stub)" if is_ref else ""),
                    fig.errors(key, clients, "stream"),
                )
        out.append(stream)
    memory = common.Table(
        "Gateway memory (RSS of the process and its children)",
        ["gateway", "at start", "at the end", "requests served"],
    )
    for key in keys:
        if key != "direct":
            memory.add(
                run.labels[key],
                _mib(run.rss_start.get(key, 0)),
                _mib(fig.rss_end(key)),
                f"{fig.served(key):,}",
            )
    out.append(memory)
    if "ours" in run.labels:
        out.append(goals(run, fig))
        out[-1].note(_own_overhead(run, fig))
    _notes(run, out[0])
    return out


def _own_overhead(run: Run, fig: Figures) -> str:
    """What our gateway says it added (its ``x-llmgw-overhead-ms``), beside what was measured."""
    parts = []
    for clients in run.settings.concurrency:
        for mode in run.settings.modes:
            said = [
                m.window.get("overhead", {})
                for m in run.measured
                if m.key == "ours" and m.clients == clients and m.mode == mode
            ]
            p50s = [s["p50"] for s in said if "p50" in s]
            p99s = [s["p99"] for s in said if "p99" in s]
            if p50s:
                parts.append(
                    f"{clients} clients {mode}: {_ms(statistics.median(p50s))} p50 / "
                    f"{_ms(statistics.median(p99s))} p99 (measured added p50 "
                    f"{_ms(fig.added('ours', clients, mode, 'latency', 'p50'))})"
                )
    if not parts:
        return "Our gateway's answers carried no x-llmgw-overhead-ms header."
    return "What our gateway says it added (x-llmgw-overhead-ms): " + "; ".join(parts) + "."


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def goals(run: Run, fig: Figures) -> common.Table:
    """The issue's targets for ours, against this run's figures."""
    table = common.Table(
        "Our gateway against the issue's targets (this run)", ["target", "measured", "met"]
    )

    def row(text: str, value: float | None, ok: bool | None, shown: str) -> None:
        table.add(text, shown, "-" if ok is None or value is None else ("yes" if ok else "NO"))

    conc = run.settings.concurrency
    if "plain" in run.settings.modes and 1 in conc:
        p50 = fig.added("ours", 1, "plain", "latency", "p50")
        p99 = fig.added("ours", 1, "plain", "latency", "p99")
        row("added p50 < 0.5 ms at 1 client", p50, p50 is not None and p50 < GOAL_P50_C1, _ms(p50))
        row("added p99 < 2 ms at 1 client", p99, p99 is not None and p99 < GOAL_P99_C1, _ms(p99))
    if "plain" in run.settings.modes and 64 in conc:
        p99 = fig.added("ours", 64, "plain", "latency", "p99")
        row(
            "added p99 < 15 ms at 64 clients", p99, p99 is not None and p99 < GOAL_P99_C64, _ms(p99)
        )
    if "stream" in run.settings.modes:
        worst = [fig.added("ours", c, "stream", "gap", "p99") for c in conc]
        known = [w for w in worst if w is not None]
        top = max(known) if known else None
        row(
            "added per streamed event p99 <= 1 ms (worst concurrency)",
            top,
            top is not None and top <= GOAL_CHUNK_P99,
            _ms(top),
        )
    if "plain" in run.settings.modes:
        for clients in conc:
            mine = fig.rate("ours", clients, "plain")
            for peer, name, goal in (
                ("litellm", "LiteLLM's", GOAL_X_LITELLM),
                ("vllm-router", "vllm-router's", GOAL_X_ROUTER),
            ):
                theirs = fig.rate(peer, clients, "plain")
                if theirs:
                    x = None if mine is None else mine / theirs
                    row(
                        f"req/s >= {goal:g}x {name} at {clients}",
                        x,
                        x is not None and x >= goal,
                        _times(mine, theirs),
                    )
                # The same target by CPU per request: what one core of its own would allow,
                # which a loaded shared machine distorts far less than req/s.
                my_cpu, their_cpu = (
                    fig.cpu("ours", clients, "plain"),
                    fig.cpu(peer, clients, "plain"),
                )
                if their_cpu and my_cpu:
                    x = their_cpu / my_cpu
                    row(
                        f"by CPU/request: {name} / ours >= {goal:g} at {clients}",
                        x,
                        x >= goal,
                        f"{x:.2f}x",
                    )
    return table


def _notes(run: Run, table: common.Table) -> None:
    loads = ", ".join(f"{a:.1f}" for a, _, _ in run.load)
    table.note(f"Load average (1 min) at the start and after each round: {loads} (2 cores).")
    table.note(
        "added = the percentile through the gateway minus the same percentile straight to the "
        "stub in the same round; negative values are noise around zero."
    )
    table.note(
        "CPU/request: the gateway's processes (user + system) over the window's requests; on "
        "the direct row, the stub's. load gen CPU: the load generator's process, as a share "
        "of one core: the direct row shows what it and the stub can do together."
    )
    for key, why in run.skipped.items():
        table.note(f"not measured: {key}: {why}")
    for note in run.notes:
        table.note(note)


def to_json(run: Run) -> dict[str, Any]:
    fig = Figures(run)
    summary = []
    for key in _ordered(run):
        for clients in run.settings.concurrency:
            for mode in run.settings.modes:
                row: dict[str, Any] = {
                    "gateway": key,
                    "label": run.labels[key],
                    "clients": clients,
                    "mode": mode,
                    "requests_per_s": fig.rate(key, clients, mode),
                    "cpu_per_request_s": fig.cpu(key, clients, mode),
                    "errors": fig.errors(key, clients, mode),
                }
                for what in ("latency", "first", "gap"):
                    for q in ("p50", "p99"):
                        row[f"added_{what}_{q}_s"] = fig.added(key, clients, mode, what, q)
                summary.append(row)
    settings = asdict(run.settings)
    settings["peers_venv"] = str(run.settings.peers_venv)
    settings["base_tree"] = None if run.settings.base_tree is None else str(run.settings.base_tree)
    return {
        "machine": common.machine(),
        "settings": settings,
        "labels": run.labels,
        "skipped": run.skipped,
        "load_average": run.load,
        "rss_start": run.rss_start,
        "rss_end": {k: fig.rss_end(k) for k in run.labels},
        "summary": summary,
        "windows": [asdict(m) for m in run.measured],
    }


# --- the long mode: memory over many requests ----------------------------------------------


def soak(settings: Settings, total: int, key: str, clients: int) -> list[common.Table]:
    """``total`` plain requests through one gateway in ten windows; RSS after each."""
    only = Settings(
        **{
            **asdict(settings),
            "peers": tuple(p for p in settings.peers if p == key),
            "candidates": tuple(k for k in settings.candidates if f"cand:{k}" == key),
            "ours": settings.ours if key == "ours" else None,
        }
    )
    run = Run(only)
    table = common.Table(
        f"Gateway memory over {total:,} plain requests, {clients} clients",
        ["requests so far", "req/s in the tenth", "p50", "p99", "RSS", "errors"],
    )
    with (
        tempfile.TemporaryDirectory(prefix="llmgw-bench-gateway-") as tmp,
        stub(only, Path(tmp)) as (_, stub_port),
    ):
        targets: list[Target] = []
        try:
            targets = start_targets(only, f"http://127.0.0.1:{stub_port}", Path(tmp), run)
            if not targets:
                table.note(f"not measured: {run.skipped}")
                return [table]
            target = targets[0]
            table.title += f": {target.label}"
            step = max(1, total // 10)
            load = Load(target, job_for(target, clients, False, only, step))
            try:
                table.add(
                    "0 (after warm-up)", "-", "-", "-", _mib(tree_usage(target.process())[1]), 0
                )
                done = 0
                while done < total:
                    window = load.window()
                    done += window["requests"] + window["errors"]
                    common.progress(f"gateway soak: {done:,} of {total:,}")
                    table.add(
                        f"{done:,}",
                        _rate(window["requests"] / window["seconds"]),
                        _ms(window["latency"].get("p50")),
                        _ms(window["latency"].get("p99")),
                        _mib(tree_usage(target.process())[1]),
                        window["errors"],
                    )
            finally:
                load.close()
        finally:
            for t in targets:
                t.stop()
    table.note(f"Load average (1 min) at the end: {os.getloadavg()[0]:.1f} (2 cores).")
    return [table]


# --- entry points --------------------------------------------------------------------------


def has_gateway(llmgw: str) -> bool:
    """Whether this ``llmgw`` has the ``gateway`` command (it lands in its own branch)."""
    try:
        done = subprocess.run(
            [llmgw, "gateway", "--help"], capture_output=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def quick_settings() -> Settings:
    return Settings(repeats=1, concurrency=(1, 16), seconds=1.0, min_requests=100)


def run(quick: bool) -> list[common.Table]:
    """``python -m bench gateway``: the default settings, ours when this llmgw has it."""
    settings = quick_settings() if quick else Settings()
    if has_gateway(settings.llmgw):
        settings = Settings(**{**asdict(settings), "ours": OURS_DEFAULT})
    return tables(execute(settings))


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip() and x.strip() != "none")


def _limits_and_peers_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers-venv", type=Path, default=Settings.peers_venv)
    parser.add_argument(
        "--client-limits",
        default="",
        metavar="FLAGS",
        help="limits of the load's client token, as `llmgw token new` takes them, e.g. "
        "'--rpm 10000000 --tpm 1T' (the quota stage's cost: gateway.stages.quota)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="stubs, each a replica of the model for ours and vllm-router (default 1)",
    )
    parser.add_argument(
        "--routing",
        default="",
        help="the model's routing profile in ours' catalog (default: the catalog's, "
        "least-loaded), e.g. prefix",
    )
    parser.add_argument(
        "--slots",
        action="append",
        default=[],
        metavar="NAME=N",
        help="the model's profile slots in the control plane of ours (NAME ours) or of a "
        "--variant NAME (repeatable; none: no slots, the queue stage out): e.g. ours=4096 "
        "puts the queue stage in without ever filling a replica (gateway.stages.queue)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--concurrency", default="1,16,64", help="clients, comma separated")
    parser.add_argument("--modes", default="plain,stream", help="plain, stream or both")
    parser.add_argument("--seconds", type=float, default=3.0, help="a window's least length")
    parser.add_argument("--min-requests", type=int, default=300, help="a window's least answers")
    parser.add_argument("--chunks", type=int, default=16, help="tokens in a streamed answer")
    parser.add_argument("--chunk-delay-ms", type=float, default=1.0, help="between tokens")
    parser.add_argument("--peers", default=",".join(PEERS), help="litellm, vllm-router, none")
    parser.add_argument(
        "--candidates", default=",".join(KINDS), help=f"pass-throughs: {', '.join(KINDS)}, none"
    )
    parser.add_argument(
        "--ours",
        default="auto",
        help="our gateway's command line, with {llmgw} {server} {token_file} {host} {port}; "
        f"'auto' (default): {OURS_DEFAULT!r} when --llmgw has a gateway command; 'none'",
    )
    parser.add_argument(
        "--llmgw",
        default=Settings.llmgw,
        help="the llmgw whose serve (control plane) and gateway are measured",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=COMMAND",
        help="another variant of ours in the same run (repeatable), a command line as --ours "
        "takes, e.g. 'workers2={llmgw} gateway --server {server} --token-file {token_file} "
        "--host {host} --port {port} --workers 2'; its rows are 'llmgw NAME'",
    )
    _limits_and_peers_flags(parser)
    parser.add_argument("--quick", action="store_true", help="1 round, 1 and 16 clients, short")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument(
        "--soak", type=int, metavar="N", help="instead: N plain requests, RSS after each tenth"
    )
    parser.add_argument("--soak-target", default="ours", help="the gateway the soak runs on")
    parser.add_argument("--soak-clients", type=int, default=16)
    args = parser.parse_args(argv)
    base, base_tree = quick_settings() if args.quick else Settings(), _base_tree(parser)
    ours_command: str | None
    if args.ours == "none":
        ours_command = None
    elif args.ours == "auto":
        ours_command = OURS_DEFAULT if has_gateway(args.llmgw) else None
    else:
        ours_command = args.ours
    settings = Settings(
        repeats=base.repeats if args.quick else args.repeats,
        concurrency=base.concurrency
        if args.quick
        else tuple(int(c) for c in _csv(args.concurrency)),
        modes=_csv(args.modes),
        seconds=base.seconds if args.quick else args.seconds,
        min_requests=base.min_requests if args.quick else args.min_requests,
        chunks=args.chunks,
        chunk_delay_ms=args.chunk_delay_ms,
        peers=_csv(args.peers),
        candidates=_csv(args.candidates),
        client_limits=tuple(shlex.split(args.client_limits)),
        ours=ours_command,
        variants=tuple(_variant(parser, v) for v in args.variant)
        + ((("base", OURS_DEFAULT),) if base_tree is not None else ()),
        base_tree=base_tree,
        slots=tuple(_slots(parser, v) for v in args.slots),
        llmgw=args.llmgw,
        peers_venv=args.peers_venv.resolve(),
        replicas=args.replicas,
        routing=args.routing,
    )
    unknown = set(settings.modes) - set(MODES) or set(settings.peers) - set(PEERS)
    unknown = unknown or set(settings.candidates) - set(KINDS)
    if unknown:
        parser.error(f"unknown: {', '.join(sorted(unknown))}")
    common.quiet_logs()
    print("## Gateway: added latency, side by side\n")
    print(f"Machine: {common.machine()}\n")
    print(
        f"Command: `python -m bench.gateway {' '.join(sys.argv[1:] if argv is None else argv)}`\n",
        flush=True,
    )
    if args.soak:
        if args.soak_target == "ours" and settings.ours is None:
            parser.error(f"--soak on ours needs a gateway: {args.llmgw} has no `gateway` command")
        for table in soak(settings, args.soak, args.soak_target, args.soak_clients):
            common.emit(table)
        return 0
    if settings.ours is None and args.ours == "auto":
        common.progress(f"gateway: {args.llmgw} has no `gateway` command; ours is left out")
    measured = execute(settings)
    if settings.ours is None:
        measured.skipped.setdefault("ours", f"{args.llmgw} has no `gateway` command")
    for table in tables(measured):
        common.emit(table)
    if args.json:
        args.json.write_text(json.dumps(to_json(measured), indent=1))
        common.progress(f"gateway: figures written to {args.json}")
    return 0


def _base_tree(parser: argparse.ArgumentParser) -> Path | None:
    """``LLMGW_BENCH_BASE=TREE``: the gateway of another tree (its packages, e.g. a
    ``git archive`` of an older commit) as the variant ``base``, following a control
    plane of that tree; its ``gateway`` package must come from TREE, or the run stops."""
    tree = os.environ.get("LLMGW_BENCH_BASE")
    if not tree:
        return None
    root = Path(tree).resolve()
    found = subprocess.run(
        [sys.executable, "-c", "import gateway.proxy, llmgw; print(gateway.proxy.__file__)"],
        env={**os.environ, "PYTHONPATH": str(root)},
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    where = found.stdout.strip()
    if found.returncode != 0 or not where.startswith(str(root) + os.sep):
        parser.error(
            f"LLMGW_BENCH_BASE={tree}: its gateway does not import from there "
            f"({where or found.stderr.strip()[-300:]})"
        )
    return root


def _variant(parser: argparse.ArgumentParser, text: str) -> tuple[str, str]:
    name, sep, command = text.partition("=")
    if not sep or not name.strip() or not command.strip():
        parser.error(f"--variant takes NAME=COMMAND, not {text!r}")
    return name.strip(), command.strip()


def _slots(parser: argparse.ArgumentParser, text: str) -> tuple[str, int]:
    name, sep, count = text.partition("=")
    if not sep or not name.strip() or not count.strip().isdigit():
        parser.error(f"--slots takes NAME=N (ours, or a --variant's name), not {text!r}")
    return name.strip(), int(count)


if __name__ == "__main__":
    sys.exit(main())
