"""Running the installed `llmgw` command as an operator would, from a working directory."""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests import forkserver
from tests.support import dump_yaml

LLMGW = str(Path(sys.executable).parent / "llmgw")


class Cli:
    """`llmgw` against one database, run in ``workdir`` (where catalog.yaml is looked for)."""

    def __init__(self, workdir: Path, db_url: str) -> None:
        self.workdir = workdir
        self.env = {**os.environ, "LLMGW_DATABASE_URL": db_url, "LLMGW_LOG_LEVEL": "ERROR"}
        self.env.pop("LLMGW_CONFIG", None)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        # Forked from an interpreter that has llmgw imported (tests/forkserver.py): the
        # same command, arguments, environment and output, without ~0.5 s of imports.
        return forkserver.run(
            args,
            cwd=self.workdir,
            env=self.env,
            # A bound on a hung command, not on speed: a busy 2-core CI machine has
            # taken over 60 s for one command that reads a hostile row.
            timeout=300,
        )

    def spawn(self, *args: str) -> Running:
        """A command that keeps going (--watch, --follow), read a line at a time; forked
        like the others (a fresh process with LLMGW_TEST_FORK=0)."""
        return Running(
            forkserver.popen(
                args,
                cwd=self.workdir,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        )

    def json(self, *args: str) -> Any:
        done = self(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def write(self, name: str, data: Any) -> str:
        (self.workdir / name).write_text(dump_yaml(data))
        return name


class Running:
    """A running ``llmgw``: its stdout lines as they come, and Ctrl-C (SIGINT) to end it."""

    def __init__(self, proc: forkserver.Forked | subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        # As subprocess's text mode reads a pipe: the locale's encoding, universal newlines.
        for line in io.TextIOWrapper(self.proc.stdout):
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout: float = 30) -> str:
        found = self.lines.get(timeout=timeout)
        assert found is not None, f"llmgw ended: {self.interrupt()}"
        return found

    def until(self, predicate: Callable[[str], bool], timeout: float = 30) -> list[str]:
        """The lines read up to and including the first for which ``predicate`` holds."""
        seen: list[str] = []
        while not seen or not predicate(seen[-1]):
            seen.append(self.line(timeout))
        return seen

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C; the exit status and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        assert self.proc.stderr is not None and self.proc.returncode is not None
        return self.proc.returncode, io.TextIOWrapper(self.proc.stderr).read()
