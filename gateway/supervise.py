"""The gateway's background loops, started again when one fails.

Each background loop (the follower, the signals, the engines' slots and load, the
allowance client, the usage flusher) catches what it expects: a control plane or an
engine that does not answer, or answers nonsense. What it does not expect (a defect, or
an input no review thought of) ended its task for good before, silently: the gateway
kept serving with that loop's state frozen. Several hostile reviews found such inputs
(an answer nested past the parser's depth, counts adding up past a float) and each was
fixed where it was found; this is the net under the ones not found yet. A failed loop is
logged (``gateway.task_failed``, with its traceback) and started again after a pause that
doubles to ``MAX_PAUSE_S`` while it keeps failing, so a loop that fails at once every
time costs a line and a traceback every half minute, not a busy loop. Each loop's state
lives on its object, not in the coroutine, so a new ``run()`` goes on from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("llmgw.gateway")

FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
# A loop that ran this long before failing starts again after the first pause.
HEALTHY_S = 60.0


async def supervised(
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    first_pause_s: float = FIRST_PAUSE_S,
    max_pause_s: float = MAX_PAUSE_S,
) -> None:
    """Await ``run()`` until it returns or is cancelled; start it again after it raises."""
    loop = asyncio.get_running_loop()
    pause = first_pause_s
    while True:
        started = loop.time()
        try:
            await run()
            return  # it ended on its own (the allowance client without a control plane's)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if loop.time() - started >= HEALTHY_S:
                pause = first_pause_s
            log.error(
                "gateway.task_failed",
                task=name,
                error=repr(exc)[:300],
                restart_in_s=pause,
                exc_info=True,
            )
        await asyncio.sleep(pause)
        pause = min(pause * 2, max_pause_s)
