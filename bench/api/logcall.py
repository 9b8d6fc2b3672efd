"""``python -m bench.api.logcall``: what one structured log call costs on the production path.

``llmgw.logs.configure`` is what every command runs. Before, it set
``cache_logger_on_first_use=False``: each call on a module's logger proxy assembled
a new bound logger (a printer from the factory, the wrapper, a context dict) before
the level filter could drop it. Measured here in one process, interleaved, for an
emitted line (written to /dev/null, so the terminal is not what is timed) and a
filtered one (a debug line at the default level, the common case in a hot path).
Prints a markdown table: nanoseconds per call, best of ``REPEATS`` runs of ``CALLS``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import structlog

from llmgw import logs

CALLS = 20_000
REPEATS = 7


def _per_call(cache: bool, level: str, emit: bool) -> float:
    os.environ["LLMGW_LOG_LEVEL"] = level
    logs.configure(cache=cache)
    log = structlog.get_logger("bench.api.logcall")  # a fresh proxy, as a module holds one
    # The method is looked up on the proxy at each call, as ``log.info(...)`` in a module
    # does: that lookup is where the logger was built.
    name = "info" if emit else "debug"
    getattr(log, name)("bench.warmup")
    started = time.perf_counter_ns()
    for i in range(CALLS):
        getattr(log, name)("bench.event", node="gpu-07", replica=i, state="ready")
    return (time.perf_counter_ns() - started) / CALLS


def main(argv: list[str] | None = None) -> None:
    import argparse

    argparse.ArgumentParser(prog="python -m bench.api.logcall", description=__doc__).parse_args(
        argv
    )
    saved = sys.stderr
    with open(os.devnull, "w") as devnull:
        sys.stderr = devnull  # logs.configure prints to sys.stderr as it is then
        try:
            cases = [(cache, emit) for emit in (True, False) for cache in (False, True)]
            runs: dict[tuple[bool, bool], list[float]] = {c: [] for c in cases}
            for _ in range(REPEATS):
                for cache, emit in cases:
                    runs[(cache, emit)].append(_per_call(cache, "INFO", emit))
        finally:
            sys.stderr = saved
    print("| call | built per call (before) | cached (now) | ratio |")
    print("|---|---:|---:|---:|")
    for emit, label in ((True, "info, written"), (False, "debug, filtered at INFO")):
        before, after = min(runs[(False, emit)]), min(runs[(True, emit)])
        print(f"| {label} | {before:,.0f} ns | {after:,.0f} ns | {before / after:.2f}x |")
    spread = {k: statistics.median(v) / min(v) for k, v in runs.items()}
    print(f"\n(median / best per case: {', '.join(f'{v:.2f}' for v in spread.values())})")


if __name__ == "__main__":
    main()
