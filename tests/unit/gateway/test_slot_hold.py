"""A request chosen for a replica's cache waits for that replica's slot (a *hold*,
gateway.stages.queue), within the balance bound and the hold's time, with the queue's
class order, fair shares and no-starvation bound kept among the waiters a freed slot
can serve. Pure: no sockets, no clock."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.forms.priority import BATCH, CRITICAL, STANDARD
from gateway.stages.prefix import BALANCE, PrefixTable, prompt_of
from gateway.stages.queue import (
    CLASSES,
    RANK,
    Bounds,
    ModelQueue,
    Waiter,
    holdable,
    is_open,
    rooms,
    servable,
    unreserved,
)
from gateway.stages.routing import Load, choose
from gateway.table import Replica, stable_hash

FAR = 1e9


def replicas(n: int, slots: int = 1) -> list[Replica]:
    return [
        Replica(f"m/{i}", "m", f"http://h:{i}", 1.0, "p", stable_hash(f"m/{i}"), slots=slots)
        for i in range(n)
    ]


def waiter(
    client: str, klass: str = STANDARD, at: float = 0.0, prefer: str | None = None
) -> Waiter:
    w = Waiter(client, klass, 1.0, at, FAR)
    if prefer is not None:
        w.prefer, w.hold_until = prefer, at + 5.0
    return w


def chat(*contents: str) -> dict[str, Any]:
    roles = ["system"] + ["user", "assistant"] * len(contents)
    return {"messages": [{"role": r, "content": c} for r, c in zip(roles, contents, strict=False)]}


def test_the_conversations_replica_is_a_sticky_choice_and_an_unseen_prefix_is_not() -> None:
    rs = replicas(3)
    table = PrefixTable()
    conv = chat("system prompt " * 40, "question one " * 20, "answer one")
    first = prompt_of(conv, "chat")
    assert first is not None
    table.record("m/1", first, 0)
    turn = prompt_of({"messages": [*conv["messages"], {"role": "user", "content": "q2"}]}, "chat")
    unseen = prompt_of(chat("another system " * 40, "another question"), "chat")
    assert turn is not None and unseen is not None
    # Every replica full (one slot, one in flight): the choice is made among all.
    loads = {r.key: Load(inflight=1) for r in rs}
    got = choose("prefix", rs, loads, prompt=turn, prefixes=table)
    assert got is not None and got.replica.key == "m/1" and got.sticky
    got = choose("prefix", rs, loads, prompt=unseen, prefixes=table)
    assert got is not None and not got.sticky
    got = choose("session", rs, loads, session="conversation-7")
    assert got is not None and got.sticky
    got = choose("least-loaded", rs, loads)
    assert got is not None and not got.sticky


def test_a_replica_is_held_for_within_the_balance_bound_counting_its_holders() -> None:
    rs = replicas(3)
    loads = {r.key: Load(inflight=1) for r in rs}  # all full
    holding: dict[str, int] = {}
    held = 0
    while holdable("m/0", rs, loads, holding):
        holding["m/0"] = holding.get("m/0", 0) + 1
        held += 1
        assert held < 100
    # The first BALANCE + 1 hold (the last of them makes it BALANCE + 1 above the others
    # when it joins); the next spills.
    assert held == int(BALANCE) + 1
    # Another replica's holders count as its load: the bound is relative.
    holding["m/1"] = holding["m/2"] = 2
    assert holdable("m/0", rs, loads, holding)
    # A replica already more than the bound above the least loaded in flight: no hold.
    loads = {"m/0": Load(inflight=4), "m/1": Load(inflight=1), "m/2": Load(inflight=1)}
    assert not holdable("m/0", rs, loads, {})


def test_a_holder_is_passed_over_for_another_replicas_slot_and_served_by_its_own() -> None:
    q = ModelQueue("m", Bounds(starvation_s=30.0))
    holder = waiter("a", CRITICAL, at=0.0, prefer="m/0")
    later = waiter("b", BATCH, at=1.0)
    q.push(holder)
    q.push(later)
    assert q.holding() == {"m/0": 1}
    # m/1 frees a slot: the batch request takes it, the critical holder of m/0 waits.
    room = {"m/0": 0.0, "m/1": 1.0}
    got = q.pop(2.0, room)
    assert got is later and got.slot is None
    assert q.pop(2.0, room) is None  # only the holder of a full replica waits
    # m/0 frees one: the holder is granted it, reserved until it takes it.
    room = {"m/0": 1.0, "m/1": 0.0}
    got = q.pop(3.0, room)
    assert got is holder and got.slot == "m/0" and room["m/0"] == 0
    assert q.reserved == {"m/0": 1} and q.holding() == {}
    assert q.holds["m/0"].waited == 1
    q.granted += 1
    q.taken(got)
    assert q.reserved == {} and q.granted == 0


def test_among_the_waiters_a_slot_can_serve_the_class_order_holds() -> None:
    q = ModelQueue("m")
    batch = waiter("b", BATCH, at=0.0, prefer="m/0")
    standard = waiter("s", STANDARD, at=1.0)
    critical = waiter("c", CRITICAL, at=2.0, prefer="m/0")
    for w in (batch, standard, critical):
        q.push(w)
    # A slot on m/0: every waiter can take it; the critical one goes first.
    assert q.pop(3.0, {"m/0": 1.0, "m/1": 0.0}) is critical
    # Then a slot on m/1: the batch holder of m/0 cannot, the standard one goes.
    assert q.pop(3.0, {"m/0": 0.0, "m/1": 1.0}) is standard


def test_a_clients_later_request_is_not_held_behind_its_held_one() -> None:
    q = ModelQueue("m")
    held = waiter("a", at=0.0, prefer="m/0")
    free = waiter("a", at=1.0)
    q.push(held)
    q.push(free)
    assert q.pop(2.0, {"m/0": 0.0, "m/1": 1.0}) is free


def test_a_hold_ends_at_its_time_then_any_slot_serves_it() -> None:
    q = ModelQueue("m")
    w = waiter("a", at=0.0, prefer="m/0")  # holds until 5.0
    q.push(w)
    room = {"m/0": 0.0, "m/1": 1.0}
    assert not servable(w, 4.9, room)
    assert servable(w, 5.0, room)
    got = q.pop(5.0, room)
    assert got is w and got.slot is None and q.holds["m/0"].expired == 1
    # The edge's timer ends a hold too (``release``), counted once.
    w2 = waiter("b", at=0.0, prefer="m/0")
    q.push(w2)
    assert q.release(w2) and not q.release(w2)
    assert w2.prefer is None and q.holding() == {} and q.holds["m/0"].expired == 2
    assert q.pop(1.0, room) is w2
    # Its replica gone from the table (not in ``room``): any slot.
    w3 = waiter("c", at=0.0, prefer="m/9")
    q.push(w3)
    assert q.pop(1.0, room) is w3 and q.holds["m/9"].expired == 1


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(CLASSES), st.sampled_from([None, "m/0", "m/1"])),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.sampled_from(["m/0", "m/1", "m/2"]), min_size=1, max_size=40),
)
def test_slots_freed_anywhere_keep_the_class_order_among_those_they_can_serve(
    waiting: list[tuple[str, str | None]], freed: list[str]
) -> None:
    """Whatever the holds and wherever slots free: each slot goes to a waiter that may
    take it (a holder only on its own replica), of the highest class among those that
    may, and never to a holder of another replica."""
    q = ModelQueue("m", Bounds(starvation_s=FAR))
    for i, (klass, prefer) in enumerate(waiting):
        q.push(waiter(f"c{i % 4}", klass, at=0.0, prefer=prefer))
    for key in freed:
        room = {"m/0": 0.0, "m/1": 0.0, "m/2": 0.0, key: 1.0}
        can = [
            w
            for lines in q.waiting.values()
            for line in lines.values()
            for w in line
            if servable(w, 1.0, room)
        ]
        got = q.pop(1.0, room)
        if not can:
            assert got is None
            continue
        assert got is not None
        assert RANK[got.klass] == min(RANK[w.klass] for w in can)
        assert got.slot in (None, key) and (got.slot is None or got.slot == key)
    assert sum(h.holding for h in q.holds.values()) == sum(
        1 for lines in q.waiting.values() for line in lines.values() for w in line if w.prefer
    )


def test_no_starvation_a_starved_holder_goes_first_to_any_slot() -> None:
    q = ModelQueue("m", Bounds(starvation_s=30.0))
    old = waiter("old", BATCH, at=0.0)
    old.prefer, old.hold_until = "m/0", 30.0  # the edge caps a hold at starvation_s
    q.push(old)
    q.push(waiter("new", CRITICAL, at=29.0))
    room = {"m/0": 0.0, "m/1": 1.0}
    assert q.pop(30.0, room) is old


def test_rooms_and_unreserved_leave_a_holders_reserved_slot_alone() -> None:
    rs = replicas(2, slots=2)
    loads = {"m/0": Load(inflight=1), "m/1": Load(inflight=2)}
    dealt = {"m/0": 2, "m/1": 2}
    assert rooms(rs, loads, dealt, {}) == {"m/0": 1, "m/1": 0}
    assert rooms(rs, loads, dealt, {"m/0": 1}) == {"m/0": 0, "m/1": 0}
    assert [r.key for r in unreserved(rs, loads, dealt, {})] == ["m/0"]
    assert unreserved(rs, loads, dealt, {"m/0": 1}) == []
    assert is_open(rs[0], loads, dealt) and not is_open(rs[1], loads, dealt)


def test_the_holds_of_replicas_gone_are_forgotten_unless_someone_holds() -> None:
    q = ModelQueue("m")
    q.spilled("m/0")
    q.push(waiter("a", prefer="m/1"))
    q.retain(set())
    assert "m/0" not in q.holds and q.holds["m/1"].holding == 1
    assert q.holds["m/1"].view() == {"holding": 1, "waited": 0, "expired": 0, "spilled": 0}
