"""The usage ledger end to end: a real `llmgw serve`, a real sim agent, a real `llmgw
gateway`, two client tokens and the official OpenAI client.

Every request is answered by the one sim replica, whose own counters
(``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:prefix_cache_hits_total``) say what it served. After the gateway's graceful stop
(SIGTERM) the ledger (`llmgw usage`, ``GET /v1/usage``) equals, exactly, per client and
model, the engine's own usage: for app-1, the ``usage`` of each answer its client saw
(non-streams, and streams that asked for it); for both together, the engine's counters,
which hold app-2's streams whose usage event was cut out for the client. The counts
reach the ledger without a stop too (flushed every second, pending until their minute
is rolled up); the control plane's graceful stop rolls them up into events, the ledger
unchanged, one event per client, model, replica and minute. `llmgw verify` covers the
usage events (an edited one fails it, named), `history` leaves them out unless asked,
`llmgw replay` applies them, and a malformed usage event is skipped and named by
`llmgw usage`, replay and the API, the rest still summed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from sqlalchemy import update

from events.core.types import USAGE_RECORDED, NewEvent
from events.database.connection import make_engine
from events.database.tables import EventRow
from events.storage.backends import open_log
from tests.e2e.agents import eventually
from tests.e2e.cli import Cli
from tests.e2e.gateways import GatewayProc, gateway_cluster
from tests.e2e.test_gateway import ROUNDS, chat

pytestmark = pytest.mark.slow

# Long enough (over two of the sim's 16-word cache blocks) that repeats reuse a prefix:
# the cached tokens are not all zero.
WORDS = "replicas run where the scheduler placed them and the gateway routes to the ready"
LONG: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"{WORDS} " * 4}]
KINDS = ("prompt_tokens", "cached_tokens", "completion_tokens")


def _engine_totals(gw_routing: dict[str, Any]) -> dict[str, int]:
    (replica,) = gw_routing["models"]["chat"]["replicas"]
    text = httpx.get(replica["endpoint"].rstrip("/") + "/metrics", timeout=30).text
    out = {}
    for kind, name in zip(
        KINDS,
        (
            "vllm:prompt_tokens_total",
            "vllm:prefix_cache_hits_total",
            "vllm:generation_tokens_total",
        ),
        strict=True,
    ):
        found = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\d+)$", text, re.M)
        assert found, text
        out[kind] = int(found.group(1))
    return out


def _add(seen: dict[str, int], usage: Any) -> None:
    assert usage is not None
    seen["prompt_tokens"] += usage.prompt_tokens
    seen["completion_tokens"] += usage.completion_tokens
    details = usage.prompt_tokens_details
    seen["cached_tokens"] += details.cached_tokens if details and details.cached_tokens else 0
    seen["requests"] += 1


def _traffic(client: OpenAI, *, plain: int, asked: int, cut: int) -> dict[str, int]:
    """``plain`` whole answers, ``asked`` streams asking for usage and ``cut`` streams not
    asking; the usage the client saw (the first two kinds)."""
    seen = dict.fromkeys((*KINDS, "requests"), 0)
    for i in range(plain):
        answer = client.chat.completions.create(model="chat", messages=LONG, max_tokens=3 + i)
        _add(seen, answer.usage)
    for i in range(asked):
        chunks = list(
            client.chat.completions.create(
                model="chat",
                messages=LONG,
                max_tokens=4 + i,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        _add(seen, chunks[-1].usage)
    for i in range(cut):
        chunks = list(
            client.chat.completions.create(
                model="chat", messages=LONG, max_tokens=2 + i, stream=True
            )
        )
        assert chunks and all(ch.usage is None for ch in chunks)
    return seen


def _pairs(ledger: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(g["client"], g["model"]): g for g in ledger["groups"]}


def test_the_ledger_equals_the_engines_usage_per_client_after_a_graceful_stop(
    tmp_path: Path, sqlite_url: str
) -> None:
    with gateway_cluster(tmp_path, sqlite_url, ["n1"], [chat(1, fallbacks=())], ROUNDS) as (
        c,
        gw,
        tokens,
    ):
        c.agent("n1")
        eventually(lambda: gw.ready("chat", 1), "chat ready at the gateway")
        cli = Cli(tmp_path, sqlite_url)
        app2 = gw.openai(cli.json("token", "new", "app-2", "--role", "client")["token"])
        eventually(lambda: _takes(app2), "the new token taken by the gateway")
        before = _engine_totals(gw.routing())

        app1_seen = _traffic(gw.openai(tokens.client), plain=3, asked=2, cut=0)
        app2_seen = _traffic(app2, plain=1, asked=1, cut=3)
        engine = {k: v - before[k] for k, v in _engine_totals(gw.routing()).items()}
        assert engine["cached_tokens"] > 0  # the prefix reuse is counted too

        # Flushed every second, without a stop: app-1's requests reach the ledger.
        def flushed() -> dict[str, Any] | None:
            found = _pairs(cli.json("usage")).get(("app-1", "chat"))
            return found if found and found["requests"] == app1_seen["requests"] else None

        eventually(flushed, "app-1's usage in the ledger before any stop")

        assert gw.stop() == 0
        assert gw.logs("gateway.usage_flushed"), gw.log_text()
        ledger = cli.json("usage")
        pairs = _pairs(ledger)
        assert set(pairs) == {("app-1", "chat"), ("app-2", "chat")}
        one, two = pairs["app-1", "chat"], pairs["app-2", "chat"]
        for kind in KINDS:
            assert one[kind] == app1_seen[kind], kind
            assert one[kind] + two[kind] == engine[kind], kind
        assert one["requests"] == 5 and two["requests"] == 5
        assert all(two[kind] >= app2_seen[kind] for kind in KINDS)
        assert one["outcomes"] == {"ok": 5} and two["outcomes"] == {"ok": 5}
        assert one["estimated"] == two["estimated"] == 0
        assert (
            ledger["total"]["total_tokens"] == engine["prompt_tokens"] + engine["completion_tokens"]
        )
        assert not ledger["skipped"]

        # The API says the same, to operator and reader tokens, filtered as asked.
        with c.server.client(c.tokens.reader) as http:
            answer = http.get("/v1/usage")
            assert answer.status_code == 200, answer.text
            assert answer.json()["groups"] == ledger["groups"]
            by_client = http.get("/v1/usage", params={"by": "client", "client": "app-2"}).json()
            assert by_client["groups"] == [
                {
                    "client": "app-2",
                    **{k: v for k, v in two.items() if k not in ("client", "model")},
                }
            ]
        # The CLI's filters: the last hour is all of it; one client and model is its row.
        assert cli.json("usage", "--since", "1h")["groups"] == ledger["groups"]
        mine = cli.json("usage", "--client", "app-1", "--model", "chat", "--by", "day")
        assert sum(g["requests"] for g in mine["groups"]) == 5  # (midnight may split it)
        assert cli.json("usage", "--since", "2001-01-01", "--model", "none")["groups"] == []
        # The table for people.
        table = cli("usage", "--by", "model")
        assert table.returncode == 0, table.stderr
        assert re.search(rf"^chat\s+10\s+{engine['prompt_tokens']}\s", table.stdout, re.M)

        # A gateway whose flush interval (60 s) does not come round while it serves: a
        # graceful stop flushes what it counted, exactly; a SIGKILL loses it.
        (tmp_path / "slow.toml").write_text('[gateway]\nusage_flush = "60s"\n')
        stopped = _slow_gateway(tmp_path / "stopped", c.server.url, tokens.gateway_b, c)
        try:
            seen = _traffic(stopped.openai(tokens.client), plain=1, asked=1, cut=0)
        finally:
            assert stopped.stop() == 0
        assert stopped.logs("gateway.usage_flushed"), stopped.log_text()
        grown = _pairs(cli.json("usage"))["app-1", "chat"]
        for kind in (*KINDS, "requests"):
            assert grown[kind] == one[kind] + seen[kind], kind
        killed = _slow_gateway(tmp_path / "killed", c.server.url, tokens.gateway_b, c)
        try:
            assert _traffic(killed.openai(tokens.client), plain=2, asked=0, cut=0)["requests"] == 2
            assert killed.proc is not None
            killed.proc.kill()
            killed.proc.wait(30)
        finally:
            killed.stop()
        after = cli.json("usage")
        assert _pairs(after)["app-1", "chat"] == grown
        assert not killed.logs("gateway.usage_flushed")
        # The flushes of a minute not yet closed (and its grace) are pending rows,
        # counted by the reads all the same (`pending` of `rows`).
        assert after["pending"] <= after["rows"]

        # The control plane's graceful stop rolls every pending row up into the log: the
        # ledger is the same, exactly, now all events (one per client, model, replica
        # and minute, however many flushes of how many gateways).
        assert c.server.stop() == 0
        assert "api.usage_rolled_up" in c.server.log_path.read_text()
        ledger = cli.json("usage")
        assert ledger["groups"] == after["groups"] and ledger["pending"] == 0
        c.server.start()

        # `verify` covers the usage events; `replay` applies them.
        head = cli.json("verify")
        assert head["ok"], head
        listed = cli.json("history", "--type", USAGE_RECORDED)
        assert all(e["reason"].startswith("usage of app-") for e in listed), listed[:2]
        # (app-1, app-2) x the few minutes the test ran, not x its dozens of flushes.
        assert 2 <= len(listed) <= 2 * 4, listed
        usage_positions = [e["position"] for e in listed]
        assert usage_positions and head["head"]["position"] >= usage_positions[-1]
        replayed = cli.json("replay")
        assert set(usage_positions) <= set(replayed["applied"]) and not replayed["skipped"]
        # `history` leaves the usage events out unless asked (`--usage`, `--type`).
        assert not {e["type"] for e in cli.json("history")} & {USAGE_RECORDED}
        assert {e["position"] for e in cli.json("history", "--usage")} >= set(usage_positions)
        with c.server.client(c.tokens.reader) as http:
            page = http.get("/v1/events", params={"newest": 5, "usage": "false"}).json()
            assert page["events"] and USAGE_RECORDED not in {e["type"] for e in page["events"]}
            page = http.get("/v1/events", params={"newest": 1}).json()
            assert [e["position"] for e in page["events"]] == [head["head"]["position"]]

        # A malformed usage event (written through the log: its hash is good) is skipped
        # and named, by the ledger, the API and replay; the rest is still summed.
        log = open_log(make_engine(sqlite_url))
        bad = {**json.loads(_payload(sqlite_url, usage_positions[0])), "cached_tokens": -1}
        appended = log.append(
            [NewEvent(USAGE_RECORDED, "", json.dumps(bad), 2)], expected_head=None, actor="x"
        )
        position = appended.events[0].position
        hostile = cli("usage", "--json")
        assert hostile.returncode == 0, hostile.stderr
        assert f"skipped usage event at position {position}" in hostile.stderr
        assert "usage cached_tokens is not a whole number" in hostile.stderr
        assert json.loads(hostile.stdout)["groups"] == ledger["groups"]
        with c.server.client(c.tokens.reader) as http:
            named = http.get("/v1/usage").json()
        assert named["skipped"][0]["position"] == position and named["skipped_count"] == 1
        skipped = cli.json("replay")["skipped"]
        assert [s["position"] for s in skipped] == [position]

        # An edited usage event fails `verify`, at its position.
        engine_db = make_engine(sqlite_url)
        with engine_db.begin() as conn:
            conn.execute(
                update(EventRow)
                .where(EventRow.position == usage_positions[0])
                .values(
                    payload=_payload(sqlite_url, usage_positions[0]).replace(
                        '"requests":', '"requests": '
                    )
                )
            )
        engine_db.dispose()
        failed = cli("verify")
        assert failed.returncode == 1
        assert f"verify failed at position {usage_positions[0]}" in failed.stderr


def _slow_gateway(workdir: Path, server: str, token: str, c: Any) -> GatewayProc:
    """A gateway flushing every 60 s (the most ``usage_flush`` may be)."""
    workdir.mkdir()
    return GatewayProc(
        workdir, server, token, "--settings", str(workdir.parent / "slow.toml"),
        admin=c.tokens.reader,
    ).start()  # fmt: skip


def _payload(url: str, position: int) -> str:
    from sqlalchemy import select

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return str(
                conn.execute(
                    select(EventRow.payload).where(EventRow.position == position)
                ).scalar_one()
            )
    finally:
        engine.dispose()


def _takes(client: OpenAI) -> bool:
    import openai

    try:
        client.models.list()
    except openai.AuthenticationError:
        return False
    return True
