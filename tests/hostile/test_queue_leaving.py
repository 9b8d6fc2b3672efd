"""A client that leaves while it waits in a full model's queue: its task is cancelled
(the gateway watches the connection), which cancels its waiter's future at once, and
its own clean-up (taking it out of the queue) runs only at the loop's next turn. A
request arriving in between must not trip over it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from catalog.forms.priority import BATCH, CRITICAL
from gateway.proxy import Call, Proxy, Trace
from gateway.settings import GatewaySettings
from gateway.stages import admission
from gateway.stages.admission import Refusal
from gateway.stages.queue import Bounds, ModelQueue, Waiter
from gateway.state import State
from gateway.table import build
from gateway.upstream import Upstream
from tests.unit.gateway.test_admission_routing import model


def test_a_waiter_cancelled_and_not_yet_cleaned_up_is_displaced_without_a_500() -> None:
    async def main() -> None:
        state = State("gw-test")
        entry = model("chat")
        state.install(build([entry], [], 1))
        settings = GatewaySettings(server="http://cp", token="t", queue_max_length=1)
        upstream = Upstream(2, 5, 1)
        proxy = Proxy(state, upstream, settings)
        try:
            m = state.table.resolve("chat")
            assert m is not None
            q = state.queues["chat"] = ModelQueue("chat", Bounds(max_length=1))
            # A batch waiter whose client left: its future cancelled by the task's
            # cancellation, its clean-up not run yet.
            gone = Waiter("mallory", BATCH, 1.0, time.monotonic(), time.monotonic() + 60)
            gone.ticket = asyncio.get_running_loop().create_future()
            q.push(gone)
            gone.ticket.cancel()
            req = admission.parse_request(
                {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}, "chat"
            )
            trace = Trace("r1", "alice", time.monotonic(), priority_class=CRITICAL)

            async def send(_: dict[str, Any]) -> None:
                return None

            call = Call(req, {}, b"", None, send, trace, queue_wait_s=0.05)
            # A critical request displaces it (the newest of the lowest class): set an
            # exception on a cancelled future raised InvalidStateError, a 500.
            with pytest.raises(Refusal) as refused:
                await proxy._wait(call, m, q, None)
            assert refused.value.code == "queue_timeout"
            assert q.length == 0
        finally:
            await upstream.close()

    asyncio.run(main())
