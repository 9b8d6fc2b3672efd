"""Watching the declared catalog file: a poll of its ``stat``, and SIGHUP to look now.

Why a poll rather than inotify: it is portable (macOS, containers without
inotify, network file systems), it survives the ways files are replaced
(editors write a new file and rename it over the old one; a Kubernetes
ConfigMap swaps a symlink), either of which leaves an inotify watch on the old
inode, and it costs one ``stat`` a second. The content is read only when the
``stat`` changed; SIGHUP makes the next look read it whatever the ``stat`` says
(a file system with coarse modification times).
"""

from __future__ import annotations

import threading

import structlog

from declared.reload import DeclaredReloader

log = structlog.get_logger("llmgw.catalog")

DEFAULT_INTERVAL_S = 1.0


class Watcher:
    def __init__(self, reloader: DeclaredReloader, interval: float = DEFAULT_INTERVAL_S) -> None:
        self.reloader = reloader
        self.interval = interval
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmgw-declared", daemon=True)

    def start(self) -> None:
        log.info(
            "catalog.declared_watching", path=str(self.reloader.path), interval_s=self.interval
        )
        self._thread.start()

    def poke(self) -> None:
        """Look at the file now and read it whatever its ``stat`` says (SIGHUP).

        Only sets an event: safe from a signal handler."""
        self._poke.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poke.wait(self.interval)
            forced = self._poke.is_set()
            self._poke.clear()
            if self._stop.is_set():
                return
            try:
                self.reloader.check(force=forced)
            except Exception as exc:  # a bug must not end the watching silently
                log.error("catalog.declared_check_failed", error=repr(exc))

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()
        if self._thread.is_alive():
            self._thread.join(10)
