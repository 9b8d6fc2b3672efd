"""The allowance client against a control plane whose answer is hostile or broken: the
call fails (the holdings kept, the next server tried), and the client's loop goes on."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from catalog.forms.client_limits import ClientLimits
from catalog.forms.servers import ServerList
from gateway.allowance import PATH, AllowanceClient
from gateway.stages.quota import Quotas
from tests.unit.gateway.local_app import served


async def _exchange_against(body: bytes) -> tuple[bool, bool]:
    """One exchange of a gateway holding a limited client against a control plane that
    answers ``body``; whether it succeeded, and whether the call was made at all."""
    calls: list[int] = []

    async def allowances(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        return web.Response(status=200, body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post(PATH, allowances)
    async with served(app) as url, aiohttp.ClientSession() as session:
        quotas = Quotas(shared=True, gateway="gw-0")
        client = AllowanceClient(quotas, ServerList([url]), session)
        quotas.prepare([("app", ClientLimits(tpm=10_000))], 0.0)
        ok = await client.exchange()
    return ok, bool(calls)


def test_an_answer_nested_too_deep_is_a_failed_call_not_the_end_of_the_client() -> None:
    # Attack: a control plane (or anything at its address) answers the allowance call
    # with JSON nested past the parser's depth. json.loads raised RecursionError, which
    # left the allowance task for good: no holding was renewed again, and once spent,
    # every limited client was refused 503 allowance_not_renewed until a restart.
    ok, called = asyncio.run(_exchange_against(b"[" * 100_000 + b"]" * 100_000))
    assert called
    assert ok is False


def test_an_answer_that_is_not_json_is_a_failed_call() -> None:
    ok, called = asyncio.run(_exchange_against(b"<html>a proxy's page</html>"))
    assert called and ok is False
