"""``token.issued`` and ``token.revoked``: what a change records, and how replay reads it
back (bounded; any other shape is unreadable, skipped and named by replay)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from events.core.token_change import MAX_SCOPE, TokenChange, check_token_change, event_for
from events.core.types import TOKEN_ISSUED, TOKEN_REVOKED
from events.core.upcast import UnreadableEvent


@pytest.mark.parametrize(
    "change",
    [
        TokenChange("app-1", "client", models=("chat", "coder")),
        TokenChange("agent-gpu-7", "agent", nodes=("gpu-7",), via="import"),
        TokenChange("alice", "operator", revoked=True),
    ],
)
def test_what_replay_reads_back_is_what_was_written(change: TokenChange) -> None:
    event = event_for(change)
    assert event.type == (TOKEN_REVOKED if change.revoked else TOKEN_ISSUED)
    assert event.model == ""
    assert check_token_change(event.type, json.loads(event.payload)) == change


def test_a_change_is_described_by_name_role_and_scope() -> None:
    assert TokenChange("app-1", "client", models=("a", "b")).describe() == (
        "token app-1 (client, models a,b) issued"
    )
    assert TokenChange("gw", "gateway", via="import").describe() == (
        "token gw (gateway) issued (imported from an auth file)"
    )
    assert TokenChange("bob", "reader", revoked=True).describe() == "token bob (reader) revoked"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({}, "payload name is not a token name"),
        ({"name": "a" * 65, "role": "reader"}, "payload name is not a token name"),
        ({"name": "x", "role": "Reader!"}, "payload role of token 'x' is not a role"),
        ({"name": "x", "role": "client", "models": ["a", 1]}, "payload models of token 'x'"),
        (
            {"name": "x", "role": "client", "models": ["m"] * (MAX_SCOPE + 1)},
            "payload models of token 'x' is not a list of names",
        ),
        ({"name": "x", "role": "agent", "nodes": "gpu-1"}, "payload nodes of token 'x'"),
        ({"name": "x", "role": "reader", "via": "magic"}, "payload via of token 'x'"),
    ],
)
def test_any_other_shape_is_unreadable(payload: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnreadableEvent, match=reason.replace("(", r"\(")):
        check_token_change(TOKEN_ISSUED, payload)
