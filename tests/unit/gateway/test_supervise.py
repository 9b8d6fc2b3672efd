"""A gateway background loop that fails is started again, logged, and never spins:
before, a loop that raised what it did not expect ended for good and the gateway served
on with that loop's state frozen (its engine slots, its allowances, its usage ledger)."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from gateway.supervise import supervised


class Flaky:
    """A loop that fails ``failures`` times, then runs until cancelled or told to end."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.starts: list[float] = []
        self.running = asyncio.Event()
        self.end = asyncio.Event()

    async def run(self) -> None:
        self.starts.append(asyncio.get_running_loop().time())
        if len(self.starts) <= self.failures:
            raise RecursionError("maximum recursion depth exceeded")
        self.running.set()
        await self.end.wait()


def test_a_failing_loop_is_started_again_after_pauses_that_double() -> None:
    async def main() -> None:
        flaky = Flaky(failures=3)
        with capture_logs() as logs:
            task = asyncio.create_task(
                supervised("allowances", flaky.run, first_pause_s=0.05, max_pause_s=0.1)
            )
            await asyncio.wait_for(flaky.running.wait(), 5)
        assert len(flaky.starts) == 4
        gaps = [b - a for a, b in zip(flaky.starts, flaky.starts[1:], strict=False)]
        # 0.05, then doubled to 0.1, then held at the most (0.1).
        assert gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.1
        failed = [e for e in logs if e["event"] == "gateway.task_failed"]
        assert [e["task"] for e in failed] == ["allowances"] * 3
        assert [e["restart_in_s"] for e in failed] == [0.05, 0.1, 0.1]
        assert "RecursionError" in failed[0]["error"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(flaky.starts) == 4  # cancelled: not started again

    asyncio.run(main())


def test_a_loop_that_ends_on_its_own_is_not_started_again() -> None:
    async def main() -> None:
        flaky = Flaky(failures=0)
        task = asyncio.create_task(supervised("allowances", flaky.run, first_pause_s=0.01))
        await asyncio.wait_for(flaky.running.wait(), 5)
        flaky.end.set()
        await asyncio.wait_for(task, 5)
        assert len(flaky.starts) == 1

    asyncio.run(main())
