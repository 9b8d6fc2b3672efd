"""Auditing and debugging through the `llmgw` command: history, diff, replay --explain, verify."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import update

from events.database.connection import make_engine
from events.database.tables import EventRow
from tests.e2e.cli import Cli
from tests.e2e.test_cli_catalog import DECLARED, TRIAL


def _cli(request: pytest.FixtureRequest, tmp_path: Path, backend: str) -> Cli:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'llmgw.db'}"
    else:
        url = str(request.getfixturevalue("empty_pg_url"))
    cli = Cli(tmp_path, url)
    cli.url = url  # type: ignore[attr-defined]
    cli.write("catalog.yaml", DECLARED)
    return cli


@pytest.fixture(params=["sqlite", "postgres"])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    return _cli(request, tmp_path, request.param)


@pytest.fixture
def sqlite_cli(request: pytest.FixtureRequest, tmp_path: Path) -> Cli:
    """The read-side commands on one back end: what they read is the store's contract,
    run on both back ends in tests/integration; each command here costs a process."""
    return _cli(request, tmp_path, "sqlite")


def _ok(cli: Cli, *args: str) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_history_filters_diff_and_explained_replay(sqlite_cli: Cli) -> None:
    cli = sqlite_cli
    cli.write("trial.yaml", TRIAL)
    cli.write("trial-tp2.yaml", {**TRIAL, "profiles": [{"name": "t4", "gpu_class": "T4", "tp": 2}]})
    _ok(cli, "add", "trial.yaml", "--actor", "alice", "--reason", "try it")
    _ok(cli, "remove", "qwen-test", "--actor", "bob")
    _ok(cli, "add", "trial-tp2.yaml", "--actor", "alice", "--reason", "on two cards")

    history = cli.json("history", "--actor", "alice", "--type", "model.added")
    assert [h["position"] for h in history] == [1, 3]
    assert all(set(h) == {"position", "recorded_at", "type", "model", "actor", "reason"}
               for h in history)  # fmt: skip
    since = history[1]["recorded_at"]
    assert [h["position"] for h in cli.json("history", "--since", since)] == [3]
    # A date alone as --until is the whole of that day.
    assert [h["position"] for h in cli.json("history", "--until", since[:10])] == [1, 2, 3]

    diff = cli.json("diff", "1", "3")
    assert diff["added"] == diff["removed"] == []
    (changed,) = diff["changed"]
    assert changed["model"] == "qwen-test"
    assert {"path": "profiles[t4].tp", "before": 1, "after": 2} in changed["changes"]
    assert "profiles[t4].tp: 1 -> 2" in _ok(cli, "diff", "1", history[1]["recorded_at"])
    # A time before the log is position 0, and a diff that runs backwards says so.
    early = _ok(cli, "diff", "3", "2001-01-01").splitlines()
    assert early[0] == "from position 3 to 0: 0 added, 1 removed, 0 changed", early
    assert "(2001-01-01 is before the first event: position 0, the declared catalog)" in early
    assert any(line.startswith("(backwards: position 3 is after 0;") for line in early)

    # The trial is moved into reviewed configuration: its runtime events now lose.
    cli.write("next.yaml", {"models": [*DECLARED["models"], {**TRIAL, "source": "reviewed"}]})
    assert cli("replay", "--strict").returncode == 0
    strict = cli("replay", "--strict", "--explain", "--config", "next.yaml")
    assert strict.returncode == 1
    assert "3 event(s) skipped" in strict.stderr
    assert "collides with: qwen-test, a declared model" in strict.stdout
    explained = cli.json("replay", "--explain", "--config", "next.yaml")
    assert {"position", "applied", "skipped", "models", "events"} <= set(explained)
    assert [s["position"] for s in explained["skipped"]] == [1, 2, 3]
    assert explained["events"][0]["context"]["declared_changed_since"] is True
    until = cli.json("replay", "--until", history[0]["recorded_at"])
    assert until["position"] == 1 and until["applied"] == [1]

    assert "at position 3: 1 runtime models" in _ok(cli, "snapshot")
    header, row = _ok(cli, "snapshot", "--list").splitlines()
    assert header.split()[:3] == ["id", "position", "runtime_models"]
    assert row.split()[1:3] == ["3", "1"]


def test_verify_names_an_edited_row_and_checks_a_recorded_head(cli: Cli) -> None:
    cli.write("trial.yaml", TRIAL)
    _ok(cli, "add", "trial.yaml", "--actor", "alice")
    _ok(cli, "remove", "qwen-test", "--actor", "bob")
    report = cli.json("verify")
    assert report["ok"] and report["head"]["position"] == 2
    head = report["head"]["hash"]
    _ok(cli, "add", "trial.yaml", "--actor", "carol")
    assert "expected head found at position 2" in _ok(cli, "verify", "--expect-head", head)

    engine = make_engine(cli.url)  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.execute(update(EventRow).where(EventRow.position == 2).values(actor="mallory"))
    engine.dispose()
    failed = cli("verify")
    assert failed.returncode == 1
    assert "verify failed at position 2" in failed.stderr
    assert "edited" in failed.stderr


def test_verify_names_a_forged_unhashed_row_and_adopting_it_is_explicit(cli: Cli) -> None:
    cli("add", cli.write("trial.yaml", TRIAL))
    from tests.support import insert_raw_event

    engine = make_engine(cli.url)  # type: ignore[attr-defined]
    insert_raw_event(engine, 2, type="model.removed", payload={"name": "a100-trial"}, hashed=False)
    engine.dispose()
    done = cli("verify")
    assert done.returncode == 1
    assert "verify failed at position 2" in done.stderr
    refused = cli("verify", "--adopt-unhashed")
    assert refused.returncode == 1 and "--actor NAME and --reason WHY" in refused.stderr
    adopted = _ok(cli, "verify", "--adopt-unhashed", "--actor", "ops", "--reason", "v1 replica")
    assert "adopted 1 unhashed event(s) at position(s) 2" in adopted
    assert "1 event(s) after the seal carry no hash and were adopted" in _ok(cli, "verify")


def test_verify_fails_naming_a_forged_snapshot(sqlite_cli: Cli) -> None:
    from tests.integration.test_snapshot_trust import _forge

    cli = sqlite_cli
    _ok(cli, "add", cli.write("trial.yaml", TRIAL))
    before = _ok(cli, "verify").splitlines()
    # One event is "1 event"; no snapshot is "none stored", not "0 match" (a mismatch?).
    assert before[0] == "ok: 1 event, head position 1", before
    assert before[-1] == "snapshots: none stored; no snapshot key set", before
    assert "snapshot 1 at position 1" in _ok(cli, "snapshot")
    assert "snapshots: 1 match a replay of the log" in _ok(cli, "verify")
    engine = make_engine(cli.url)  # type: ignore[attr-defined]
    _forge(engine, 1)
    engine.dispose()
    done = cli("verify")
    assert done.returncode == 1
    assert "verify failed for snapshot 1 at position 1: it holds model 'forged'" in done.stderr


def test_a_snapshot_key_too_short_to_be_a_secret_is_refused(sqlite_cli: Cli) -> None:
    sqlite_cli.env["LLMGW_SNAPSHOT_KEY"] = "short"
    done = sqlite_cli("models")
    assert done.returncode == 1
    assert "LLMGW_SNAPSHOT_KEY is 5 characters" in done.stderr
