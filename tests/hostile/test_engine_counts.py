"""A hostile engine's token counts (an engine runs code that came with its model: its
``usage`` can say anything gateway.usage reads, up to 12 digits a count) must not take
the gateway's accounting down for the other tenants: the allowance call it makes for
every limited client, and the usage ledger's flush of every client's counts. Nor may
the pace of its stream cost the gateway's event loop more than its bytes."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from catalog.forms.allowance import MAX_AMOUNT, TOKENS, Granted, parse_draws
from catalog.forms.client_limits import ClientLimits
from events.core.usage import MAX_COUNT, check_usage
from gateway.allowance import call_body
from gateway.proxy import HOLD_BYTES, _FirstContent
from gateway.stages import admission
from gateway.stages import ledger as gateway_ledger
from gateway.stages.ledger import Ledger
from gateway.stages.quota import Quotas
from gateway.upstream import TOKENIZE_MAX_BYTES, Upstream
from tests.unit.gateway.local_app import served_elsewhere

# The most gateway.usage reads of one count (12 digits).
MOST = 10**12 - 1


def _body(q: Quotas, now: float) -> dict[str, object]:
    """The allowance client's call for what ``q`` draws at ``now``."""
    return call_body(q.draws(now, 0.2), q.gateway)


def test_an_engines_counts_do_not_get_every_clients_allowance_call_refused() -> None:
    # A tenant with many requests in flight on a hostile engine, each answered with the
    # largest usage the gateway reads: what its holding owes went past what the control
    # plane takes in a call (MAX_AMOUNT), and the one call carrying every limited
    # client's draws was refused whole (422), every round, for good: every limited
    # client was refused 503 allowance_not_renewed once its holding was spent.
    q = Quotas(shared=True, gateway="gw-1")
    limits = ClientLimits(tpm=1_000_000)
    other = ClientLimits(tpm=1_000_000)
    q.prepare([("mallory", limits), ("alice", other)], 0.0)
    q.granted(
        [
            Granted("mallory", TOKENS, 50_000, 950_000, 1_000_000),
            Granted("alice", TOKENS, 50_000, 950_000, 1_000_000),
        ],
        0.0,
    )
    tickets = [q.admit("mallory", limits, "m", 10, prompt=5, now=1.0) for _ in range(600)]
    for t in tickets:
        q.settle(t, 2 * MOST, 2.0)
    draws = parse_draws(_body(q, 3.0))  # (raised AllowanceError: want above MAX_AMOUNT)
    assert {d.client for d in draws} >= {"mallory"}
    assert all(d.want <= MAX_AMOUNT and d.credit <= MAX_AMOUNT for d in draws)
    # And again at the next round: still a call the control plane takes.
    parse_draws(_body(q, 3.2))


def test_an_engines_counts_do_not_get_every_clients_usage_flush_refused() -> None:
    # A thousand answers in one minute of one (client, model, replica), each with the
    # largest usage the gateway reads: the row's sum went past what the control plane
    # takes (MAX_COUNT), and the flush carrying every client's rows of that tick was
    # refused whole (422, gateway.usage_refused) and dropped: every tenant's usage of
    # it lost from the ledger.
    ledger = Ledger()
    for _ in range(1_001):
        ledger.record(
            "mallory", "m", "m", "r1", "ok", tokens=(MOST, MOST, MOST), estimated=False, now=60.0
        )
    ledger.record("alice", "m", "m", "r2", "ok", tokens=(10, 2, 5), estimated=False, now=60.0)
    rows = ledger.take()
    checked = [check_usage({**row, "gateways": ["gw-1"], "flushes": 1}) for row in rows]
    by = {row.client: row for row in checked}
    assert by["mallory"].prompt_tokens == MAX_COUNT
    assert by["mallory"].requests == 1_001
    assert (by["alice"].prompt_tokens, by["alice"].cached_tokens) == (10, 2)


def test_the_ledgers_bound_is_the_control_planes() -> None:
    assert gateway_ledger.MAX_COUNT == MAX_COUNT


def test_a_first_event_dribbled_in_small_pieces_is_not_scanned_again_and_again() -> None:
    # An engine's stream is held until its first content event (gateway.proxy, up to
    # HOLD_BYTES); an engine that dribbles a first event that never ends, a few bytes a
    # piece, had the whole held buffer scanned again for an event's end on every piece:
    # quadratic, seconds of the event loop's CPU per stream.
    scanner = _FirstContent()
    held = bytearray(b"data: ")
    piece = b"x" * 16
    started = time.process_time()
    while len(held) <= HOLD_BYTES:
        held += piece
        assert not scanner.seen(held)
    spent = time.process_time() - started
    assert spent < 1.0, f"{spent:.2f} s of CPU for {HOLD_BYTES} bytes held"
    # And the event's end, when it comes, is still found (split across two pieces).
    held += b'{"choices":[{"delta":{"content":"hi"}}]}\r\n'
    assert not scanner.seen(held)
    held += b"\r\n"
    assert scanner.seen(held)


def test_a_large_tokenize_answer_is_not_decoded_on_the_event_loop() -> None:
    # A prompt over a model's window by its byte bound is counted by the engine's
    # /tokenize; vLLM answers with every token's id: about 14 MB for the 8 MiB prompt a
    # client token may send, and a hostile engine may send TOKENIZE_MAX_BYTES (16 MiB)
    # of ids. The answer was decoded (and the 16 MiB request encoded) on the event loop:
    # 0.2 to 0.5 s of its CPU for each such request.
    ids = b"0," * ((TOKENIZE_MAX_BYTES - 64) // 2)
    answer = b'{"count": 3, "tokens": [' + ids + b"0]}"
    assert len(answer) <= TOKENIZE_MAX_BYTES

    async def tokenize(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    async def main() -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/tokenize", tokenize)
        upstream = Upstream(2, 30, 60)
        text = "word " * 1_600_000
        req = admission.parse_request(
            {"model": "m", "messages": [{"role": "user", "content": text}]}, admission.CHAT
        )
        try:
            # The engine on a thread of its own: its sending is not the gateway's loop.
            with served_elsewhere(app) as url:
                before = time.thread_time()
                tokens, how = await upstream.count(url, "m", req)
                spent = time.thread_time() - before
        finally:
            await upstream.close()
        assert how == "by the engine's tokenizer"
        assert tokens == 3 + admission.TEMPLATE_TOKENS + admission.TEMPLATE_TOKENS_PER_MESSAGE
        assert spent < 0.1, f"the event loop spent {spent:.2f} s of CPU on /tokenize"

    asyncio.run(main())
