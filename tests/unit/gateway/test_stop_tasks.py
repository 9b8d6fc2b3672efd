"""A gateway's stop ends its background tasks even when one of them loses a cancellation
(Python 3.11's ``asyncio.wait_for`` can swallow one: bpo-42130), and never hangs on
one that will not end."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from gateway.main import stop_tasks


async def _loses_its_first_cancel(told: list[int]) -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            told.append(1)
            if len(told) >= 2:
                raise
            # As wait_for does when the read it waits on completes in the same turn: the
            # cancellation is gone and the loop goes on reading.


async def _never_ends(released: asyncio.Event) -> None:
    """Swallows every cancellation until the test releases it (so the test can end)."""
    while not released.is_set():
        try:
            await released.wait()
        except asyncio.CancelledError:
            continue


def test_a_task_that_loses_a_cancellation_is_told_again_and_ends() -> None:
    async def scenario() -> tuple[list[asyncio.Task[None]], list[int], bool]:
        told: list[int] = []
        task = asyncio.create_task(_loses_its_first_cancel(told))
        await asyncio.sleep(0)
        left = await stop_tasks([task], within_s=10, again_s=0.05)
        return left, told, task.cancelled()

    left, told, cancelled = asyncio.run(scenario())
    assert left == [] and cancelled and len(told) == 2


def test_a_task_that_never_ends_does_not_hold_the_stop_and_is_named() -> None:
    async def scenario() -> tuple[list[str], float]:
        released = asyncio.Event()
        stubborn = asyncio.create_task(_never_ends(released), name="stubborn")
        quick = asyncio.create_task(asyncio.sleep(3600), name="quick")
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        start = loop.time()
        left = await stop_tasks([stubborn, quick], within_s=0.3, again_s=0.05)
        took = loop.time() - start
        names = [t.get_name() for t in left]
        released.set()
        await stubborn
        return names, took

    with capture_logs() as logs:
        names, took = asyncio.run(scenario())
    assert names == ["stubborn"]
    assert took < 5  # bounded by within_s, not by the task
    assert {
        "event": "gateway.tasks_not_stopped",
        "tasks": ["stubborn"],
        "log_level": "warning",
    } in [{k: e[k] for k in ("event", "tasks", "log_level") if k in e} for e in logs]
