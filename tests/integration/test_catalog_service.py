"""Adding and removing models through the log, on both back ends."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, update

from catalog import Catalog, CatalogError
from events.catalog_service import CatalogService
from events.database.tables import EventRow
from events.read.replay import replay
from events.storage.backends import open_log
from events.write.commands import KeyReused
from tests.support import definition, insert_raw_event, model

CONFIG = "deploy/catalog.yaml"


@pytest.fixture
def declared() -> Catalog:
    return Catalog.build(
        [model("llama-70b", aliases=["llama"]), model("qwen-7b", fallbacks=["llama"])]
    )


@pytest.fixture
def service(engine: Engine, declared: Catalog) -> CatalogService:
    return CatalogService(open_log(engine), declared, CONFIG)


def test_an_added_model_is_in_the_catalog_and_outlives_a_restart(
    service: CatalogService, engine: Engine, declared: Catalog
) -> None:
    service.add([model("trial", aliases=["t"])], actor="alice", reason="try it")
    assert service.catalog().resolve("t") is not None
    restarted = CatalogService(open_log(engine), declared, CONFIG)
    catalog = restarted.catalog()
    assert catalog.names() == ["llama-70b", "qwen-7b", "trial"]
    assert not catalog.is_declared("trial")
    assert catalog.is_declared("llama")


def test_a_runtime_model_colliding_with_a_declared_alias_is_refused_and_not_written(
    service: CatalogService,
) -> None:
    with pytest.raises(CatalogError, match=f"declared model 'llama-70b' in {CONFIG}"):
        service.add([model("llama")])
    assert service.store.head() == 0


def test_a_declared_model_cannot_be_removed_and_the_error_says_where_to_edit(
    service: CatalogService,
) -> None:
    with pytest.raises(CatalogError) as caught:
        service.remove("qwen-7b")
    assert f"Remove it from {CONFIG} instead" in str(caught.value)
    assert caught.value.model == "qwen-7b"
    assert service.store.head() == 0


def test_an_add_with_a_missing_fallback_is_refused_before_anything_is_written(
    service: CatalogService,
) -> None:
    with pytest.raises(CatalogError, match="fallback 'nope' is not in the catalog"):
        service.add([model("trial", fallbacks=["nope"])])
    assert service.store.head() == 0


def test_a_list_is_added_all_or_nothing(service: CatalogService) -> None:
    with pytest.raises(CatalogError, match="qwen-7b"):
        service.add([model("fine"), model("qwen-7b")])
    assert service.store.head() == 0
    result = service.add([model("b", fallbacks=["a"]), model("a")])
    # Recorded in an order that replays one event at a time.
    assert [e.model for e in result.events] == ["a", "b"]
    assert service.catalog().names() == ["a", "b", "llama-70b", "qwen-7b"]


def test_removal_is_refused_while_a_fallback_points_at_it(service: CatalogService) -> None:
    service.add([model("base"), model("child-1", fallbacks=["base"])])
    service.add([model("child-2", fallbacks=["base"])])
    with pytest.raises(CatalogError, match="'child-1', 'child-2' fall back to it"):
        service.remove("base")
    head = service.store.head()
    service.remove("child-1")
    service.remove("child-2")
    service.remove("base")
    assert service.store.head() == head + 3
    assert "base" not in service.catalog()


def test_a_retried_command_with_the_same_key_is_recorded_once(service: CatalogService) -> None:
    first = service.add([model("trial")], key="req-42")
    again = service.add([model("trial")], key="req-42")
    assert again.already_recorded
    assert again.positions == first.positions == [1]
    removed = service.remove("trial", key="rm-1")
    assert service.remove("trial", key="rm-1").positions == removed.positions
    assert service.store.head() == 2


def test_a_key_reused_for_a_different_change_is_refused(service: CatalogService) -> None:
    service.add([model("trial")], key="req-42")
    with pytest.raises(KeyReused, match="req-42"):
        service.add([model("other")], key="req-42")
    with pytest.raises(KeyReused):
        service.remove("trial", key="req-42")
    assert service.store.head() == 1


def test_a_stale_service_catches_up_and_revalidates_before_appending(
    engine: Engine, declared: Catalog
) -> None:
    alice = CatalogService(open_log(engine), declared, CONFIG)
    bob = CatalogService(open_log(engine), declared, CONFIG)
    alice.catalog()
    bob.catalog()
    alice.add([model("trial")])
    # Bob validated against position 0; the append notices and re-validates.
    with pytest.raises(CatalogError, match="already in the catalog"):
        bob.add([model("trial")])
    result = bob.add([model("other")])
    assert result.positions == [2]
    assert result.attempts == 1


def test_replay_skips_and_names_every_kind_of_bad_event(engine: Engine, declared: Catalog) -> None:
    store = open_log(engine)
    good = definition("good")
    bad_rows: dict[int, tuple[str, str | dict[str, Any] | list[Any], int]] = {
        1: ("model.added", "{not json", 1),
        2: ("model.renamed", {"name": "x"}, 1),
        3: ("model.added", {"model": definition("future")}, 99),
        4: ("model.added", {"model": {"name": "broken", "source": "x", "profiles": []}}, 1),
        5: ("model.added", {"model": definition("llama")}, 1),  # collides with a declared alias
        6: ("model.added", {"model": definition("orphan", fallbacks=["missing"])}, 1),
        7: ("model.removed", {"name": "absent"}, 1),
        8: ("model.removed", {"name": "qwen-7b"}, 1),
        9: ("model.added", {"model": good}, 1),
        10: ("model.added", [1, 2], 1),
    }
    ids = {}
    for position, (type_, payload, version) in bad_rows.items():
        ids[position] = insert_raw_event(
            engine, position, type=type_, payload=payload, schema_version=version
        )
    result = replay(declared, store.read(), CONFIG)
    assert result.applied == (9,)
    reasons = {s.position: s.reason for s in result.skipped}
    assert [s.position for s in result.skipped] == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert all(s.event_id == ids[s.position] for s in result.skipped)
    assert "not valid JSON" in reasons[1]
    assert "unknown event type 'model.renamed'" in reasons[2]
    assert "schema_version 99" in reasons[3]
    assert "at least one profile" in reasons[4]
    assert "declared model 'llama-70b'" in reasons[5]
    assert "fallback 'missing'" in reasons[6]
    assert "'absent' is not in the catalog" in reasons[7]
    assert "cannot be removed at runtime" in reasons[8]
    assert "not a JSON object" in reasons[10]
    assert result.catalog.names() == ["good", "llama-70b", "qwen-7b"]


def test_a_model_declared_after_it_was_added_at_runtime_wins_on_replay(
    engine: Engine,
) -> None:
    store = open_log(engine)
    before = CatalogService(store, Catalog.build([model("base")]), CONFIG)
    before.add([model("trial", gpu_class="T4")])
    # The trial went well: it is now declared, reviewed, on A100s.
    after = Catalog.build([model("base"), model("trial", gpu_class="A100")])
    result = replay(after, store.read(), CONFIG)
    assert [s.position for s in result.skipped] == [1]
    assert "configuration wins" in result.skipped[0].reason
    trial = result.catalog.resolve("trial")
    assert trial is not None and trial.profiles[0].gpu_class == "A100"
    assert result.catalog.is_declared("trial")


def test_a_key_reused_for_the_same_model_with_another_definition_is_refused(
    service: CatalogService,
) -> None:
    service.add([model("trial")], key="req-43")
    with pytest.raises(KeyReused, match="not the one recorded then"):
        service.add([model("trial", source="org/elsewhere")], key="req-43")
    with pytest.raises(KeyReused):
        service.add([model("trial", tp=2)], key="req-43")
    trial = service.catalog().resolve("trial")
    assert trial is not None and trial.source == "org/trial"
    spelled_out = [{"name": "main", "gpu_class": "A100", "tp": 1, "engine": "vllm"}]
    again = service.add([model("trial", profiles=spelled_out)], key="req-43")
    assert again.already_recorded and again.positions == [1]


@pytest.mark.parametrize("command", ["add", "apply"])
def test_a_key_whose_recorded_event_is_nested_past_the_parser_is_refused_not_an_error(
    engine: Engine, declared: Catalog, command: str
) -> None:
    """A retry with a key whose recorded event's payload was damaged (JSON nested deeper
    than Python's parser goes, written straight into the database) cannot be compared:
    refused as a different change (409, naming the key), never a RecursionError (500)."""
    service = CatalogService(open_log(engine), declared, CONFIG)
    send = (
        (lambda: service.add([model("trial")], key="k-deep"))
        if command == "add"
        else (lambda: service.apply(model("trial"), key="k-deep"))
    )
    send()
    with engine.begin() as conn:
        conn.execute(update(EventRow).values(payload="[" * 100_000))
    with pytest.raises(KeyReused, match="'k-deep' was already used for a different change"):
        send()
