"""Every ``python -m bench...`` command the repository names still runs: its ``--help``.

The benchmarks moved into rooms (``bench/events``, ``bench/gateway``, ...); a command the
docs, the README, BENCHMARKS.md, the Makefile, the scripts or a docstring still names by
an old path would fail for whoever copies it. This reads every tracked text file for
``python -m bench[.X]``, then runs each command's ``--help`` as ``python -m`` does
(``runpy``, ``__main__``), all in one fresh interpreter so the suite pays one start.
A command without ``--help`` would run the benchmark itself: each gets a few seconds
(an alarm), and a command that takes longer fails here by name.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
COMMAND = re.compile(r"python -m (bench(?:\.[a-z_]+)*)")
TEXT = (".md", ".py", ".sh", ".toml", ".txt", ".yml")

# Runs in the child: each module as ``python -m MODULE --help`` would, its output kept.
_PROBE = r"""
import contextlib, io, json, runpy, signal, sys

def late(signum, frame):
    raise TimeoutError("no --help: it started the benchmark")

signal.signal(signal.SIGALRM, late)
found = {}
for module in json.loads(sys.argv[1]):
    out = io.StringIO()
    sys.argv = [module, "--help"]
    signal.alarm(20)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = "returned without printing help"
    except SystemExit as e:
        code = e.code or 0
    except BaseException as e:
        code = repr(e)
    finally:
        signal.alarm(0)
    found[module] = [code, out.getvalue()[:2000]]
sys.__stdout__.write(json.dumps(found))
"""


def named_commands() -> dict[str, list[str]]:
    """Each ``python -m bench...`` module named in a tracked text file -> where."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    named: dict[str, list[str]] = {}
    for rel in files:
        path = REPO / rel
        if rel.startswith("tests/") or not (rel.endswith(TEXT) or path.name == "Makefile"):
            continue
        if not path.is_file():
            continue
        for module in COMMAND.findall(path.read_text(encoding="utf-8", errors="replace")):
            named.setdefault(module.rstrip("."), []).append(rel)
    return named


def test_the_repository_names_the_bench_commands_by_their_rooms() -> None:
    named = named_commands()
    # The front door and the rooms' commands are named somewhere (a grep that finds
    # nothing would make the next test pass on nothing).
    assert {"bench", "bench.gateway", "bench.shared.ab", "bench.placement.exact"} <= set(named)
    assert all(m == "bench" or m.split(".")[1] in _ROOMS for m in named), sorted(named)


_ROOMS = {"events", "placement", "autoscale", "api", "gateway", "shared"}


def test_every_named_bench_command_answers_help() -> None:
    named = named_commands()
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(sorted(named))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    broken = {
        f"python -m {module} (named in {', '.join(sorted(set(named[module])))})": code
        for module, (code, text) in found.items()
        if code != 0 or "usage:" not in text
    }
    assert broken == {}
