"""``llmgw --version``, ``--help`` and a command's ``--help`` load no heavy library, and
a command loads what it runs: the parser is built from light modules and a command's
code is imported when that command runs (llmgw.cli.shared.parser)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.processes import free_port
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


# -- the processes that talk HTTP only --------------------------------------------------
#
# A cluster starts an agent per node, a sim engine per replica and gateways, and the
# suite starts hundreds of them: none opens a database or serves the control plane's
# API, so none should pay for SQLAlchemy (~0.2 s of CPU a process) or FastAPI (~0.3 s)
# at start-up. Each runs for real here, until it has talked to a control plane (or
# listens), and lists what it had loaded when it exits.

EXIT_PROBE = (
    "import atexit, json, os, runpy, signal, sys\n"
    "def dump():\n"
    # A None entry marks a module as absent (llmgw.cli.no_rich): not loaded.
    "    loaded = sorted({m.split('.')[0] for m, v in sys.modules.items() if v is not None})\n"
    "    with open(os.environ['LOADED_OUT'], 'w') as f:\n"
    "        json.dump(loaded, f)\n"
    "atexit.register(dump)\n"
    # uvicorn raises the signal that stopped it again once it has shut down: exit through
    # Python then, so that the list is written.
    "signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))\n"
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n"
)

DATABASE_AND_API = {"sqlalchemy", "alembic", "psycopg", "fastapi"}


class RefusingControlPlane:
    """A control plane on loopback that answers every request 403 (as a real one answers
    a token that may not report a node), and keeps the paths it was asked for."""

    def __init__(self) -> None:
        seen: list[str] = []
        self.seen = seen

        class Handler(http.server.BaseHTTPRequestHandler):
            def refuse(self) -> None:
                seen.append(self.path)
                self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.dumps({"title": "Forbidden", "status": 403, "detail": "no"})
                self.send_response(403)
                self.send_header("content-type", "application/problem+json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_POST = do_PUT = refuse

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def control_plane() -> Iterator[RefusingControlPlane]:
    plane = RefusingControlPlane()
    yield plane
    plane.server.shutdown()
    plane.server.server_close()


class Probed:
    """``python -m MODULE ARGV``, as the installed scripts run it, noting what it loads."""

    def __init__(self, tmp_path: Path, module: str, *argv: str) -> None:
        self.out = tmp_path / f"loaded-{module}.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", EXIT_PROBE, module, *argv],
            env={**os.environ, "LOADED_OUT": str(self.out)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def line_with(self, text: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if text in line:
                return line
        raise AssertionError(f"ended without saying {text!r}: {self.finish()}")

    def finish(self, stop: bool = False) -> int:
        """Its exit status (after SIGTERM if ``stop``)."""
        if stop:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def loaded(self) -> set[str]:
        assert self.out.exists(), self.proc.stderr.read() if self.proc.stderr else ""
        return set(json.loads(self.out.read_text()))


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 120  # a bound on a hang, not on speed
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


def test_an_agent_loads_no_database_and_no_web_framework(
    tmp_path: Path, control_plane: RefusingControlPlane
) -> None:
    token = tmp_path / "agent.token"
    token.write_text("not-a-real-token\n")
    agent = Probed(
        tmp_path, "llmgw", "agent", "--server", control_plane.url, "--token-file", str(token),
        "--node", "n1", "--gpus", "SIM:2", "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    # Refused for good after its first report: it ran its start-up and a whole tick.
    assert agent.finish() == 1
    assert any(path.startswith("/v1/nodes") for path in control_plane.seen), control_plane.seen
    loaded = agent.loaded()
    assert "agent" in loaded
    heavy = loaded & (DATABASE_AND_API | {"starlette", "uvicorn", "yaml"})
    assert not heavy, f"loaded {sorted(heavy)}"


def test_a_gateway_loads_no_database_and_no_api_framework(
    tmp_path: Path, control_plane: RefusingControlPlane
) -> None:
    token = tmp_path / "gateway.token"
    token.write_text("not-a-real-token\n")
    gateway = Probed(
        tmp_path, "llmgw", "gateway", "--server", control_plane.url,
        "--token-file", str(token), "--host", "127.0.0.1", "--port", "0",
    )  # fmt: skip
    gateway.line_with("listening on")
    eventually(lambda: bool(control_plane.seen), "the gateway asked the control plane")
    assert gateway.finish(stop=True) == 0
    loaded = gateway.loaded()
    assert {"gateway", "uvicorn"} <= loaded
    heavy = loaded & DATABASE_AND_API
    assert not heavy, f"loaded {sorted(heavy)}"


def test_a_sim_engine_loads_starlette_not_fastapi(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    sim = Probed(tmp_path, "agent.sim", "--port", str(port), "--model", "m")

    def healthy() -> bool:
        url = f"http://127.0.0.1:{port}/health"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
        return False

    # Serving (so it has its signal handlers) and has answered a request.
    eventually(healthy, "the sim engine answered /health")
    assert sim.finish(stop=True) == 0
    loaded = sim.loaded()
    assert {"starlette", "uvicorn"} <= loaded
    # structlog only once httpguard logs a refusal (httpguard.protocol._log): ~45 ms a start.
    heavy = loaded & (DATABASE_AND_API | {"pydantic", "rich", "structlog"})
    assert not heavy, f"loaded {sorted(heavy)}"


def test_rollout_status_loads_no_other_commands_code(tmp_path: Path) -> None:
    """`llmgw rollout status` imported the catalog commands' module (and with it the dry
    run's and the node service's) for one helper another command of its module uses:
    every module a command loads is CPU at each start (its whole cost is imports: 0.46
    s of CPU, the command's own work 25 ms)."""
    env = {"LLMGW_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}", "PATH": "/usr/bin:/bin"}
    probe = "import json, sys\nfrom llmgw.cli import main\nmain(['rollout', 'status', 'nothing'])\n"
    wrapped = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: sys.__stderr__.write('\\n' + json.dumps(sorted(sys.modules))))\n"
        + probe
    )
    done = subprocess.run(
        [sys.executable, "-c", wrapped], capture_output=True, text=True, check=False, env=env
    )
    assert "not in the catalog" in done.stderr, done.stderr
    loaded = set(json.loads(done.stderr.splitlines()[-1]))
    assert "scheduler.daemon.round_runner" in loaded  # (what it runs: a dry-run round)
    for other in ("llmgw.cli.catalog.commands", "llmgw.cli.catalog.dry_run",
                  "scheduler.daemon.node_service"):  # fmt: skip
        assert other not in loaded, other


def test_the_token_parsers_priority_classes_are_the_catalogs() -> None:
    # Written out in the parser, which may load nothing of the catalog at start.
    import argparse

    from catalog.forms.priority import PRIORITY_CLASSES
    from llmgw.cli import build_parser

    def sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
        (group,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        found = group.choices[name]
        assert isinstance(found, argparse.ArgumentParser)
        return found

    new = sub(sub(build_parser(), "token"), "new")
    (action,) = [a for a in new._actions if a.dest == "priority_class"]
    assert tuple(action.choices or ()) == PRIORITY_CLASSES
