"""Commands that keep going, as an operator runs them: `placements --watch`, `nodes list
--watch`, `history --follow`; each ends on Ctrl-C with exit status 0 and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import Cli, Running
from tests.e2e.test_cli_catalog import DECLARED, TRIAL

NODES = [
    {"name": "a100-1", "gpu_class": "A100", "gpus": 8},
    {"name": "t4-1", "gpu_class": "T4", "gpus": 4},
]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    cli = Cli(tmp_path, f"sqlite:///{tmp_path / 'llmgw.db'}")
    cli.write("catalog.yaml", DECLARED)
    return cli


def _ok(cli: Cli, *args: str) -> None:
    done = cli(*args)
    assert done.returncode == 0, done.stderr


def _stopped(running: Running) -> None:
    code, err = running.interrupt()
    assert code == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_nodes_list_watch_json_prints_one_document_a_refresh_until_ctrl_c(cli: Cli) -> None:
    _ok(cli, "nodes", "report", cli.write("nodes.yaml", {"nodes": NODES[:1]}))
    watch = cli.spawn("nodes", "list", "--watch", "0.2", "--json")
    first = json.loads(watch.line())
    assert [n["name"] for n in first] == ["a100-1"]
    _ok(cli, "nodes", "report", cli.write("more.yaml", {"nodes": NODES[1:]}))
    # Every line is a whole document; a later refresh shows the node reported meanwhile.
    lines = watch.until(lambda line: len(json.loads(line)) == 2)
    assert {n["name"] for n in json.loads(lines[-1])} == {"a100-1", "t4-1"}
    _stopped(watch)


def test_placements_watch_redraws_the_table_with_its_time(cli: Cli) -> None:
    _ok(cli, "nodes", "report", cli.write("nodes.yaml", {"nodes": NODES}))
    watch = cli.spawn("placements", "--watch", "200ms")
    assert watch.line().startswith("every 0.2s: llmgw placements  20")
    assert watch.line() == ""
    assert watch.line().split() == [
        "model",
        "replica",
        "profile",
        "gpu_class",
        "gpus/node",
        "nodes",
        "state",
        "since",
        "endpoint",
    ]
    _ok(cli, "place")
    # Not a terminal: each refresh follows the last; the placed replicas appear in one.
    seen = watch.until(lambda line: line.startswith("llama-70b"))
    assert "a100-1" in seen[-1]
    _stopped(watch)


def test_watch_refuses_a_refresh_too_fast_as_a_usage_error(cli: Cli) -> None:
    done = cli("placements", "--watch", "10ms")
    assert done.returncode == 2
    assert "at most ten refreshes a second" in done.stderr


def test_history_follow_prints_the_history_then_each_new_event(cli: Cli) -> None:
    _ok(cli, "add", cli.write("trial.yaml", TRIAL), "--reason", "first")
    _ok(cli, "nodes", "report", cli.write("nodes.yaml", {"nodes": NODES}))
    follow = cli.spawn("history", "--follow", "--placements", "--json")
    first = json.loads(follow.line())
    assert (first["type"], first["model"], first["log"]) == ("model.added", "qwen-test", "catalog")

    _ok(cli, "remove", "qwen-test", "--reason", "second", "--actor", "bob")
    removed = json.loads(follow.line())
    assert (removed["type"], removed["actor"], removed["reason"]) == (
        "model.removed",
        "bob",
        "second",
    )
    assert removed["position"] == first["position"] + 1
    _ok(cli, "place")
    placed = [json.loads(line) for line in follow.until(lambda line: "llama-70b" in line)]
    assert placed[-1]["type"] == "placement.placed"
    assert placed[-1]["log"] == "placements"
    _stopped(follow)


def test_history_follow_as_a_table_keeps_the_columns(cli: Cli) -> None:
    _ok(cli, "add", cli.write("trial.yaml", TRIAL), "--reason", "first")
    follow = cli.spawn("history", "--follow", "--type", "model.removed")
    assert follow.line().split() == ["position", "recorded_at", "type", "model", "actor", "reason"]
    _ok(cli, "add", cli.write("other.yaml", {**TRIAL, "name": "qwen-other"}))  # filtered out
    _ok(cli, "remove", "qwen-test", "--reason", "done")
    line = follow.line()
    assert line.split()[2:4] == ["model.removed", "qwen-test"]
    assert line.split()[0] == "3"  # the add between was read past, not printed
    _stopped(follow)


@pytest.mark.parametrize("until", ["yesterday", "1h", "2026-01-01T00:00:00Z", "now"])
def test_history_follow_with_an_until_already_past_is_refused_not_left_waiting(
    cli: Cli, until: str
) -> None:
    """No new event can be recorded at or before a time that has passed: --follow would
    poll forever and print nothing. A usage error that says so, and what to write."""
    _ok(cli, "add", cli.write("trial.yaml", TRIAL), "--reason", "first")
    done = cli("history", "--follow", "--until", until)
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert f"history --follow --until {until}: that time" in done.stderr
    assert "has passed" in done.stderr and "Drop --follow" in done.stderr
    assert "Traceback" not in done.stderr
    # Without --follow the same bound lists what there is, as before.
    assert cli("history", "--until", until).returncode == 0


def test_history_follow_until_a_time_to_come_follows_then_exits_once_it_has_passed(
    cli: Cli,
) -> None:
    from datetime import UTC, datetime, timedelta

    _ok(cli, "add", cli.write("trial.yaml", TRIAL), "--reason", "first")
    # The --until must still be to come when the command has started (one already past is
    # refused, as tests below show), and the test waits for it to pass: a short margin
    # first, a longer one only if starting took longer than that on a busy machine.
    for margin in (8, 30, 90):
        until = (datetime.now(UTC) + timedelta(seconds=margin)).isoformat()
        follow = cli.spawn("history", "--follow", "--json", "--until", until)
        printed = follow.lines.get(timeout=margin + 60)
        if printed is not None:
            break
        status, stderr = follow.interrupt()
        assert status == 2 and "has passed" in stderr, (status, stderr)
    else:
        pytest.fail("`history --follow` never started within 90 s")
    first = json.loads(printed)
    assert first["type"] == "model.added"
    # It ends by itself once the time has passed (a bound on a hang, not on speed).
    assert follow.proc.wait(timeout=margin + 120) == 0
    assert follow.lines.get(timeout=30) is None  # nothing more was printed
