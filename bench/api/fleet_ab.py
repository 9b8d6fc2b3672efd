"""``python -m bench.api.fleet_ab BASE_COMMIT [--rounds N]``: ``GET /v1/fleet``'s body
(``llmgw.api.routes.fleet._fleet``) at BASE_COMMIT and here, interleaved in one process
on one SQLite database (by default 300 nodes, 150 models of two replicas placed, 10 nodes
cordoned; ``--nodes``, ``--models`` and ``--too-big`` for larger fleets with replicas
that fit nowhere, whose explanations are what planning per request paid for); prints
the best of each and their ratio. The base module is read with
``git show BASE_COMMIT:llmgw/api/routes/fleet.py`` and runs against this tree's
packages, so only the route's own reads and planning differ.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from bench.shared.common import quiet_logs

ROUTE = "llmgw/api/routes/fleet.py"


def _base_module(commit: str, into: Path) -> ModuleType:
    text = subprocess.run(
        ["git", "show", f"{commit}:{ROUTE}"], check=True, capture_output=True, text=True
    ).stdout
    path = into / "fleet_base.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("fleet_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("base", help="the commit to compare with, e.g. main")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--models", type=int, default=150, help="of two replicas, which fit")
    parser.add_argument(
        "--too-big", type=int, default=0, help="models of one replica that fit nowhere (tp=16)"
    )
    args = parser.parse_args()
    quiet_logs()
    from catalog import Catalog
    from catalog.definition.parse import parse_model
    from events.catalog_service import CatalogService
    from events.database.connection import make_engine
    from events.database.migrate import ensure_schema
    from events.storage.backends import open_log
    from llmgw.api.routes import fleet as ours
    from llmgw.api.runtime.services import Services
    from llmgw.api.runtime.settings import ApiSettings
    from scheduler.daemon.round_runner import Placer
    from scheduler.planner.fleet.inventory import parse_node_report

    work = Path(tempfile.mkdtemp(prefix="llmgw-fleet-ab-"))
    base = _base_module(args.base, work)
    engine = make_engine(f"sqlite:///{work / 'fleet.db'}")
    ensure_schema(engine)
    profile = {"name": "a100", "gpu_class": "A100", "tp": 1}
    declared = Catalog.build(
        [
            parse_model(
                {
                    "name": f"m{i}",
                    "source": f"org/m{i}",
                    "profiles": [profile],
                    "scaling": {"min": 2},
                }
            )
            for i in range(args.models)
        ]
        + [
            parse_model(
                {
                    "name": f"big{i}",
                    "source": f"org/big{i}",
                    "profiles": [{**profile, "name": "x16", "tp": 16}],
                    "scaling": {"min": 1},
                }
            )
            for i in range(args.too_big)
        ]
    )
    svc = Services.build(engine, declared, "catalog.yaml", ApiSettings())
    reports = [
        parse_node_report({"name": f"n{i}", "gpu_class": "A100", "gpus": 8, "memory_gb": 512})
        for i in range(args.nodes)
    ]
    svc.nodes.report(reports, datetime.now(UTC))
    Placer(CatalogService(open_log(engine), declared), svc.nodes).run()
    for i in range(10):
        svc.nodes.cordon(f"n{i}", "cordoned", actor="bench", reason="")
    best = {"base": float("inf"), "ours": float("inf")}
    for _ in range(args.rounds):
        for name, module in (("base", base), ("ours", ours)):
            gc.collect()
            start = time.perf_counter()
            module._fleet(svc)
            best[name] = min(best[name], time.perf_counter() - start)
    print(f"| version | best of {args.rounds} (ms) |\n|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds * 1000:.1f} |")
    print(f"\nours/base = {best['ours'] / best['base']:.2f}")


if __name__ == "__main__":
    main()
