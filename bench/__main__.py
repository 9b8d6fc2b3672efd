"""``python -m bench [AREA ...] [--quick]``: print one table per area.

Areas: replay, append, peer, placement, writers, decode, reports, batch, headers, autoscale
(all when none is named), fairness (only when named: the gateway's queue against FIFO
on sim engines, about 11 minutes; with options of its own, such as ``--engine llamacpp``:
``python -m bench fairness --help``), prefix
(the routing profiles against the engines' prefix caches: ``python -m bench prefix
--help``), and gateway (only when named: it needs the peers' venv,
``make bench-peers``, and takes about a quarter of an hour; ``python -m bench.gateway
--help`` has its options), and heartbeats (only when named, with options of its own:
``python -m bench heartbeats --help``), and quotas (client limits across two gateways, one
killed mid-window; only when named: ``python -m bench quotas --help``). The default sizes
are the ones the issue asks for;
``--quick`` uses small ones so that a change can be tried in a minute. Logs are generated
once and cached under ``bench/.cache/`` (SQLite) and in ``llmgw_bench_*`` databases
(PostgreSQL). Progress goes to stderr; stdout holds only markdown tables, ready
to paste into BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from bench.shared import common

AREAS = (
    "replay",
    "append",
    "peer",
    "placement",
    "writers",
    "decode",
    "reports",
    "batch",
    "headers",
    "autoscale",
)
NAMED_ONLY = ("gateway", "fairness")


def _runner(area: str) -> Callable[[bool], list[common.Table]]:
    if area == "replay":
        from bench.events import replay

        return replay.run
    if area == "append":
        from bench.events import append

        return append.run
    if area == "peer":
        from bench.events import peer

        return peer.run
    if area == "writers":
        from bench.events import writers

        return writers.run
    if area == "decode":
        from bench.events import decode

        return decode.run
    if area == "reports":
        from bench.api import reports

        return reports.run
    if area == "batch":
        from bench.api import batch

        return batch.run
    if area == "headers":
        from bench.api import headers

        return headers.run
    if area == "autoscale":
        from bench.autoscale import rounds as autoscale

        return autoscale.run
    if area == "fairness":
        from bench.gateway import fairness

        return fairness.run
    if area == "gateway":
        from bench.gateway import side_by_side as gateway

        return gateway.run
    from bench.placement import rounds as placement

    return placement.run


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["prefix"]:
        # Its own options (workload sizes, gateways): see bench/gateway/prefix.py.
        from bench.gateway import prefix

        return prefix.main(given[1:])
    if given[:1] == ["fairness"] and set(given[1:]) - {"--quick"}:
        # With its own options (--engine llamacpp, --duration, ...): its own parser.
        from bench.gateway import fairness

        return fairness.main(given[1:])
    if given[:1] == ["quotas"]:
        # Its own options (the window, the clients' limits): see bench/gateway/quotas.py.
        from bench.gateway import quotas

        return quotas.main(given[1:])
    if given[:1] == ["heartbeats"]:
        # Options of its own (--nodes, --interval, --servers, --store, --json): its own parser.
        from bench.api import heartbeats

        return heartbeats.main(given[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    known = AREAS + NAMED_ONLY
    parser.add_argument("areas", nargs="*", metavar="AREA", help=f"any of {', '.join(known)}")
    parser.add_argument("--quick", action="store_true", help="small sizes, to iterate")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.areas) - set(known))
    if unknown:
        parser.error(f"unknown area(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    areas = [a for a in known if a in args.areas] if args.areas else list(AREAS)
    common.quiet_logs()
    print(f"## llmgw-control benchmarks{' (quick)' if args.quick else ''}\n")
    print(f"Machine: {common.machine()}\n")
    print(f"Command: `python -m bench {' '.join(sys.argv[1:])}`\n", flush=True)
    for area in areas:
        started = time.perf_counter()
        common.progress(f"{area}: starting")
        for table in _runner(area)(args.quick):
            common.emit(table)
        common.progress(f"{area}: done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
