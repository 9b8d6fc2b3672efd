"""``llmgw --version``, ``--help`` and a command's ``--help`` load no heavy library, and
a command loads what it runs: the parser is built from light modules and a command's
code is imported when that command runs (llmgw.cli.shared.parser)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.cli import build_parser
from llmgw.cli.operate.parser import ROLES
from llmgw.cli.shared import context as cli_context
from llmgw.cli.shared.help_text import subcommands
from llmgw.cli.shared.parser import command

HEAVY = ("sqlalchemy", "pydantic", "structlog", "yaml", "fastapi", "alembic", "psycopg")


def loaded_by(*argv: str, env: dict[str, str] | None = None) -> set[str]:
    """The top-level packages in sys.modules once ``llmgw ARGV`` has run, in a fresh
    interpreter (as the installed ``llmgw`` script runs it)."""
    probe = (
        "import json, sys\n"
        "from llmgw.cli import main\n"
        "try:\n"
        f"    main({list(argv)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        # A None entry marks a module as absent (llmgw.cli.no_rich): not loaded.
        "loaded = {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n"
        "sys.__stderr__.write('\\n' + json.dumps(sorted(loaded)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    )
    return set(json.loads(done.stderr.splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ("--version",),
        ("--help",),
        ("history", "--help"),
        ("nodes", "list", "--help"),
        ("serve", "--help"),
    ],
)
def test_version_and_help_load_no_heavy_library(argv: tuple[str, ...]) -> None:
    loaded = loaded_by(*argv)
    assert not loaded & set(HEAVY), f"llmgw {' '.join(argv)} loaded {loaded & set(HEAVY)}"
    assert not loaded & {"catalog", "events", "scheduler", "agent"}


def test_a_read_command_loads_no_web_framework_and_no_models(tmp_path: Path) -> None:
    env = {"LLMGW_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}", "PATH": "/usr/bin:/bin"}
    loaded = loaded_by("settings", "--json", env=env)
    assert not loaded & {"sqlalchemy", "pydantic", "fastapi", "yaml", "alembic"}
    loaded = loaded_by("history", env=env)
    assert "sqlalchemy" in loaded
    assert not loaded & {"fastapi", "starlette", "uvicorn", "agent"}


def test_a_command_does_not_load_rich_for_structlog(tmp_path: Path) -> None:
    """rich (brought by a development tool, never used by llmgw) cost every process
    started about 90 ms of CPU through structlog's exception formatter (llmgw.cli.no_rich)."""
    env = {"LLMGW_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}", "PATH": "/usr/bin:/bin"}
    loaded = loaded_by("history", env=env)
    assert "structlog" in loaded
    assert "rich" not in loaded


def test_every_command_names_a_function_that_exists() -> None:
    for path, sub in subcommands(build_parser()).items():
        run = sub.get_default("run")
        if run is not None:
            assert callable(command(run)), path


def test_the_roles_spelled_for_help_are_the_api_roles() -> None:
    from llmgw.api.guards.tokens import Role

    assert [r.value for r in Role] == ROLES


def test_the_refusals_named_by_module_exist() -> None:
    """context names the domain's refusals as strings (so that it imports none of them):
    each must still name a class, wherever a refactor moves it."""
    import importlib

    for module, name in (*cli_context._REFUSALS, *cli_context._DATABASE):
        found = getattr(importlib.import_module(module), name)
        assert isinstance(found, type) and issubclass(found, Exception), (module, name)
