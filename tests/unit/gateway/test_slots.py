"""A replica's slots: the catalog's ``slots``, else its engine's own flag in the profile's
args, else not known (never full); the sim engine says its slots as llama.cpp does."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from agent.sim import create_app
from catalog.definition.parse import parse_model
from catalog.errors import CatalogError
from gateway.engineslots import total_slots
from gateway.stages.queue import free_slots, open_replicas
from gateway.stages.routing import Load
from gateway.stages.slotshare import Members, deal
from gateway.table import build, slots_of


def model(**profile: Any) -> Any:
    return parse_model(
        {
            "name": "tiny",
            "source": "org/tiny",
            "profiles": [{"name": "p", "gpu_class": "a100", **profile}],
        }
    )


def ready(m: Any, n: int = 2) -> list[dict[str, Any]]:
    return [
        {
            "model": "tiny",
            "replica": i,
            "state": "ready",
            "endpoint": f"http://h:{i}",
            "profile": "p",
        }
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("profile", "slots"),
    [
        ({"engine": "vllm", "args": ["--max-num-seqs", "8"]}, 8),
        ({"args": ["--max-num-seqs=16"]}, 16),  # vllm, the default engine
        ({"engine": "llamacpp", "gpu_class": "", "args": ["--parallel", "4"]}, 4),
        ({"engine": "llamacpp", "gpu_class": "", "args": ["-np", "2"]}, 2),
        ({"engine": "sim", "args": ["--slots", "3"]}, 3),
        ({"engine": "sim", "args": ["--slots", "3"], "slots": 5}, 5),  # the field wins
        ({"engine": "vllm", "args": ["--slots", "3"]}, 0),  # not vLLM's flag
        ({"engine": "vllm", "args": ["--max-num-seqs"]}, 0),  # no value
        ({"engine": "vllm", "args": ["--max-num-seqs", "lots"]}, 0),
        ({"engine": "vllm"}, 0),  # not said: never full
    ],
)
def test_a_replicas_slots_come_from_the_profile_field_or_its_engines_flag(
    profile: dict[str, Any], slots: int
) -> None:
    m = model(**profile)
    table = build([m], ready(m), 1)
    assert [r.slots for r in table.ready["tiny"]] == [slots, slots]
    # Only a model with known slots may queue: the others skip the queue's check whole.
    assert table.slotted == (frozenset({"tiny"}) if slots else frozenset())


def test_slots_in_the_catalog_are_validated_with_the_field_named() -> None:
    for bad, words in ((-1, "negative"), (1 << 20, "more than")):
        with pytest.raises(CatalogError) as caught:
            model(slots=bad)
        assert caught.value.field == "slots"
        assert words in str(caught.value)


def test_a_replica_is_full_at_its_deal_of_its_slots_and_one_without_slots_never_is() -> None:
    m = model(engine="sim", args=["--slots", "2"])
    table = build([m], ready(m), 1)
    a, b = table.ready["tiny"]
    loads = {a.key: Load(inflight=2), b.key: Load(inflight=1)}
    alone = deal(table.ready, Members())
    assert open_replicas([a, b], loads, alone) == [b]
    assert free_slots([a, b], loads, alone) == 1
    # Two gateways in front of them: one slot of each replica each.
    assert (
        deal(table.ready, Members(2, 0))
        == deal(table.ready, Members(2, 1))
        == {
            a.key: 1,
            b.key: 1,
        }
    )
    assert open_replicas([a, b], loads, deal(table.ready, Members(2, 1))) == []
    # A fixed share (slot_share) as before: at least one.
    assert deal(table.ready, Members(), share=0.25) == {a.key: 1, b.key: 1}
    unknown = build([model()], ready(model()), 1)
    busy = {r.key: Load(inflight=10_000) for r in unknown.ready["tiny"]}
    dealt = deal(unknown.ready, Members(2, 1))
    assert dealt == {}
    assert open_replicas(unknown.ready["tiny"], busy, dealt) == list(unknown.ready["tiny"])


def test_the_sim_engine_says_its_slots_as_llamacpp_does() -> None:
    with TestClient(create_app("tiny", slots=3)) as client:
        assert client.get("/props").json()["total_slots"] == 3
    assert slots_of("sim", ["--slots", "3"]) == 3


def test_what_a_llamacpp_engine_says_on_props_wins_over_its_args_and_the_field_over_both() -> None:
    said = {("tiny/0", "http://h:0"): 6}  # replica 0's engine said total_slots 6
    m = model(engine="llamacpp", gpu_class="", args=["--parallel", "4"])
    table = build([m], ready(m), 1, said)
    assert [(r.slots, r.slots_source) for r in table.ready["tiny"]] == [
        (6, "engine"),
        (4, "args"),  # not asked yet, or never answered: its args are in force
    ]
    # Both are asked (a profile without ``slots``), by replica key and endpoint: a
    # replica that moves to another endpoint is asked again.
    assert table.ask_props == {("tiny/0", "http://h:0"), ("tiny/1", "http://h:1")}
    assert build([m], ready(m), 1, {("tiny/0", "http://h:9"): 6}).ready["tiny"][0].slots == 4
    # No --parallel at all: only the engine can say (llama.cpp then chose its own count).
    bare = model(engine="llamacpp", gpu_class="")
    assert [r.slots for r in build([bare], ready(bare), 1, said).ready["tiny"]] == [6, 0]
    # The profile's field is the operator's word: no engine is asked, none overrides it.
    fixed = model(engine="llamacpp", gpu_class="", args=["--parallel", "4"], slots=2)
    table = build([fixed], ready(fixed), 1, said)
    assert [(r.slots, r.slots_source) for r in table.ready["tiny"]] == [(2, "profile")] * 2
    assert table.ask_props == frozenset()
    # vLLM and the sim are not asked (the sim's /props says its --slots, as its args do).
    for other in (model(engine="vllm", args=["--max-num-seqs", "8"]), model(engine="sim")):
        assert build([other], ready(other), 1, said).ask_props == frozenset()


@pytest.mark.parametrize(
    ("body", "slots"),
    [
        ({"total_slots": 4, "default_generation_settings": {"n_ctx": 512}}, 4),
        ({"total_slots": 0}, 0),  # the sim with no limit
        ({"total_slots": -1}, 0),
        ({"total_slots": 1 << 20}, 0),  # beyond any engine: not believed
        ({"total_slots": True}, 0),
        ({"total_slots": "4"}, 0),
        ({"total_slots": 4.0}, 0),
        ({}, 0),
        ([4], 0),
        (None, 0),
    ],
)
def test_an_engines_total_slots_is_read_only_as_a_whole_number_in_bounds(
    body: Any, slots: int
) -> None:
    assert total_slots(body) == slots
