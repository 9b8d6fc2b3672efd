"""The `llmgw` command as operators and scripts drive it: exit codes, messages, JSON shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from events.database.connection import make_engine
from tests.e2e.cli import Cli
from tests.support import insert_raw_event

DECLARED: dict[str, Any] = {
    "models": [
        {
            "name": "llama-70b",
            "aliases": ["llama"],
            "source": "meta-llama/Llama-3.1-70B-Instruct",
            "scaling": {"min": 2},
            "profiles": [{"name": "a100-tp4", "gpu_class": "A100", "tp": 4, "priority": 10}],
        },
        {
            "name": "qwen-0.5b",
            "source": "Qwen/Qwen2.5-0.5B-Instruct",
            "fallbacks": ["llama"],
            "profiles": [{"name": "cpu", "engine": "llamacpp", "min_memory_gb": 4}],
        },
    ]
}
TRIAL = {
    "name": "qwen-test",
    "source": "Qwen/Qwen2.5-7B-Instruct",
    "fallbacks": ["llama"],
    "profiles": [{"name": "t4", "gpu_class": "T4"}],
}


@pytest.fixture(params=["sqlite", "postgres"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    # An empty database: the first command migrates it.
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'llmgw.db'}"
    else:
        url = str(request.getfixturevalue("empty_pg_url"))
    cli = Cli(tmp_path, url)
    cli.write("catalog.yaml", DECLARED)
    return cli


def test_the_operator_workflow_end_to_end(cli: Cli) -> None:
    cli.write("qwen-test.yaml", TRIAL)
    added = cli("add", "qwen-test.yaml", "--actor", "alice", "--reason", "try before review")
    assert added.returncode == 0, added.stderr
    assert "added qwen-test at position 1" in added.stdout

    models = cli.json("models")
    assert [(m["name"], m["declared"]) for m in models] == [
        ("llama-70b", True),
        ("qwen-0.5b", True),
        ("qwen-test", False),
    ]
    # Full definitions with defaults applied, in the YAML's field names.
    assert models[2]["profiles"][0]["engine"] == "vllm"
    assert models[2]["profiles"][0]["startup_timeout"] == "20m"
    assert models[0]["scaling"] == {"min": 2, "max": 2}

    assert cli("resolve", "llama").stdout.strip() == "llama-70b"
    removed = cli("remove", "qwen-test", "--actor", "bob")
    assert removed.returncode == 0, removed.stderr

    history = cli.json("history", "--model", "qwen-test")
    assert [(h["position"], h["type"], h["actor"]) for h in history] == [
        (1, "model.added", "alice"),
        (2, "model.removed", "bob"),
    ]
    assert set(history[0]) == {"position", "recorded_at", "type", "model", "actor", "reason"}
    assert history[0]["reason"] == "try before review"

    assert [m["name"] for m in cli.json("show", "--at", "1")] == [
        "llama-70b",
        "qwen-0.5b",
        "qwen-test",
    ]
    at_time = cli.json("show", "--at", history[1]["recorded_at"])
    assert [m["name"] for m in at_time] == ["llama-70b", "qwen-0.5b"]
    assert cli.json("replay") == {
        "position": 2,
        "applied": [1, 2],
        "skipped": [],
        "models": ["llama-70b", "qwen-0.5b"],
    }
    assert cli.json("replay", "--until", "1")["models"] == ["llama-70b", "qwen-0.5b", "qwen-test"]


def test_refusals_exit_1_and_name_the_model_and_the_fix(cli: Cli) -> None:
    cli.write("clash.yaml", {**TRIAL, "name": "llama"})
    clash = cli("add", "clash.yaml")
    assert clash.returncode == 1
    assert "'llama'" in clash.stderr and "catalog.yaml" in clash.stderr

    declared = cli("remove", "llama-70b")
    assert declared.returncode == 1
    assert "Remove it from catalog.yaml instead" in declared.stderr

    cli.write("typo.yaml", {**TRIAL, "profiles": [{"name": "t4", "gpu_clas": "T4"}]})
    typo = cli("add", "typo.yaml")
    assert typo.returncode == 1
    assert "qwen-test" in typo.stderr and "did you mean 'gpu_class'" in typo.stderr

    unknown = cli("resolve", "nope")
    assert unknown.returncode == 1 and "'nope'" in unknown.stderr
    assert cli.json("history") == []  # nothing invalid was written


def test_usage_errors_exit_2(cli: Cli) -> None:
    assert cli("add").returncode == 2
    assert cli("frobnicate").returncode == 2
    assert cli("replay", "--until", "soon").returncode == 2


def test_a_list_add_with_the_same_key_is_recorded_once(cli: Cli) -> None:
    second = {**TRIAL, "name": "qwen-b", "fallbacks": ["qwen-test"]}
    cli.write("pair.yaml", {"models": [second, TRIAL]})
    first = cli("add", "pair.yaml", "--key", "deploy-7")
    assert first.returncode == 0, first.stderr
    again = cli("add", "pair.yaml", "--key", "deploy-7")
    assert again.returncode == 0, again.stderr
    assert "already recorded" in again.stdout
    assert [h["model"] for h in cli.json("history")] == ["qwen-test", "qwen-b"]


def test_the_same_key_with_another_definition_of_the_model_is_refused(cli: Cli) -> None:
    assert cli("add", cli.write("trial.yaml", TRIAL), "--key", "deploy-8").returncode == 0
    moved = cli.write("moved.yaml", {**TRIAL, "source": "Qwen/Qwen2.5-7B-Other"})
    refused = cli("add", moved, "--key", "deploy-8")
    assert refused.returncode == 1
    assert "idempotency key 'deploy-8' was already used for a different change" in (refused.stderr)
    (trial,) = [m for m in cli.json("models") if m["name"] == "qwen-test"]
    assert trial["source"] == TRIAL["source"]


def test_an_invalid_declared_file_stops_with_the_file_model_and_field(cli: Cli) -> None:
    broken = {"models": [DECLARED["models"][0], {**DECLARED["models"][1], "fallbacks": ["gone"]}]}
    cli.write("catalog.yaml", broken)
    done = cli("models")
    assert done.returncode == 1
    assert "catalog.yaml" in done.stderr
    assert "qwen-0.5b" in done.stderr and "fallback 'gone'" in done.stderr


def test_db_upgrade_migrates_explicitly(cli: Cli) -> None:
    done = cli("db", "upgrade")
    assert done.returncode == 0, done.stderr
    assert "schema at" in done.stdout


def test_a_key_an_older_release_stored_in_args_reads_redacted_unless_asked(
    cli: Cli,
) -> None:
    """Issue 36: args stored before keys in args were refused (the log is never rewritten)
    read [redacted] in `models --json`, `show --at` and `diff`, as env values do; an
    operator asks for them with --show-secrets. A new one is refused at `add`."""
    key = "sk-plaintext-123"
    legacy = {
        "name": "legacy",
        "source": "org/legacy",
        "profiles": [
            {"name": "t4", "gpu_class": "T4", "args": ["--api-key", key, "--max-model-len", "4096"]}
        ],
    }
    assert cli("models").returncode == 0  # migrates the empty database
    engine = make_engine(str(cli.env["LLMGW_DATABASE_URL"]))
    try:
        insert_raw_event(
            engine, 1, payload={"model": legacy, "declared_digest": None}, schema_version=2,
            model="legacy",
        )  # fmt: skip
    finally:
        engine.dispose()
    redacted = ["--api-key", "[redacted]", "--max-model-len", "4096"]
    for command in (("models", "--json"), ("show", "--at", "1", "--json")):
        (shown,) = [m for m in cli.json(*command) if m["name"] == "legacy"]
        assert shown["profiles"][0]["args"] == redacted, command
        (stored,) = [m for m in cli.json(*command, "--show-secrets") if m["name"] == "legacy"]
        assert key in stored["profiles"][0]["args"]
    # A change of those args: the diff's entry of them reads [redacted] too.
    fixed = {**legacy, "profiles": [{"name": "t4", "gpu_class": "T4", "args": ["-v"]}]}
    cli.write("fixed.yaml", fixed)
    applied = cli("apply", "fixed.yaml")
    assert applied.returncode == 0, applied.stderr
    diff = cli("diff", "1", "2", "--json")
    assert diff.returncode == 0, diff.stderr
    assert key not in diff.stdout and "profiles[t4].args" in diff.stdout
    assert '"[redacted]"' in diff.stdout
    assert key not in cli("diff", "1", "2").stdout
    assert key in cli("diff", "1", "2", "--json", "--show-secrets").stdout

    cli.write("again.yaml", {**legacy, "name": "again"})
    for dry in ((), ("--dry-run",)):
        for verb in ("add", "apply"):
            refused = cli(verb, "again.yaml", *dry)
            assert refused.returncode != 0, (verb, dry)
            assert "model 'again' profile 't4': args[1] is the value of --api-key" in (
                refused.stderr
            )
            assert "VLLM_API_KEY" in refused.stderr and key not in refused.stderr
    bind = {
        **legacy,
        "name": "bind",
        "profiles": [{"name": "t4", "gpu_class": "T4", "args": ["--port=80"]}],
    }
    cli.write("bind.yaml", bind)
    for dry in ((), ("--dry-run",)):
        refused = cli("add", "bind.yaml", *dry)
        assert "args[0] sets --port; the host and port an engine listens on are the agent's" in (
            refused.stderr
        )
