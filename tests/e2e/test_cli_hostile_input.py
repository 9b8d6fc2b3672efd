"""The CLI refuses hostile files quickly and in bounded memory, naming the limit."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import pytest

from tests.e2e.cli import LLMGW, Cli
from tests.hostile.documents import deep_definition, model_bomb, node_bomb

# Far below what expanding the bomb takes (it grew past 400 MB), far above what
# the command needs (about 300 MB of address space with its libraries).
ADDRESS_SPACE = 1 << 30


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_capped(cli: Cli, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LLMGW, *args],
        check=False,
        cwd=cli.workdir,
        env=cli.env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_capped,
    )


@pytest.mark.parametrize(
    ("command", "document", "refusal"),
    [
        ("add", model_bomb(), "line 5: YAML anchors and aliases (&name, *name)"),
        ("nodes report", node_bomb(), "line 4: YAML anchors and aliases (&name, *name)"),
        ("add", deep_definition(3000), "nested deeper than 32 levels"),
    ],
    ids=["add-bomb", "nodes-report-bomb", "add-3000-deep"],
)
def test_a_hostile_file_is_refused_in_bounded_memory_naming_the_limit(
    tmp_path: Path, sqlite_url: str, command: str, document: str, refusal: str
) -> None:
    cli = Cli(tmp_path, sqlite_url)
    (tmp_path / "hostile.yaml").write_text(document)

    done = run_capped(cli, *command.split(), "hostile.yaml")

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: hostile.yaml: "), done.stderr
    assert refusal in done.stderr
    assert "Traceback" not in done.stderr
    assert cli("models", "--json").stdout.strip() == "[]", "nothing was recorded"


def test_a_declared_catalog_with_aliases_stops_every_command_naming_the_file(
    tmp_path: Path, sqlite_url: str
) -> None:
    cli = Cli(tmp_path, sqlite_url)
    (tmp_path / "catalog.yaml").write_text(
        "models:\n  - " + model_bomb().replace("\n", "\n    ").rstrip() + "\n"
    )

    done = run_capped(cli, "models")

    assert done.returncode == 1, done.stderr
    assert "catalog.yaml: line 6: YAML anchors and aliases" in done.stderr
