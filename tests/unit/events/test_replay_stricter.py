"""The two kinds of hostile stored definition that replay's former fast path accepted
(pydantic ``validate_json`` reads past the general path's limits) are now judged by the
general path, as every write judges them: skipped, with its reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from catalog import Catalog, parse_model
from events.core.types import StoredEvent
from events.read.replay import replay
from tests.support import definition

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _add(position: int, payload: str) -> StoredEvent:
    return StoredEvent(position, f"e{position}", "c", "model.added", 2, None, payload, "t", "", AT)


def test_a_definition_of_more_than_100000_json_values_is_skipped_with_the_limits_reason() -> None:
    body = definition("big")
    body["profiles"][0]["args"] = ["x"] * 100_001
    text = json.dumps({"model": parse_model(body).to_definition(), "declared_digest": None})

    result = replay(Catalog.build([]), [_add(1, text), _add(2, _plain("after"))])

    assert [s.position for s in result.skipped] == [1]
    assert result.skipped[0].reason.startswith("payload: holds more than 100000 values")
    assert result.catalog.names() == ["after"]


def test_an_unread_key_nested_deeper_than_32_is_skipped_with_the_limits_reason() -> None:
    deep = "[" * 40 + "]" * 40
    text = '{"model": ' + json.dumps(parse_model(definition("deep")).to_definition())
    text += ', "declared_digest": null, "x": ' + deep + "}"

    result = replay(Catalog.build([]), [_add(1, text), _add(2, _plain("after"))])

    assert [s.position for s in result.skipped] == [1]
    assert result.skipped[0].reason.startswith("payload: nested deeper than 32 levels")
    assert result.catalog.names() == ["after"]


def _plain(name: str) -> str:
    return json.dumps(
        {"model": parse_model(definition(name)).to_definition(), "declared_digest": None}
    )
