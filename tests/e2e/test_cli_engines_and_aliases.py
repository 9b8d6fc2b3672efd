"""Engine names checked at every door, and removal by an alias, through the real `llmgw`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.server import ApiServer, Tokens, running
from tests.e2e.cli import Cli
from tests.support import dump_yaml

TYPO = {
    "name": "coder",
    "aliases": ["cdr"],
    "source": "org/coder",
    "profiles": [{"name": "t4", "gpu_class": "T4", "engine": "vlm"}],
}


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path, f"sqlite:///{tmp_path / 'llmgw.db'}")


def test_add_and_apply_refuse_an_engine_no_agent_runs_with_a_did_you_mean(cli: Cli) -> None:
    path = cli.write("coder.yaml", TYPO)
    for command in (["add", path], ["apply", path], ["add", path, "--dry-run"]):
        done = cli(*command)
        assert done.returncode == 1, (command, done.stdout)
        assert "model 'coder' profile 't4': engine 'vlm'" in done.stderr
        assert "did you mean 'vllm'?" in done.stderr
        assert "vllm, llamacpp, sim" in done.stderr
    assert cli.json("history") == []  # nothing was written


def test_a_declared_file_with_an_unknown_engine_is_refused_at_load(
    cli: Cli, tmp_path: Path
) -> None:
    (tmp_path / "catalog.yaml").write_text(dump_yaml({"models": [TYPO]}))
    done = cli("models")
    assert done.returncode == 1
    assert "catalog.yaml models[0]: model 'coder' profile 't4': engine 'vlm'" in done.stderr
    assert "did you mean 'vllm'?" in done.stderr


def test_the_api_refuses_an_unknown_engine_too(tmp_path: Path, sqlite_url: str) -> None:
    tokens = Tokens.issue()
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens)
    with running(server), server.client(tokens.operator) as http:
        added = http.post("/v1/catalog/models", json={**TYPO, "name": "coder2", "aliases": []})
        assert added.status_code == 422, added.text
        assert "did you mean 'vllm'?" in added.json()["detail"]
        assert "coder2" not in {m["name"] for m in http.get("/v1/catalog").json()}


def test_removing_by_an_alias_is_refused_with_the_command_that_removes_the_model(
    cli: Cli,
) -> None:
    path = cli.write("coder.yaml", {**TYPO, "profiles": [{"name": "t4", "gpu_class": "T4"}]})
    assert cli("add", path).returncode == 0
    done = cli("remove", "cdr")
    assert done.returncode == 1
    assert "'cdr' is an alias of model 'coder'" in done.stderr
    assert "`llmgw remove coder`" in done.stderr
    assert [e["type"] for e in cli.json("history")] == ["model.added"]
    assert cli("remove", "coder").returncode == 0
