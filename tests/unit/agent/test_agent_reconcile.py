"""The agent's reconcile: what it starts and stops, and which cards it gives."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from agent.engines import Launch
from agent.placements import Key, Want
from agent.reconcile import Backoff, Decision, Have, Start, Stop, decide

NOW = 1_000_000.0


def want(model: str, replica: int = 0, gpus: int = 1, **kw: object) -> Want:
    launch = Launch(engine="sim", profile="p", model_path="m", served_model_name=model)
    fields: dict[str, object] = {
        "key": Key(model, replica),
        "gpus": gpus,
        "launch": launch,
        "fingerprint": "f1",
        **kw,
    }
    return Want(**fields)  # type: ignore[arg-type]


def have(model: str, replica: int = 0, devices: tuple[int, ...] = (0,), **kw: object) -> Have:
    fields: dict[str, object] = {
        "key": Key(model, replica),
        "fingerprint": "f1",
        "devices": devices,
        "alive": True,
        **kw,
    }
    return Have(**fields)  # type: ignore[arg-type]


def test_a_placed_replica_is_started_on_the_lowest_free_cards() -> None:
    wants = [want("a", gpus=2), want("b", gpus=1), want("c")]
    d = decide(wants, [have("c", devices=(0,))], [0, 1, 2, 3], NOW)
    assert [(s.want.key.model, s.devices) for s in d.starts] == [("a", (1, 2)), ("b", (3,))]
    assert d.stops == ()


def test_an_engine_no_longer_placed_here_is_stopped() -> None:
    d = decide([], [have("c", devices=(0,))], [0, 1], NOW)
    assert d.stops == (Stop(Key("c", 0), "no longer placed on this node"),)


def test_a_held_engine_no_longer_placed_is_kept_with_its_cards_and_a_dead_one_is_not() -> None:
    # Back from a time away: the control plane may place it here again (agent.runtime).
    d = decide(
        [want("new", gpus=1)],
        [have("c", devices=(0,)), have("gone", 1, devices=(1,), alive=False)],
        [0, 1],
        NOW,
        hold={Key("c", 0), Key("gone", 1)},
    )
    assert d.held == (Key("c", 0),)
    assert d.stops == (Stop(Key("gone", 1), "no longer placed on this node"),)
    assert [s.devices for s in d.starts] == [(1,)]  # card 0 stays the held engine's


def test_the_cards_of_a_stopped_engine_go_to_its_successor_in_the_same_tick() -> None:
    d = decide([want("new", gpus=2)], [have("old", devices=(0, 1))], [0, 1], NOW)
    assert [s.key for s in d.stops] == [Key("old", 0)]
    assert d.starts[0].devices == (0, 1)


def test_a_running_engine_is_left_alone() -> None:
    assert decide([want("a")], [have("a")], [0], NOW) == Decision()


def test_an_engine_whose_profile_changed_is_restarted_with_the_new_one() -> None:
    d = decide([want("a", fingerprint="f2")], [have("a", devices=(1,))], [0, 1], NOW)
    assert [s.key for s in d.stops] == [Key("a", 0)]
    assert [(s.want.fingerprint, s.devices) for s in d.starts] == [("f2", (0,))]


def test_a_slot_given_to_a_new_version_stops_the_old_engine_for_it_and_says_so() -> None:
    """A pinned control plane never changes what a placement runs; a changed engine view in
    a slot is a new replica there (the old one was removed and the agent saw both at once)."""
    d = decide(
        [want("a", fingerprint="f2", version="v2" * 8)],
        [have("a", devices=(1,), version="v1" * 8)],
        [0, 1],
        NOW,
    )
    (stop,) = d.stops
    assert "its slot now holds a new replica (version v2v2" in stop.reason
    assert "restart" not in stop.reason
    assert [s.want.version for s in d.starts] == ["v2" * 8]


def test_a_pinned_placement_whose_version_is_unchanged_is_left_running() -> None:
    """A legacy placement pinned in place ("" -> v1) runs the same engine view: nothing to do."""
    running = have("a", version="")
    assert decide([want("a", version="v1")], [running], [0], NOW) == Decision()


def test_without_versions_a_changed_profile_says_it_is_an_older_control_plane() -> None:
    d = decide([want("a", fingerprint="f2")], [have("a")], [0, 1], NOW)
    assert "without pinned versions" in d.stops[0].reason


def test_a_replica_without_enough_free_cards_waits_and_says_why() -> None:
    d = decide([want("a", gpus=3), want("b")], [have("b", devices=(0,))], [0, 1, 2], NOW)
    assert d.starts == ()
    assert d.waits[0].key == Key("a", 0)
    assert "waiting for 3 free GPU(s): 2 of the node's 3 are free" in d.waits[0].message


def test_a_cpu_replica_needs_no_card() -> None:
    d = decide([want("cpu", gpus=0)], [], [], NOW)
    assert d.starts == (Start(want("cpu", gpus=0), ()),)


def test_a_failed_engine_is_restarted_only_after_its_backoff_doubling_each_time() -> None:
    backoff = Backoff(first_s=10, max_s=300)
    failed = have("a", alive=False, exited_at=NOW, restarts=2)  # third failure: 40 s
    assert decide([want("a")], [failed], [0], NOW + 39, backoff).starts == ()
    (start,) = decide([want("a")], [failed], [0], NOW + 40, backoff).starts
    assert start.restarts == 3
    assert backoff.delay(10) == 300


def test_a_replica_the_control_plane_marked_failed_is_not_restarted_here() -> None:
    failed = have("a", alive=False, exited_at=NOW)
    assert decide([want("a", server_state="failed")], [failed], [0], NOW + 3600) == Decision()


def test_a_failed_engine_no_longer_placed_is_forgotten() -> None:
    d = decide([], [have("a", alive=False, exited_at=NOW)], [0], NOW)
    assert [s.key for s in d.stops] == [Key("a", 0)]


def test_a_worker_of_a_multi_node_replica_waits_for_its_head_to_report_where_it_listens() -> None:
    worker = want("gang", rank=1, nnodes=2, head="n1")
    (wait,) = decide([worker], [], [0], NOW).waits
    assert wait.message == (
        "waiting for node n1, the head of this 2-node replica, to report where it listens"
    )
    found = want("gang", rank=1, nnodes=2, head="n1", head_endpoint="http://10.0.0.1:8000")
    (start,) = decide([found], [], [0], NOW).starts
    assert start.want.rank == 1 and start.devices == (0,)


def test_a_replica_whose_model_left_the_catalog_is_neither_started_nor_stopped() -> None:
    assert decide([want("gone", launch=None)], [have("gone")], [0], NOW) == Decision()
    assert decide([want("gone", launch=None)], [], [0], NOW) == Decision()


MODELS = st.sampled_from(["a", "b", "c", "d"])
WANTS = st.lists(
    st.builds(
        want,
        MODELS,
        st.integers(0, 2),
        gpus=st.integers(0, 3),
        fingerprint=st.sampled_from(["f1", "f2"]),
        rank=st.integers(0, 2),
        nnodes=st.just(3),
        head_endpoint=st.sampled_from([None, "http://10.0.0.1:8000"]),
    ),
    max_size=8,
    unique_by=lambda w: w.key,  # as parse_placements gives them
)
HAVES = st.lists(
    st.builds(
        have,
        MODELS,
        st.integers(0, 2),
        devices=st.lists(st.integers(0, 7), max_size=3, unique=True).map(tuple),
        alive=st.booleans(),
        exited_at=st.sampled_from([None, NOW - 5, NOW - 1000]),
        restarts=st.integers(0, 3),
    ),
    max_size=6,
    unique_by=lambda h: h.key,
)
DEVICES = st.integers(0, 8).map(lambda n: list(range(n)))


def _alive_devices(haves: list[Have], stopped: set[Key]) -> list[int]:
    return [d for h in haves if h.alive and h.key not in stopped for d in h.devices]


@given(WANTS, HAVES, DEVICES)
def test_no_card_is_ever_given_twice_nor_one_the_node_lacks(
    wants: list[Want], haves: list[Have], devices: list[int]
) -> None:
    d = decide(wants, haves, devices, NOW)
    stopped = {s.key for s in d.stops}
    given_now = [x for s in d.starts for x in s.devices]
    assert set(given_now) <= set(devices)
    assert not set(given_now) & set(_alive_devices(haves, stopped))
    assert all(n == 1 for n in Counter(given_now).values())
    assert all(len(s.devices) == s.want.gpus for s in d.starts)


@given(WANTS, HAVES, DEVICES)
def test_every_replica_placed_here_is_running_starting_waiting_or_backing_off(
    wants: list[Want], haves: list[Have], devices: list[int]
) -> None:
    d = decide(wants, haves, devices, NOW)
    held = {h.key: h for h in haves}
    stopped = {s.key for s in d.stops}
    started = {s.want.key for s in d.starts}
    waiting = {w.key for w in d.waits}
    last = {w.key: w for w in wants}
    for key, w in last.items():
        if w.worker and w.head_endpoint is None:
            assert key in waiting and key not in started  # nothing to join yet
        h = held.get(key) if key not in stopped else None
        running = h is not None and h.alive
        backing_off = h is not None and not h.alive
        assert running or backing_off or key in started | waiting, key
    # Nothing runs here that is not placed here.
    assert {k for k in held if k not in last} <= stopped


@given(WANTS, HAVES, DEVICES)
def test_the_same_state_gives_the_same_decision(
    wants: list[Want], haves: list[Have], devices: list[int]
) -> None:
    assert decide(wants, haves, devices, NOW) == decide(
        list(reversed(wants)), list(reversed(haves)), devices, NOW
    )
