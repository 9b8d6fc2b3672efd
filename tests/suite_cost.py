"""What each test costs in CPU, its processes included: a pytest plugin for finding where
the suite's time goes (issue 37), loaded by tests/conftest.py when LLMGW_TEST_COST_DIR is set.

Why CPU and not wall time: `make test` runs six workers on two cores, so a test's wall
time says as much about its neighbours as about itself, and a machine busy with other
work inflates every figure. The CPU a test makes its worker and the processes under it
burn is its own whatever runs beside it.

How: the CPU of a worker's process tree is read from /proc before and after each test
(setup, call and teardown): every living descendant's own time and the time of its
children it has reaped (a process that ends and is waited for moves its time into its
parent's, so the sum holds across exits). The commands the suite forks through
tests/forkserver.py are descendants of the worker too. Time of a process that leaves
the tree unreaped (a daemon that double-forks) is not counted; a server a module-scoped
fixture holds counts in the tests that run while it burns, which is where it belongs.

Each worker appends one JSON line a test to ``<dir>/<worker>.jsonl``:
``{"nodeid", "cpu_s", "wall_s"}``; ``scripts/suite-cost`` sums them by file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from pathlib import Path

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, own + reaped children's CPU seconds) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces and parentheses: split after it.
    fields = raw[raw.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
    return int(fields[1]), sum(int(v) for v in fields[11:15]) / _TICK


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and every living process under it, their reaped children's
    included."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None:
                stats[int(entry.name)] = found
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


class SuiteCost:
    def __init__(self, directory: Path, worker: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._out = (directory / f"{worker}.jsonl").open("a", encoding="utf-8")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        me = os.getpid()
        cpu, wall = tree_cpu(me), time.monotonic()
        yield
        line = {
            "nodeid": item.nodeid,
            "cpu_s": round(tree_cpu(me) - cpu, 3),
            "wall_s": round(time.monotonic() - wall, 3),
        }
        self._out.write(json.dumps(line) + "\n")
        self._out.flush()


def register(config: pytest.Config) -> None:
    """Load the plugin when LLMGW_TEST_COST_DIR names a directory."""
    directory = os.environ.get("LLMGW_TEST_COST_DIR")
    if directory:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        config.pluginmanager.register(SuiteCost(Path(directory), worker), "llmgw-suite-cost")
