"""A replica's slots: the catalog's ``slots``, else its engine's own flag in the profile's
args, else not known (never full); the sim engine says its slots as llama.cpp does."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from agent.sim import create_app
from catalog.definition.parse import parse_model
from catalog.errors import CatalogError
from gateway.stages.queue import budget, free_slots, open_replicas
from gateway.stages.routing import Load
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


def test_a_replica_is_full_at_its_share_of_its_slots_and_one_without_slots_never_is() -> None:
    m = model(engine="sim", args=["--slots", "2"])
    a, b = build([m], ready(m), 1).ready["tiny"]
    loads = {a.key: Load(inflight=2), b.key: Load(inflight=1)}
    assert open_replicas([a, b], loads, 1.0) == [b]
    assert free_slots([a, b], loads, 1.0) == 1
    # Two gateways in front of them: half the slots each, at least one.
    assert budget(2, 0.5) == 1 and budget(1, 0.25) == 1
    assert open_replicas([a, b], loads, 0.5) == []
    unknown = build([model()], ready(model()), 1).ready["tiny"]
    busy = {r.key: Load(inflight=10_000) for r in unknown}
    assert open_replicas(unknown, busy, 1.0) == list(unknown)


def test_the_sim_engine_says_its_slots_as_llamacpp_does() -> None:
    with TestClient(create_app("tiny", slots=3)) as client:
        assert client.get("/props").json()["total_slots"] == 3
    assert slots_of("sim", ["--slots", "3"]) == 3
