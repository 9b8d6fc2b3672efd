"""Entry points for the child processes of the concurrency tests.

Each runs in a process of its own, forked from a server that imported this module once
(``tests/integration/test_concurrency.py``: a fresh interpreter cost each writer 0.5 s of
CPU in imports, eighteen of them a run), and returns what it did for the parent to check
against the log. ``python -m tests.procs ROLE URL ...`` runs one as a fresh interpreter and
prints that as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from catalog import Catalog, CatalogError
from events.catalog_service import CatalogService
from events.database.connection import make_engine
from events.storage.backends import open_log
from events.write.commands import CommandConflict
from tests.support import model


def writer(url: str, name: str, count: int) -> dict[str, list[str]]:
    """Add ``count`` models of our own and race the others for ``count`` shared names."""
    service = CatalogService(open_log(make_engine(url)), Catalog.build([]), "catalog.yaml")
    added: list[str] = []
    refused: list[str] = []
    conflicts: list[str] = []
    for i in range(count):
        for candidate in (f"{name}-{i}", f"shared-{i}"):
            try:
                service.add([model(candidate)], actor=name)
                added.append(candidate)
            except CommandConflict:
                conflicts.append(candidate)
            except CatalogError:
                refused.append(candidate)
    return {"added": added, "refused": refused, "conflicts": conflicts}


def batch_writer(url: str, name: str, batch: int, ready: Callable[[], None]) -> None:
    """Append batches forever, until killed: each batch must land whole or not at all."""
    service = CatalogService(open_log(make_engine(url)), Catalog.build([]), "catalog.yaml")
    n = 0
    while True:
        service.add([model(f"{name}-{n}-{i}") for i in range(batch)])
        n += 1
        if n == 1:
            # After the first batch, so the parent's kill lands on a writer that
            # has written (however slow the machine is to start it).
            ready()


def tailer(url: str, seconds: float) -> dict[str, list[int]]:
    """Follow the log by position, as a reader tailing it would, and report what it saw."""
    store = open_log(make_engine(url))
    seen: list[int] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for event in store.read(after=seen[-1] if seen else 0):
            seen.append(event.position)
    return {"seen": seen}


if __name__ == "__main__":
    role, url, *rest = sys.argv[1:]
    if role == "writer":
        print(json.dumps(writer(url, rest[0], int(rest[1]))))
    elif role == "batch_writer":
        batch_writer(url, rest[0], int(rest[1]), lambda: print("ready", flush=True))
    elif role == "tailer":
        print(json.dumps(tailer(url, float(rest[0]))))
    else:
        raise SystemExit(f"unknown role {role!r}")
