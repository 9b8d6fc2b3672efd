"""A pytest plugin (``-p suite_cpu``, with ``scripts/`` on the path): the CPU each test
costs, its processes included, read from a cgroup (v1 ``cpuacct``) per xdist worker.

``scripts/suite-cpu.sh`` runs the suite with it and prints the summary. Each worker
moves itself into ``$SUITE_CPU_CGROUP/<worker>`` when it starts, so every process a
test starts (servers, agents, gateways, engines, forked commands, and the orphans a
killed agent leaves) is counted in that worker's cgroup; reading ``cpuacct.usage``
before and after each test gives its CPU, setup and teardown included (a module
fixture's teardown counts to the module's last test). One JSON line a test goes to
``$SUITE_CPU_LOG``, and one per worker with its whole CPU (collection included).
Measurement only: nothing here is part of ``make test``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from typing import Any

import pytest


def _usage(group: str) -> float:
    with open(os.path.join(group, "cpuacct.usage")) as f:
        return int(f.read()) / 1e9


def _write(line: dict[str, Any]) -> None:
    with open(os.environ["SUITE_CPU_LOG"], "a") as f:
        f.write(json.dumps(line) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    root = os.environ.get("SUITE_CPU_CGROUP")
    if not worker or not root:
        return
    group = os.path.join(root, worker)
    os.makedirs(group, exist_ok=True)
    with open(os.path.join(group, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    config.stash[_GROUP] = (group, _usage(group))


_GROUP = pytest.StashKey[tuple[str, float]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    found = item.config.stash.get(_GROUP, None)
    if found is None:
        yield
        return
    group = found[0]
    before, started = _usage(group), time.monotonic()
    yield
    _write(
        {
            "test": item.nodeid,
            "cpu": _usage(group) - before,
            "wall": time.monotonic() - started,
            "worker": os.environ.get("PYTEST_XDIST_WORKER"),
        }
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    found = config.stash.get(_GROUP, None)
    if found is not None:
        group, at_start = found
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        _write({"worker_total": _usage(group) - at_start, "worker": worker})
