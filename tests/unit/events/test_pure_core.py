"""The pure core imports no database layer and no logging: it runs anywhere, and fast.

Checked in a fresh interpreter, since this test process has long since
imported SQLAlchemy for other tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# The pure floors (see events/__init__.py and scheduler/__init__.py), every module found on disk,
# so that a new planner module is held to this without a line here.
PURE_FLOORS = ("events.core", "scheduler.lifecycle", "scheduler.planner")
FLOOR_MODULES = tuple(
    f"{floor}.{path.stem}" if path.stem != "__init__" else floor
    for floor in PURE_FLOORS
    for path in sorted((REPO / floor.replace(".", "/")).glob("*.py"))
)

PURE = (
    "events",
    "events.read.replay",
    "events.read.replay_reasons",
    "events.write.apply",
    "events.write.idempotency",
    "events.storage.log",
    "events.storage.memory_log",
    "scheduler.planner.plan",
    *FLOOR_MODULES,
)


def test_the_pure_core_loads_neither_sqlalchemy_nor_structlog() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {PURE!r}:\n"
        "    importlib.import_module(name)\n"
        "heavy = ('sqlalchemy', 'structlog')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "", f"the pure core imported: {done.stdout.strip()}"
