"""``python -m bench prefix --cost [--base TREE] [--callgrind]``: what the ``prefix``
profile adds to a routing decision, before and after in one run.

The decision the issue bounds: a 4k-token chat (a system prompt of about 8,700
characters every one of 64 replicas holds, then ten turns of about 800 characters one
replica holds: 38 blocks) hashed (``prompt_of``), scored (``gateway.stages.routing.choose``
with the ``prefix`` profile, its load view included) and recorded (``PrefixTable.record``),
against the same decision by ``least-loaded`` (what ``prefix`` adds is the difference).

Each tree (this one and ``--base``, e.g. ``git archive main gateway | tar -x -C
/tmp/base``) is measured in a fresh process with that tree first on the path, the trees
alternated ``--rounds`` times; the best CPU time (``time.process_time``) of each phase is
kept, which a loaded machine inflates less than wall time. ``--callgrind`` runs each
worker once more under ``valgrind --tool=callgrind`` and prints the instructions per
decision (the start-up subtracted: a run of N decisions minus a run of none), which the
load does not change at all.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]

_WORKER = r"""
import gc, json, os, sys, time
tree, n = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, tree)
import gateway
assert gateway.__file__.startswith(tree), gateway.__file__
from gateway.stages.prefix import PrefixTable, prompt_of
from gateway.stages.routing import Load, choose, eligible
from gateway.table import Replica, stable_hash

rs = [Replica(f"m/{i}", "m", f"http://h:{i}", 1.0, "p", stable_hash(f"m/{i}")) for i in range(64)]
loads = {r.key: Load(inflight=i % 5, picks=i) for i, r in enumerate(rs)}
system = {"role": "system", "content": "You are a careful assistant. " * 300}
turns = [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "w " * 400}
    for i in range(10)
]
body = {"messages": [system, *turns]}
table = PrefixTable()
head = prompt_of({"messages": [system]}, "chat")
for r in rs:
    table.record(r.key, head, 0)
table.record(rs[7].key, prompt_of(body, "chat"), 0)
ready = eligible(rs, loads, 0.0)

def least():
    choose("least-loaded", eligible(rs, loads, 0.0), loads)

def hashed():
    prompt_of(body, "chat")

prompt = prompt_of(body, "chat")
def scored():
    choose("prefix", eligible(rs, loads, 0.0), loads, prompt=prompt, prefixes=table)

def whole():
    p = prompt_of(body, "chat")
    got = choose("prefix", eligible(rs, loads, 0.0), loads, prompt=p, prefixes=table)
    table.record(got.replica.key, p, got.prefix_blocks)

assert choose("prefix", ready, loads, prompt=prompt, prefixes=table).replica is rs[7]
out = {"blocks": len(prompt.blocks)}
phases = {"least-loaded": least, "hash": hashed, "score": scored, "prefix": whole}
if n == 0 or "--once" in sys.argv:
    only = os.environ.get("LLMGW_PREFIX_COST_PHASE")
    for name, f in phases.items():
        for _ in range(n if name == only else 0):
            f()
    print(json.dumps(out))
    raise SystemExit
for name, f in phases.items():
    best = float("inf")
    for _ in range(5):
        gc.collect()
        t = time.process_time()
        for _ in range(n):
            f()
        best = min(best, (time.process_time() - t) / n)
    out[name] = best * 1e6
print(json.dumps(out))
"""


def _run(tree: Path, n: int, callgrind: Path | None = None) -> dict[str, float]:
    argv = [sys.executable, "-c", _WORKER, str(tree), str(n)]
    if callgrind is not None:
        argv = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind}", *argv, "--once",
        ]  # fmt: skip
    env = os.environ | {"PYTHONHASHSEED": "0"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=tree)
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _instructions(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench prefix --cost", description=__doc__)
    p.add_argument("--base", type=Path, help="a tree holding another version of gateway/")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--decisions", type=int, default=2000)
    p.add_argument("--callgrind", action="store_true", help="instructions, under valgrind")
    args = p.parse_args(argv)
    trees = {"this tree": _ROOT}
    if args.base is not None:
        trees = {"base": args.base.resolve(), **trees}
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():  # alternated: the load drifts over both alike
            got = _run(tree, args.decisions)
            mine = best.setdefault(name, got)
            for k, v in got.items():
                mine[k] = min(mine[k], v)
    print("load average:", " ".join(f"{x:.1f}" for x in os.getloadavg()))
    print("\n| tree | blocks | least-loaded us | hash us | score us | prefix decision us "
          "| added by prefix us |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, b in best.items():
        print(
            f"| {name} | {b['blocks']:.0f} | {b['least-loaded']:.1f} | {b['hash']:.1f} | "
            f"{b['score']:.1f} | {b['prefix']:.1f} | {b['prefix'] - b['least-loaded']:.1f} |"
        )
    if args.callgrind:
        if shutil.which("valgrind") is None:
            raise SystemExit("--callgrind needs valgrind")
        n = 200
        print(f"\ncallgrind, instructions per decision ({n} of each phase, start-up subtracted):")
        print("\n| tree | least-loaded | hash | score | prefix decision | added by prefix |")
        print("|---|---:|---:|---:|---:|---:|")
        with tempfile.TemporaryDirectory() as d:
            for name, tree in trees.items():
                per: dict[str, float] = {}
                empty = Path(d) / f"{name}-0.out"
                _run(tree, 0, empty)
                floor = _instructions(empty)
                # One phase at a time: a worker running only it, N times.
                for phase in ("least-loaded", "hash", "score", "prefix"):
                    f = Path(d) / f"{name}-{phase}.out"
                    env_phase = os.environ.get("LLMGW_PREFIX_COST_PHASE")
                    os.environ["LLMGW_PREFIX_COST_PHASE"] = phase
                    try:
                        _run(tree, n, f)
                    finally:
                        if env_phase is None:
                            os.environ.pop("LLMGW_PREFIX_COST_PHASE", None)
                    per[phase] = (_instructions(f) - floor) / n
                print(
                    f"| {name} | {per['least-loaded']:,.0f} | {per['hash']:,.0f} | "
                    f"{per['score']:,.0f} | {per['prefix']:,.0f} | "
                    f"{per['prefix'] - per['least-loaded']:,.0f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
