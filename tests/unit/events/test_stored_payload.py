"""What an add stores is the definition it was given, read back equal by every reader.

The payload's text is pydantic's JSON of the definition (compact, in field order)
rather than ``json.dumps(..., sort_keys=True)`` of it: a different spelling of the
same JSON value. These properties hold
it to that: over generated valid definitions, the stored text parses to exactly
``{"model": to_definition(), "declared_digest": ...}``, gives back an equal model
through the general path and through replay's fast decoder (so replay does not
fall back to the slow path on what the commands write), and a log holding both the
old spelling and the new replays to the same catalog.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings

from bench.shared.gen import TEXT_FORMATS
from catalog import Catalog, Model, parse_model
from catalog.stored.fast_decode import decode_definition
from events.core.types import MODEL_ADDED, StoredEvent
from events.read.replay import replay
from events.write.apply import definition_event
from tests.unit.catalog.test_catalog_properties import valid_definitions

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DIGEST = "ab" * 32
NOON = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@SETTINGS
@given(valid_definitions())
def test_a_stored_add_is_the_definition_and_reads_back_equal(raw: dict[str, Any]) -> None:
    model = parse_model(raw)
    event = definition_event(MODEL_ADDED, model, DIGEST)
    data = json.loads(event.payload)
    assert data == {"model": model.to_definition(), "declared_digest": DIGEST}
    # The generated benchmark logs (bench/shared/gen.py) write the same text from the definition.
    compact = TEXT_FORMATS["compact"]
    assert compact({"model": model.to_definition(), "declared_digest": DIGEST}) == event.payload
    assert parse_model(data["model"]) == model
    assert decode_definition(event.payload) == model


@SETTINGS
@given(valid_definitions())
def test_a_log_in_both_spellings_replays_to_the_same_catalog(raw: dict[str, Any]) -> None:
    model = parse_model(raw)
    new = definition_event(MODEL_ADDED, model, DIGEST).payload
    old = json.dumps({"model": model.to_definition(), "declared_digest": DIGEST}, sort_keys=True)

    def replayed(payload: str) -> tuple[list[str], Model | None]:
        event = StoredEvent(1, "e1", "c1", MODEL_ADDED, 2, model.name, payload, "a", "", NOON)
        result = replay(Catalog.build([]), [event])
        return [s.reason for s in result.skipped], result.catalog.resolve(model.name)

    # Applied alike, or (a fallback to a model not in this empty catalog) skipped alike.
    assert replayed(new) == replayed(old)
    if not model.fallbacks or set(model.fallbacks) <= {model.name, *model.aliases}:
        assert replayed(new) == ([], model)
