"""Watching the declared catalog file from ``llmgw serve`` and ``llmgw daemon``.

The wiring only (the rules are in ``declared``): one reloader over every catalog
service of the process, a poll thread, and SIGHUP to look now.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from sqlalchemy import Engine

from catalog import Catalog
from declared.reload import DeclaredReloader, Outcome, Recorder, Reloadable
from declared.watch import Watcher


def watch_declared(
    path: Path | None,
    current: Catalog,
    services: Sequence[Reloadable],
    recorder: Recorder,
    *,
    engine: Engine,
    role: str,
    on_outcome: Callable[[Outcome], None] | None = None,
    interval: float | None = None,
) -> Watcher | None:
    """Start watching ``path`` (None: no declared file, nothing to watch)."""
    if path is None:
        return None
    # One spelling of the file for its row and its messages, whatever the working directory.
    path = path.resolve()
    by = f"llmgw {role} on {socket.gethostname()[:64]} (pid {os.getpid()})"
    reloader = DeclaredReloader(
        path, current, services, recorder, engine=engine, by=by, on_outcome=on_outcome
    )
    reloader.start()
    watcher = Watcher(reloader) if interval is None else Watcher(reloader, interval)

    def hangup(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        watcher.poke()

    signal.signal(signal.SIGHUP, hangup)
    watcher.start()
    return watcher
