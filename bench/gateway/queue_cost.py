"""``python -m bench.gateway.queue_cost``: the queue stage's cost on the common path.

The common path: a model whose replicas' slots are known, none full, nobody waiting.
``gateway/proxy.py`` then calls ``open_replicas`` (a comparison per replica against its
share of the slots) and looks the model's queue up; a model without slots skips both
(the stage out). The loop below is that block, copied, run with the stage in and out.

By default it times both (``timeit``, least of 7 repeats: moved by the machine's load);
``--callgrind`` counts their instructions under valgrind instead (not moved by it), as
the difference of a run of ``--iterations`` requests with the stage in and out. Prints a
markdown table.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

from gateway.stages.queue import ModelQueue, open_replicas
from gateway.stages.routing import Load
from gateway.table import Replica, stable_hash


def common_path(stage: bool, replicas: int) -> Callable[[], None]:
    """One request's pass through the queue stage's check (``stage``: the model has slots)."""
    ready = [
        Replica(f"m/{i}", "m", f"http://h:{i}", 1.0, "p", stable_hash(f"m/{i}"), slots=4096)
        for i in range(replicas)
    ]
    loads = {r.key: Load(inflight=3) for r in ready}
    queues: dict[str, ModelQueue] = {}
    slotted = frozenset({"m"} if stage else ())

    def check() -> None:
        candidates = ready
        if candidates and (queues or "m" in slotted):
            free = open_replicas(candidates, loads, 1.0)
            q = queues.get("m")
            if free and (q is None or not (q.length or q.granted)):
                candidates = free
        if queues:  # the pump after the answer
            pass

    return check


def _instructions(stage: str, replicas: int, iterations: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             "-m", "bench.gateway.queue_cost", "--once", stage, str(replicas), str(iterations)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from valgrind: {done.stderr[-500:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway.queue_cost", description=__doc__)
    p.add_argument("--replicas", default="1,2,8", help="ready replicas, comma separated")
    p.add_argument("--callgrind", action="store_true", help="count instructions instead")
    p.add_argument("--iterations", type=int, default=20_000)
    p.add_argument("--once", nargs=3, metavar=("STAGE", "REPLICAS", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.once:
        check = common_path(args.once[0] == "in", int(args.once[1]))
        for _ in range(int(args.once[2])):
            check()
        return 0
    unit = "instructions" if args.callgrind else "us"
    print(f"| replicas | stage in ({unit}) | stage out ({unit}) | the stage a request |")
    print("|---:|---:|---:|---:|")
    for n in (int(x) for x in args.replicas.split(",")):
        if args.callgrind:
            ins = _instructions("in", n, args.iterations) / args.iterations
            out = _instructions("out", n, args.iterations) / args.iterations
            print(f"| {n} | {ins:,.0f} | {out:,.0f} | {ins - out:,.0f} instructions |")
            continue
        number = 200_000
        times = []
        for stage in (True, False):
            best = min(timeit.repeat(common_path(stage, n), number=number, repeat=7))
            times.append(best / number * 1e6)
        print(f"| {n} | {times[0]:.3f} | {times[1]:.3f} | {times[0] - times[1]:.3f} us |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
