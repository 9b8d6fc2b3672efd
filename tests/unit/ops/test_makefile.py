"""`make demo` installs what the demo needs; the development tools belong to `make test`.

`make -n` prints the commands make would run, in order, without running them: real
make on the real Makefile, against a virtual environment that does not exist yet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEV = "-e '.[dev]'"
RUN = "pip install --progress-bar off -e '.[demo]'"


def planned(target: str, venv: Path) -> list[str]:
    if shutil.which("make") is None:
        pytest.fail("make is not installed (apt-get install make)")
    # Under `make test` the parent make's MAKEFLAGS/MAKELEVEL reach this make, which then
    # prints "Entering/Leaving directory" lines among the plan: run it as a top-level make.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.splitlines()


def test_make_demo_installs_the_package_alone(tmp_path: Path) -> None:
    lines = planned("demo", tmp_path / "venv")
    installs = [x for x in lines if "pip install" in x and "--upgrade pip" not in x]
    assert installs == [f"{tmp_path / 'venv'}/bin/{RUN}"]
    assert not [x for x in lines if "[dev]" in x]
    assert lines[-1] == "bash scripts/demo.sh"


@pytest.mark.parametrize("target", ["test", "lint", "typecheck", "pytest"])
def test_the_development_tools_come_with_the_targets_that_use_them(
    tmp_path: Path, target: str
) -> None:
    lines = planned(target, tmp_path / "venv")
    assert any(x.endswith(DEV) for x in lines), lines


def test_the_demo_scripts_use_nothing_the_development_tools_bring() -> None:
    for name in ("demo.sh", "demo-cluster.sh"):
        script = (REPO / "scripts" / name).read_text()
        for tool in ("pytest", "ruff", "mypy", "playwright", "httpx", "schemathesis"):
            assert tool not in script, (name, tool)


def test_what_the_demo_imports_beyond_the_package_is_in_its_extra() -> None:
    # demo-cluster.sh sends requests with the official client: `make demo` installs it.
    assert "from openai import" in (REPO / "scripts" / "demo-cluster.sh").read_text()
    assert 'demo = ["openai' in (REPO / "pyproject.toml").read_text()


def test_make_demo_builds_the_manual_that_serve_shows_at_manual(tmp_path: Path) -> None:
    # /manual was 404 after `make demo`: the site was built only by `make docs`, whose
    # mkdocs comes with the development tools. The demo builds it, with mkdocs from its
    # own extra, before the scenario (whose servers then serve it).
    lines = planned("demo", tmp_path / "venv")
    build = [
        i
        for i, x in enumerate(lines)
        if x.endswith(f"{tmp_path / 'venv'}/bin/mkdocs build --quiet")
    ]
    assert build and build[0] < lines.index("bash scripts/demo.sh"), lines
    demo = (REPO / "pyproject.toml").read_text().split("\ndemo = ", 1)[1].split("\n", 1)[0]
    assert "llmgw-control[docs]" in demo


def test_make_demo_compiles_the_packages_commands_import(tmp_path: Path) -> None:
    # Where PYTHONDONTWRITEBYTECODE is set (this sandbox, some CI), an operator's every
    # `llmgw` command compiled our ~75 modules it imports from source again: `llmgw
    # rollout status` 0.57 s of CPU, 0.46 s with them compiled once.
    lines = planned("demo", tmp_path / "venv")
    compiled = [x for x in lines if "-m compileall" in x]
    assert compiled and all(p in compiled[0] for p in ("llmgw", "scheduler", "catalog"))
    assert lines.index(compiled[0]) < lines.index("bash scripts/demo.sh")
