"""A placer's round runs with the cycle collector paused, and resumes it however it ends."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from scheduler.daemon.round_runner import Placer, young_objects_kept


def test_a_round_runs_with_the_collector_paused_and_resumes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(On the old tree the collector ran through the round: full collections of every
    object the process holds landed in the rounds that plan.)"""
    seen: list[bool] = []

    outcome: Any = object()

    def round_(self: Placer, **_: Any) -> Any:
        seen.append(gc.isenabled())
        return outcome

    monkeypatch.setattr(Placer, "_run", round_)
    placer = Placer.__new__(Placer)
    assert gc.isenabled()
    assert placer.run() is outcome
    assert seen == [False]
    assert gc.isenabled()


def test_the_collector_resumes_when_the_round_fails_and_stays_off_if_it_was() -> None:
    with pytest.raises(RuntimeError), young_objects_kept():
        assert not gc.isenabled()
        raise RuntimeError("the round failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with young_objects_kept():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_rounds_cycles_are_collected_at_its_end() -> None:
    """A reference cycle made during the round is reclaimed when it ends, in the round."""
    import weakref

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    with young_objects_kept():
        made = Cycle()
        gone = weakref.ref(made)
        del made
        assert gone() is not None  # paused: nothing reclaims a cycle meanwhile
    assert gone() is None
