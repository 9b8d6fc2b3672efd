"""tests/suite_cost.py counts a test's processes with the test: what `scripts/suite-cost`
reports as a file's CPU is only worth reading if a server or command it starts is in it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.suite_cost import tree_cpu

BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"


def test_a_child_that_ran_and_was_waited_for_counts() -> None:
    before = tree_cpu(os.getpid())
    subprocess.run([sys.executable, "-c", BURN], check=True)
    assert tree_cpu(os.getpid()) - before >= 0.35


def test_a_grandchild_counts_while_its_parent_lives() -> None:
    before = tree_cpu(os.getpid())
    # A shell whose child burns, then the shell waits on: the burner is a grandchild.
    script = f"{sys.executable} -c '{BURN}'; exec sleep 30"
    shell = subprocess.Popen(["sh", "-c", script])
    try:
        deadline = 100
        while tree_cpu(os.getpid()) - before < 0.35 and deadline:
            subprocess.run(["sleep", "0.1"], check=True)
            deadline -= 1
        assert tree_cpu(os.getpid()) - before >= 0.35
    finally:
        shell.kill()
        shell.wait()
