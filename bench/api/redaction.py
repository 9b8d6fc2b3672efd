"""What redaction costs a read: ``python -m bench.api.redaction [BASE_TREE] [--placements N]``.

Every read by anyone but an operator goes through ``catalog.secrecy.secrets.redact``,
``GET /v1/placements`` from every gateway included, and since issue 36 it looks at each
profile's ``args`` too. This times ``redact`` over N placements as the route renders them
(each with an engine view: five plain args, an env of a plain value and a reference),
best of ``--rounds``, in a fresh process each, CPU time. With ``BASE_TREE`` (a directory
holding another version of ``catalog/``, e.g. ``git archive COMMIT catalog | tar -x -C
/tmp/base``), the same is measured with that version, alternating, for a before/after.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

_WORKER = r"""
import json, sys, time
tree, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, tree)
try:
    from catalog.secrecy.secrets import redact
except ImportError:
    from catalog.secrets import redact
args = ["--max-model-len", "8192", "--enable-prefix-caching", "--gpu-memory-utilization", "0.9"]
rows = [
    {"model": f"m{i % 500}", "replica": i // 500, "profile": "a100",
     "engine": {"engine": "vllm", "args": list(args), "model_path": "org/m",
                "env": {"LOG": "info", "HF_TOKEN": {"secret": "hf-token"}},
                "served_model_name": f"m{i % 500}"},
     "weight": 1.0, "state": "ready"}
    for i in range(n)
]
best = float("inf")
for _ in range(rounds):
    t = time.process_time()
    redact(rows)
    best = min(best, time.process_time() - t)
print(json.dumps({"ms": best * 1000}))
"""


def measure(tree: Path, placements: int, rounds: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(tree), str(placements), str(rounds)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(done.stdout)["ms"])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api.redaction", description=__doc__)
    parser.add_argument("base", nargs="?", type=Path, help="another version's tree")
    parser.add_argument("--placements", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--alternations", type=int, default=3)
    args = parser.parse_args()
    here = Path(__file__).resolve().parents[2]
    trees = [("this tree", here)] + ([("base", args.base)] if args.base else [])
    best = {name: float("inf") for name, _ in trees}
    for _ in range(args.alternations):
        for name, tree in trees:
            best[name] = min(best[name], measure(tree, args.placements, args.rounds))
    print(f"| redact() over {args.placements:,} placements (CPU, best) | ms |")
    print("|---|---:|")
    for name, _ in trees:
        print(f"| {name} | {best[name]:.1f} |")


if __name__ == "__main__":
    main()
