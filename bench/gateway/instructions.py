"""``python -m bench.gateway.instructions``: our gateway's instructions a request, under
callgrind, this tree beside another (``LLMGW_BENCH_BASE=TREE``), for a budget that the
load of a shared machine must not decide.

CPU time a request (``python -m bench.gateway``) wanders by a fifth from run to run on
this 2-core machine shared by eight engineers; the instructions a request executes do not
(a few tenths of a percent). Each gateway runs under ``valgrind --tool=callgrind`` in
front of the benchmark's stubs (``--replicas``, one replica each) and its real control
plane (``bench.gateway.control``); the load generator (``bench.gateway.load``, not under
valgrind) warms it, then callgrind is told to dump its counts
(``callgrind_control --dump``) before and after a window of ``--requests`` requests: the
instructions between the two dumps over the requests answered is the figure. What the
gateway does in between besides answering (its table's poll, timers) is in it too, the
same for both trees.

Cases (``--cases``, each a gateway of its own for each tree): ``plain`` (an unlimited
client token, a whole answer), ``stream`` (the same, streamed), ``limited`` (a client
token with every limit, whole answers), ``prefix`` (the model's routing profile
``prefix``; the base keeps its default when it has no such profile). Printed: each
tree's instructions a request and this tree's over the base's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.gateway.control import Unavailable
from bench.gateway.side_by_side import (
    Load,
    Run,
    Settings,
    _base_side,
    _base_tree,
    check,
    job_for,
    stubs,
)
from bench.gateway.targets import OURS_DEFAULT, Target, ours
from bench.shared import common

LIMITS = ("--rpm", "10000000", "--tpm", "1T", "--max-inflight", "100000", "--budget", "1000T/30d")
CASES = ("plain", "stream", "limited", "prefix")
VALGRIND = (
    "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file={out}/cg.%p "
    "--dump-instr=no --collect-jumps=no "
)


@dataclass(frozen=True)
class Case:
    name: str
    stream: bool = False
    limits: tuple[str, ...] = ()
    routing: str = ""


def case(name: str) -> Case:
    return {
        "plain": Case("plain"),
        "stream": Case("stream", stream=True),
        "limited": Case("limited", limits=LIMITS),
        "prefix": Case("prefix", routing="prefix"),
    }[name]


def _dump(pid: int) -> None:
    subprocess.run(
        ["callgrind_control", "--dump", str(pid)],
        capture_output=True,
        check=True,
        timeout=600,
    )


def _newest_total(out: Path, pid: int, after: int) -> tuple[int, int]:
    """The number and the instructions of the newest dump of ``pid`` past ``after``
    (callgrind numbers a process's dumps ``cg.PID.1``, ``cg.PID.2``, ...)."""
    deadline = time.monotonic() + 120
    while True:
        numbered = []
        for f in out.glob(f"cg.{pid}.*"):
            suffix = f.name.rsplit(".", 1)[1]
            if suffix.isdigit() and int(suffix) > after:
                numbered.append((int(suffix), f))
        for n, f in sorted(numbered, reverse=True):
            for line in f.read_text(errors="replace").splitlines():
                if line.startswith(("summary:", "totals:")):
                    return n, int(line.split()[1])
        if time.monotonic() > deadline:
            raise RuntimeError(f"no callgrind dump of {pid} in {out}")
        time.sleep(0.5)


@dataclass(frozen=True)
class Measured:
    """Instructions a request over the window, all of them (``raw``) and net of what the
    gateway runs idle for as long (``net``)."""

    raw: float
    net: float
    window_s: float


def measure(
    target: Target,
    out: Path,
    requests: int,
    clients: int,
    stream: bool,
    *,
    keep: Path | None = None,
) -> Measured:
    """Instructions a request of ``target`` (under callgrind) over a window of
    ``requests`` requests after a warm-up; the window's own dump copied to ``keep``
    (for ``callgrind_annotate``) when given.

    Then as long again with no request: what the gateway's timers run (its table's
    poll, the allowance client's tick) is a cost a second, not a request, and valgrind
    makes a window about fifty times longer than it is natively, so in the raw figure
    a timer weighs about fifty times what it does beside real traffic. ``net`` takes
    that idle window's instructions out."""
    proc = target.process()
    assert proc is not None
    settings = Settings(seconds=0.0, min_requests=requests)
    job = job_for(target, clients, stream, settings, requests)
    load = Load(target, job)
    try:
        _dump(proc.pid)
        first, _ = _newest_total(out, proc.pid, 0)
        started = time.monotonic()
        window = load.window()
        _dump(proc.pid)
        window_s = time.monotonic() - started
        last, total = _newest_total(out, proc.pid, first)
        if keep is not None:
            shutil.copyfile(out / f"cg.{proc.pid}.{last}", keep)
        time.sleep(window_s)
        _dump(proc.pid)
        _, idle = _newest_total(out, proc.pid, last)
    finally:
        load.close()
    answered = int(window["requests"])
    if window["errors"] or not answered:
        raise RuntimeError(f"{target.label}: {window['errors']} errors, {answered} answered")
    return Measured(total / answered, max(0, total - idle) / answered, window_s)


def run_case(
    c: Case,
    base_tree: Path | None,
    replicas: int,
    requests: int,
    clients: int,
    *,
    keep: Path | None = None,
) -> dict[str, Measured]:
    figures: dict[str, Measured] = {}
    settings = Settings(replicas=replicas, routing=c.routing, client_limits=c.limits)
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-cg-") as tmp:
        work = Path(tmp)
        with stubs(settings, work) as started:
            upstream = f"http://127.0.0.1:{started[0][1]}"
            more = tuple(f"http://127.0.0.1:{port}" for _, port in started[1:])
            trees: list[tuple[str, str, tuple[str, ...], str]] = [
                ("this", settings.llmgw, c.limits, c.routing)
            ]
            if base_tree is not None:
                run = Run(settings)
                llmgw, limits, routing = _base_side(settings, base_tree, work, run)
                trees.insert(0, ("base", llmgw, limits, routing))
                for note in run.notes:
                    common.progress(f"instructions: {c.name}: {note}")
            for name, llmgw, limits, routing in trees:
                out = work / f"cg-{name}"
                out.mkdir()
                target = ours(
                    VALGRIND.format(out=out) + OURS_DEFAULT,
                    llmgw,
                    upstream,
                    work,
                    key=f"ours:{name}",
                    label=f"llmgw {name}",
                    client_limits=limits,
                    more_upstreams=more,
                    routing=routing,
                )
                target.start_timeout = 600.0
                try:
                    common.progress(f"instructions: {c.name}: starting {name} under callgrind")
                    target.start(work)
                    check(target, timeout=600.0)
                    kept = None if keep is None else keep / f"{c.name}-{name}.callgrind"
                    figures[name] = measure(target, out, requests, clients, c.stream, keep=kept)
                    got = figures[name]
                    common.progress(
                        f"instructions: {c.name}: {name} {got.raw:,.0f} a request, "
                        f"{got.net:,.0f} net of idle (window {got.window_s:.1f} s)"
                    )
                except Unavailable as exc:
                    common.progress(f"instructions: {c.name}: {name} not measured: {exc}")
                finally:
                    target.stop()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway.instructions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cases", default=",".join(CASES), help=", ".join(CASES))
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--requests", type=int, default=400, help="measured a case and tree")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--keep-dumps",
        type=Path,
        metavar="DIR",
        help="copy each window's callgrind dump there as CASE-TREE.callgrind "
        "(read it with callgrind_annotate --inclusive=yes)",
    )
    args = parser.parse_args(argv)
    if args.keep_dumps is not None:
        args.keep_dumps.mkdir(parents=True, exist_ok=True)
    cases = [case(x.strip()) for x in args.cases.split(",") if x.strip()]
    base_tree = _base_tree(parser)
    common.quiet_logs()
    table = common.Table(
        f"Gateway instructions a request under callgrind ({args.replicas} replicas, "
        f"{args.clients} clients, {args.requests} requests a window)",
        ["case", "base", "this tree", "this / base", "base net", "this net", "net ratio"],
    )
    results = {}
    for c in cases:
        figures = run_case(
            c, base_tree, args.replicas, args.requests, args.clients, keep=args.keep_dumps
        )
        results[c.name] = {k: vars(v) for k, v in figures.items()}
        mine, theirs = figures.get("this"), figures.get("base")
        table.add(
            c.name,
            "-" if theirs is None else f"{theirs.raw:,.0f}",
            "-" if mine is None else f"{mine.raw:,.0f}",
            "-" if not (mine and theirs) else f"{mine.raw / theirs.raw:.3f}x",
            "-" if theirs is None else f"{theirs.net:,.0f}",
            "-" if mine is None else f"{mine.net:,.0f}",
            "-" if not (mine and theirs and theirs.net) else f"{mine.net / theirs.net:.3f}x",
        )
    table.note(
        "net: less what the gateway ran idle for as long as the window took (its timers: "
        "a cost a second, which valgrind's slowdown stretches over fewer requests)."
    )
    table.note(f"Base: {base_tree or 'none (LLMGW_BENCH_BASE unset)'}.")
    table.note(f"Load average (1 min) at the end: {os.getloadavg()[0]:.1f} (2 cores).")
    common.emit(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
