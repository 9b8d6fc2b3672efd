"""gateway.stages.slotshare: each replica's slots dealt among the live gateways, exactly."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from gateway.signals import Signals
from gateway.stages.slotshare import Members, deal, members_of
from gateway.state import State
from gateway.table import Replica
from tests.unit.gateway.local_app import served


def replicas(*slots: int, model: str = "m") -> dict[str, tuple[Replica, ...]]:
    return {
        model: tuple(
            Replica(f"{model}/{i}", model, f"http://h:{i}", 1.0, "p", slots=s)
            for i, s in enumerate(slots)
        )
    }


def deals(ready: dict[str, tuple[Replica, ...]], count: int) -> list[dict[str, int]]:
    return [deal(ready, Members(count, i)) for i in range(count)]


def test_two_gateways_take_a_1_slot_replica_each_and_split_3_slot_ones_2_and_1() -> None:
    # With --slot-share 0.5 both took both 1-slot replicas (2x their slots), and one
    # slot of each 3-slot replica went to nobody.
    one, two = deals(replicas(1, 1), 2)
    assert sorted([one, two], key=lambda d: d["m/0"]) == [
        {"m/0": 0, "m/1": 1},
        {"m/0": 1, "m/1": 0},
    ]
    one, two = deals(replicas(3, 3), 2)
    assert {one["m/0"] + two["m/0"], one["m/1"] + two["m/1"]} == {3}
    assert sum(one.values()) == sum(two.values()) == 3


@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=6),
    st.integers(1, 12),
    st.sampled_from(["m", "chat", "qwen-7b"]),
)
def test_the_deals_add_up_to_every_replicas_slots_and_differ_by_at_most_one(
    slots: list[int], count: int, model: str
) -> None:
    ready = replicas(*slots, model=model)
    dealt = deals(ready, count)
    total = sum(slots)
    if total >= count:
        for r in ready[model]:
            parts = [d[r.key] for d in dealt]
            assert sum(parts) == r.slots  # never more than the engine runs, nothing idle
            assert max(parts) - min(parts) <= 1
        per_gateway = [sum(d.values()) for d in dealt]
        assert max(per_gateway) - min(per_gateway) <= 1
    else:  # more gateways than slots: each one at least one, somewhere
        assert all(sum(d.values()) >= 1 for d in dealt)
        for r in ready[model]:
            assert sum(d[r.key] for d in dealt) <= r.slots + (count - total)


def test_a_replica_without_slots_is_dealt_nothing_and_a_fixed_share_is_as_before() -> None:
    ready = replicas(0, 4)
    assert deal(ready, Members(2, 0)) == {"m/1": 2}
    assert deal(ready, Members(2, 0), share=0.5) == {"m/1": 2}
    assert deal(ready, Members(), share=0.5, workers=2) == {"m/1": 1}
    assert deal(replicas(1), Members(), share=0.1) == {"m/0": 1}


def test_the_members_are_the_control_planes_list_with_this_gateway_in_it() -> None:
    assert members_of(["a-w0", "b-w0", "c-w0"], "b-w0") == Members(3, 1)
    assert members_of(["a-w0"], "b-w0") == Members(2, 1)  # not listed yet: itself too
    assert members_of([], "a-w0") == Members(1, 0)
    assert members_of(None, "a-w0") is None  # a control plane before the list
    assert members_of(["a", 3], "a") is None
    assert members_of(["a"], None) is None


async def _post_once(answer: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Members:
    """The members a gateway of two knows after one post the control plane answers so."""
    app = web.Application()
    app.router.add_post("/v1/signals", answer)
    state = State("gw")
    state.members = Members(2, 1)
    async with served(app) as url:
        signals = Signals(state, url, "tok", 5.0)
        try:
            await signals.post_once()
        finally:
            await signals.close()
    return state.members


def test_the_control_planes_answer_that_comes_in_parts_is_read_whole() -> None:
    """On main only the answer's first part was read: not JSON, so the members known
    stayed, however many gateways were live."""
    answer = b'{"gateway": "b-w0", "gateways": ["a-w0", "b-w0", "c-w0"]}'

    async def post(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=202)
        await resp.prepare(request)
        await resp.write(answer[:20])
        await asyncio.sleep(0.05)
        await resp.write(answer[20:])
        await resp.write_eof()
        return resp

    assert asyncio.run(_post_once(post)) == Members(3, 1)


def test_a_control_planes_answer_nested_too_deep_leaves_the_members_and_the_loop() -> None:
    """An answer nested past the parser's depth: on main its RecursionError left
    ``post_once`` and ended the signals task for good (no more posts: the control plane
    soon counted this gateway gone, and the autoscaler lost its load)."""

    async def post(request: web.Request) -> web.StreamResponse:
        return web.Response(status=202, body=b"[" * 100_000 + b"]" * 100_000)

    assert asyncio.run(_post_once(post)) == Members(2, 1)
