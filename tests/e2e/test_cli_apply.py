"""`llmgw apply` as an operator drives it: add, replace with a diff, unchanged, refusals, keys.

(The rules behind each refusal are tested in tests/unit and tests/integration; the
server's answers, with the CLI's words side by side, in tests/api/test_api_apply.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cli import Cli
from tests.e2e.test_cli_catalog import DECLARED, TRIAL


@pytest.fixture(params=["sqlite", "postgres"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'llmgw.db'}"
    else:
        url = str(request.getfixturevalue("empty_pg_url"))
    cli = Cli(tmp_path, url)
    cli.write("catalog.yaml", DECLARED)
    return cli


def test_apply_adds_replaces_with_a_diff_and_writes_nothing_when_unchanged(cli: Cli) -> None:
    cli.write("qwen-test.yaml", TRIAL)
    added = cli("apply", "qwen-test.yaml", "--actor", "alice", "--reason", "try")
    assert added.returncode == 0, added.stderr
    assert added.stdout == "added qwen-test at position 1\n+ qwen-test\n"

    cli.write("qwen-test.yaml", {**TRIAL, "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 2}]})
    replaced = cli("apply", "qwen-test.yaml", "--actor", "alice", "--reason", "tp 2")
    assert replaced.returncode == 0, replaced.stderr
    assert replaced.stdout.splitlines() == [
        "replaced qwen-test at position 2",
        "~ qwen-test",
        "    profiles[t4].tp: 1 -> 2",
        "    profiles[t4].gpus_per_node: 1 -> 2",
    ]
    unchanged = cli.json("apply", "qwen-test.yaml")
    assert unchanged == {
        "outcome": "unchanged",
        "model": "qwen-test",
        "position": None,
        "already_recorded": False,
        "diff": {"added": [], "removed": [], "changed": []},
    }

    history = cli.json("history", "--model", "qwen-test")
    assert [(h["position"], h["type"], h["reason"]) for h in history] == [
        (1, "model.added", "try"),
        (2, "model.replaced", "tp 2"),
    ]
    (changed,) = cli.json("diff", "1", "2")["changed"]
    assert [c["path"] for c in changed["changes"]] == [
        "profiles[t4].tp",
        "profiles[t4].gpus_per_node",
    ]
    explained = cli.json("replay", "--explain")
    assert [(e["type"], e["outcome"]) for e in explained["events"]] == [
        ("model.added", "applied"),
        ("model.replaced", "applied"),
    ]
    (now,) = [m for m in cli.json("models") if m["name"] == "qwen-test"]
    assert now["profiles"][0]["tp"] == 2


def test_apply_refusals_exit_1_name_the_model_and_what_to_do(cli: Cli) -> None:
    declared = cli.write("llama.yaml", DECLARED["models"][0])
    refused = cli("apply", declared)
    assert refused.returncode == 1
    assert "model 'llama-70b' is declared in catalog.yaml and cannot be replaced" in refused.stderr
    assert "Change it in catalog.yaml instead" in refused.stderr

    listed = cli("apply", "catalog.yaml")
    assert listed.returncode == 1 and "apply takes one model definition" in listed.stderr
    assert cli.json("history") == []  # nothing refused was written


def test_apply_with_a_key_is_recorded_once_and_a_different_change_is_refused(cli: Cli) -> None:
    cli.write("qwen-test.yaml", TRIAL)
    assert cli("apply", "qwen-test.yaml").returncode == 0
    cli.write("v2.yaml", {**TRIAL, "scaling": {"min": 1}})
    first = cli.json("apply", "v2.yaml", "--key", "rollout-2")
    again = cli.json("apply", "v2.yaml", "--key", "rollout-2")
    assert again == {**first, "already_recorded": True}
    cli.write("v3.yaml", {**TRIAL, "scaling": {"min": 2}})
    reused = cli("apply", "v3.yaml", "--key", "rollout-2")
    assert reused.returncode == 1
    assert "'rollout-2' was already used for a different change" in reused.stderr


def test_apply_dry_run_shows_the_diff_and_the_next_round_and_records_nothing(
    tmp_path: Path,
) -> None:
    # One back end: what is read is the store's contract; this checks the command's output.
    cli = Cli(tmp_path, f"sqlite:///{tmp_path / 'llmgw.db'}")
    cli.write("catalog.yaml", DECLARED)
    nodes = [{"name": f"t4-{i}", "gpu_class": "T4", "gpus": 4} for i in range(2)]
    assert cli("nodes", "report", cli.write("nodes.yaml", {"nodes": nodes})).returncode == 0
    trial = {**TRIAL, "scaling": {"min": 1}}
    cli.write("qwen-test.yaml", trial)

    dry = cli("apply", "qwen-test.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[:4] == [
        "dry run at catalog position 0: nothing recorded",
        "would add qwen-test",
        "+ qwen-test",
        "the next round (2 nodes) would then:",
    ]
    assert lines[4].startswith("  + qwen-test[0] t4 on t4-")
    assert cli.json("history") == []  # nothing written

    assert cli("apply", "qwen-test.yaml").returncode == 0
    assert cli("place").returncode == 0
    cli.write("qwen-test.yaml", {**trial, "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 2}]})
    preview = cli.json("apply", "qwen-test.yaml", "--dry-run")
    assert preview["dry_run"] is True and preview["outcome"] == "replaced"
    assert preview["catalog_position"] == 1
    (changed,) = preview["diff"]["changed"]
    assert [c["path"] for c in changed["changes"]] == [
        "profiles[t4].tp",
        "profiles[t4].gpus_per_node",
    ]
    # The new definition is rolled out surge-first: a new replica placed, the old one kept.
    assert [p["model"] for p in preview["would_place"]] == ["qwen-test"]
    assert preview["would_place"][0]["gpus_per_node"] == 2
    (rollout,) = preview["rollouts"]
    assert rollout["model"] == "qwen-test"
    assert [e["position"] for e in cli.json("history")] == [1]

    refused = cli("apply", cli.write("llama.yaml", DECLARED["models"][0]), "--dry-run")
    assert refused.returncode == 1 and "llama-70b" in refused.stderr
