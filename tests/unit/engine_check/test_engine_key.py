"""engine-check straight to a keyed replica: the key, as it looks it up
(``llmgw.cli.operate.engine_check._engine_key``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_check.probe import Target, post
from llmgw.cli.operate.engine_check import _engine_key
from llmgw.cli.shared.context import Refused


@pytest.mark.parametrize("stored", ["sk-abc-123\n\n", "sk-abc-123\r\n\r\n", "sk-abc-123\x01"])
def test_a_value_no_header_can_carry_is_refused_without_being_printed(
    tmp_path: Path, stored: str
) -> None:
    # Attack: a secret's file with one line end too many (only one is taken off, as an
    # agent takes it off): urllib refused the header with "Invalid header value
    # b'Bearer sk-...'", and engine-check printed that in its verdicts (and --json),
    # the key in a terminal's scrollback or a CI log. The gateway never sends such a
    # value (gateway.table.engine_auth); engine-check refuses it the same way.
    (tmp_path / "engine-key").write_text(stored)
    try:
        headers = _engine_key("m", "p", "engine-key", tmp_path)
    except Refused as refused:
        assert "sk-abc-123" not in str(refused)
        assert "'engine-key'" in str(refused) and "header" in str(refused)
        return
    said = post(Target("http://127.0.0.1:9", "m", "r", headers=headers), "/v1/models", {}, 2)
    assert "sk-abc-123" not in said.text, said.text


def test_a_usable_value_is_sent_as_a_bearer_token(tmp_path: Path) -> None:
    (tmp_path / "engine-key").write_text("sk-abc-123\n")
    assert _engine_key("m", "p", "engine-key", tmp_path) == {"Authorization": "Bearer sk-abc-123"}
    assert _engine_key("m", "p", None, tmp_path) == {}
