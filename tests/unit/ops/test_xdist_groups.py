"""`make test`'s `pytest -n 6 --dist loadgroup` keeps a group's tests on one worker, and
hands out the longest work first.

The suite's time rests on it: a module's server (or cluster) is started once only if
its tests share a worker. It broke silently once (pytest 9.2 with pytest-xdist 3.8:
every test spread over both workers, nothing failed), so a small suite is run here
under xdist, with the plugin tests/conftest.py loads (tests/xdist_groups.py), and
each test says which worker ran it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

RECORD = """
import os
from pathlib import Path

def ran(what):
    out = Path(os.environ["RECORD_DIR"]) / os.environ["PYTEST_XDIST_WORKER"]
    with out.open("a") as f:
        f.write(what + "\\n")
"""

SHARED = """
import pytest
from record import ran

@pytest.fixture(scope="module", params=["a", "b"])
def server(request):
    ran("built " + request.param)
    return request.param

@pytest.mark.parametrize("i", range(4))
def test_uses_the_server(server, i):
    ran("shared " + server)
"""

MARKED = """
import pytest
from record import ran

pytestmark = pytest.mark.xdist_group("cached")

@pytest.mark.parametrize("i", range(6))
def test_uses_a_cache(i):
    ran("marked")
"""

FREE = """
import pytest
from record import ran

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    ran("free")
"""

# Collected last, a test alone: handed out first all the same, as it is slow.
SLOW = """
import pytest
from record import ran

@pytest.mark.slow
def test_long():
    ran("slow")
"""


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
def test_a_module_fixture_and_an_explicit_group_each_stay_on_one_worker(tmp_path: Path) -> None:
    suite, record = tmp_path / "suite", tmp_path / "record"
    suite.mkdir()
    record.mkdir()
    for name, text in (
        ("record.py", RECORD),
        ("test_shared.py", SHARED),
        ("test_marked.py", MARKED),
        ("test_free.py", FREE),
        ("test_zz_slow.py", SLOW),
    ):
        (suite / name).write_text(text)
    env = {
        **os.environ,
        "RECORD_DIR": str(record),
        "PYTHONPATH": os.pathsep.join([str(suite), str(REPO)]),
        # Only xdist and ours: the installed plugins (hypothesis, schemathesis) would cost
        # each of the three processes about 2 s of CPU to import.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    plugins = ("-p", "xdist.plugin", "-p", "tests.xdist_groups", "-p", "no:cacheprovider")
    xdist = ("-n", "2", "--dist", "loadgroup")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, *xdist, "-q", "-c", os.devnull, str(suite)],
        check=False,
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = {w.name: w.read_text().splitlines() for w in record.iterdir()}
    # Both workers ran tests (else "one worker" below would hold vacuously) ...
    assert len(ran) == 2, ran
    for what in ("shared a", "shared b", "marked"):
        workers = {w for w, lines in ran.items() if what in lines}
        assert len(workers) == 1, f"{what!r} ran on {sorted(workers)}"
    # ... and each back end's module fixture was built once in all.
    built = sorted(line for lines in ran.values() for line in lines if line.startswith("built"))
    assert built == ["built a", "built b"]
    # The longest work first (tests/xdist_groups.longest_first): the slow test, collected
    # last and alone (xdist's own order put it after every group), is its worker's first.
    assert [lines[0] for lines in ran.values() if "slow" in lines] == ["slow"], ran
