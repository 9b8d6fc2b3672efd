"""CLI conventions, held for every command: help, an example, --json, relative times."""

from __future__ import annotations

import argparse
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.cli import build_parser
from llmgw.cli.completion import bash_script
from llmgw.cli.shared.help_text import EXAMPLES, subcommands
from llmgw.cli.shared.times import BadTime, parse_when, whole_day

# Commands that run until stopped, group commands, or print a script: no JSON to give.
NO_JSON = {
    "serve",
    "daemon",
    "completion",
    "db",
    "nodes",
    "token",
    "rollout",
    "agent",
    "gateway",
    "autoscale",
}
NOW = datetime(2026, 12, 3, 15, 30, tzinfo=UTC)


def test_every_command_has_help_an_example_and_help_on_every_option() -> None:
    parser = build_parser()
    commands = subcommands(parser)
    assert set(commands) == set(EXAMPLES), "a command without examples, or a stale example"
    for path, sub in commands.items():
        assert sub.epilog and "examples:" in sub.epilog, path
        for action in sub._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{path}: {action.option_strings or action.dest} has no help"


def test_every_command_that_answers_takes_json() -> None:
    for path, sub in subcommands(build_parser()).items():
        if path in NO_JSON or path.split()[0] in {"serve", "daemon", "completion"}:
            continue
        options = {o for a in sub._actions for o in a.option_strings}
        assert "--json" in options, f"`llmgw {path}` has no --json"


def test_version_is_printed_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("llmgw ") and printed.out.endswith("\n"), printed
    assert printed.err == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1h", NOW - timedelta(hours=1)),
        ("90m ago", NOW - timedelta(minutes=90)),
        ("2d", NOW - timedelta(days=2)),
        ("1w ago", NOW - timedelta(days=7)),
        ("now", NOW),
        ("today", datetime(2026, 12, 3, tzinfo=UTC)),
        ("yesterday", datetime(2026, 12, 2, tzinfo=UTC)),
        ("2026-11-30T12:00:00Z", datetime(2026, 11, 30, 12, tzinfo=UTC)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
    ],
)
def test_times_are_absolute_or_counted_back_from_now(text: str, expected: datetime) -> None:
    assert parse_when(text, NOW) == expected


def test_days_count_whole_as_an_upper_bound() -> None:
    assert whole_day("yesterday") and whole_day("2026-12-01") and not whole_day("1h")


@given(st.text(max_size=200))
def test_any_text_is_a_time_or_a_refusal_never_a_crash(text: str) -> None:
    try:
        parse_when(text, NOW)
    except BadTime as exc:
        assert "time" in str(exc)


def test_digits_alone_are_not_a_time() -> None:
    with pytest.raises(BadTime):
        parse_when("12", NOW)


def test_bash_completion_completes_commands_subcommands_and_options(tmp_path: Path) -> None:
    script = tmp_path / "llmgw.bash"
    script.write_text(bash_script(build_parser()))

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        done = subprocess.run(
            [
                "bash",
                "-c",
                f"source {script}; COMP_WORDS=(llmgw {line}); COMP_CWORD={len(words)}; "
                '_llmgw; printf "%s\\n" "${COMPREPLY[@]}"',
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.split()

    assert complete("nod") == ["nodes"]
    assert complete("nodes", "l") == ["list"]
    assert "--since" in complete("--db", "x", "history", "--s")
    assert complete("token", "")[:5] == ["import", "limits", "list", "new", "revoke"]
