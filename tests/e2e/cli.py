"""Running the installed `llmgw` command as an operator would, from a working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import dump_yaml

LLMGW = str(Path(sys.executable).parent / "llmgw")


class Cli:
    """`llmgw` against one database, run in ``workdir`` (where catalog.yaml is looked for)."""

    def __init__(self, workdir: Path, db_url: str) -> None:
        self.workdir = workdir
        self.env = {**os.environ, "LLMGW_DATABASE_URL": db_url, "LLMGW_LOG_LEVEL": "ERROR"}
        self.env.pop("LLMGW_CONFIG", None)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [LLMGW, *args],
            check=False,
            cwd=self.workdir,
            env=self.env,
            capture_output=True,
            text=True,
            # A bound on a hung command, not on speed: a busy 2-core CI machine has
            # taken over 60 s for one command that reads a hostile row.
            timeout=300,
        )

    def json(self, *args: str) -> Any:
        done = self(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def write(self, name: str, data: Any) -> str:
        (self.workdir / name).write_text(dump_yaml(data))
        return name
