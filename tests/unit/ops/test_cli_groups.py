"""Every command group alone (``llmgw``, ``llmgw nodes``, ``llmgw token`` ...) prints its
help and exits 0, instead of argparse's "the following arguments are required:
nodes_command" (exit 2): the real parser, walked for every group at any depth."""

from __future__ import annotations

import argparse

import pytest

from llmgw.cli import build_parser, main


def _groups(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.append(path)
            for name, child in action.choices.items():
                found += _groups(child, (*path, name))
    return found


GROUPS = _groups(build_parser())


def test_the_groups_are_found() -> None:
    assert {(), ("nodes",), ("token",), ("rollout",), ("autoscale",), ("db",)} <= set(GROUPS)


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(("llmgw", *p)))
def test_a_command_group_alone_prints_its_help(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(list(path))
    except SystemExit as exc:  # argparse's usage error
        code = exc.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith(f"usage: {' '.join(('llmgw', *path))} ") and "error" not in err
    # The whole help: its subcommands listed with what each does.
    assert "positional arguments" in out
