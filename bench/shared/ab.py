"""Before and after in one run: ``python -m bench.shared.ab BASE_TREE [--events N] [--adds K]``.

``BASE_TREE`` is a directory holding another version of the packages
(``catalog/``, ``events/``, ...), for instance the previous commit's, made
with ``git archive COMMIT catalog events scheduler alembic alembic.ini | tar
-x -C /tmp/base``. Each measurement runs in a fresh process with that tree
first on the path, alternating with this repository's, ``--rounds`` times;
the best of each is compared. The measurements: a full replay from SQLite
(the cached generated log) as start-up runs it (``CatalogReadModel.refresh``)
and validated adds through ``CatalogService.add`` on a copy of the 5,000-model
catalog, and a placement round with nothing changed on a synthetic fleet
(``--nodes``, CPU time: ``plan()`` itself, without the memo, so the figure is
the planner's), and a full round from nothing placed on that fleet (``round``).
``--only KIND`` picks measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.shared import common

_WORKER = r"""
import json, sys, time, gc
tree, kind, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)
import catalog, events
assert catalog.__file__.startswith(tree), catalog.__file__
from bench.shared.common import quiet_logs
quiet_logs()
from bench.shared import gen
open_log = gen.log_opener()
from events.read.replay import replay
from events.read.model import CatalogReadModel
from events.database.connection import make_engine
if kind in ("placement", "round"):
    import scheduler
    assert scheduler.__file__.startswith(tree), scheduler.__file__
    from bench.placement import fleets
    from scheduler.planner.plan import plan
    nodes = fleets.synthetic_nodes(size)
    demands = fleets.synthetic_demands(2 * size)
    current = plan(demands, nodes, (), fleets.NOW).placements
    if kind == "round":
        current = ()
    best = float("inf")
    for _ in range(7 if kind == "placement" else 3):
        gc.collect()
        start = time.process_time()
        plan(demands, nodes, current, fleets.NOW)
        best = min(best, time.process_time() - start)
    print(json.dumps({"seconds": best, "count": 1}))
elif kind == "replay":
    url, stats = gen.sqlite_log(size)
    store = open_log(make_engine(url))
    declared = gen.declared_catalog()
    best = best_cpu = float("inf")
    for _ in range(2):
        gc.collect()
        start, start_cpu = time.perf_counter(), time.process_time()
        result = CatalogReadModel(store, declared).refresh()
        best = min(best, time.perf_counter() - start)
        best_cpu = min(best_cpu, time.process_time() - start_cpu)
    assert len(result.skipped) == stats.bad, (len(result.skipped), stats.bad)
    print(json.dumps({"seconds": best, "cpu": best_cpu, "count": size}))
else:
    from bench.events import append
    url = append._sqlite_copy(f"ab-{os.getpid()}.sqlite")
    models = append._definitions("ab", size)
    out = append._service_adds(url, "FULL", models)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(url.removeprefix("sqlite:///") + suffix):
            os.remove(url.removeprefix("sqlite:///") + suffix)
    print(json.dumps({"seconds": out["seconds"], "cpu": out["cpu"], "count": size}))
""".replace("import json, sys", "import json, os, sys")


def _run(tree: str, kind: str, size: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(common.REPO)}
    out = subprocess.run(
        [sys.executable, "-c", _WORKER, tree, kind, str(size)],
        capture_output=True,
        text=True,
        check=True,
        cwd=common.REPO,
        env=env,
    ).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return {key: float(value) for key, value in data.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shared.ab", description=__doc__)
    parser.add_argument("base", type=Path, help="a tree with the packages to compare against")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--adds", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--nodes", type=int, default=5_000, help="synthetic fleet of the placement round"
    )
    parser.add_argument(
        "--only",
        choices=("replay", "append", "placement", "round"),
        action="append",
        help="measure only these (repeatable); all four by default",
    )
    args = parser.parse_args(argv)
    base = str(args.base.resolve())
    here = str(common.REPO)
    table = common.Table(
        f"Before ({base}) and after (this tree), alternating, best of {args.rounds}",
        ["measurement", "before /s", "after /s", "after / before"],
    )
    from bench.shared.common import quiet_logs

    quiet_logs()
    measurements = (
        ("replay", args.events, f"replay {args.events:,} events, SQLite (events/s)"),
        ("append", args.adds, "validated adds, SQLite FULL, 5,000 models (adds/s)"),
        (
            "placement",
            args.nodes,
            f"placement round with nothing changed, synthetic {args.nodes:,} nodes "
            "(rounds/s of CPU time, best of 7)",
        ),
        (
            "round",
            args.nodes,
            f"placement round from nothing placed, synthetic {args.nodes:,} nodes, "
            f"{2 * args.nodes:,} replicas asked (rounds/s of CPU time, best of 3)",
        ),
    )
    for kind, size, label in measurements:
        if args.only and kind not in args.only:
            continue
        before: list[dict[str, float]] = []
        after: list[dict[str, float]] = []
        for i in range(args.rounds):
            common.progress(f"ab: {kind} round {i + 1} of {args.rounds}")
            before.append(_run(base, kind, size))
            after.append(_run(here, kind, size))
        b = max(r["count"] / r["seconds"] for r in before)
        a = max(r["count"] / r["seconds"] for r in after)
        table.add(label, common.rate(b, 1), common.rate(a, 1), f"{a / b:.2f}x")
        if all("cpu" in r for r in before + after):
            b = max(r["count"] / r["cpu"] for r in before)
            a = max(r["count"] / r["cpu"] for r in after)
            cpu_label = label.replace("(adds/s)", "(adds per CPU-second)").replace(
                "(events/s)", "(events per CPU-second)"
            )
            table.add(cpu_label, common.rate(b, 1), common.rate(a, 1), f"{a / b:.2f}x")
    common.emit(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
