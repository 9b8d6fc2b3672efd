"""The ``prefix`` profile's pure core: block hashing, the table's LRU bound, the balance
rule, rendezvous agreement and the check against the engine's count. No sockets."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.stages import prefix
from gateway.stages.prefix import BALANCE, BLOCK_CHARS, PrefixTable, prompt_of
from gateway.stages.routing import Load, choose
from gateway.table import Replica, stable_hash


def replicas(n: int) -> list[Replica]:
    return [
        Replica(f"m/{i}", "m", f"http://h:{i}", 1.0, "p", stable_hash(f"m/{i}")) for i in range(n)
    ]


def chat(*contents: str) -> dict[str, Any]:
    roles = ["system"] + ["user", "assistant"] * len(contents)
    return {"messages": [{"role": r, "content": c} for r, c in zip(roles, contents, strict=False)]}


texts = st.text(min_size=0, max_size=3 * BLOCK_CHARS)


@given(st.lists(texts, min_size=1, max_size=6), st.lists(texts, min_size=1, max_size=4))
@settings(max_examples=60, deadline=None)
def test_a_block_matches_only_where_the_whole_prefix_up_to_it_matches(
    head: list[str], tail: list[str]
) -> None:
    a = prompt_of(chat(*head), "chat")
    b = prompt_of(chat(*head, *tail), "chat")
    assert a is not None and b is not None
    # A conversation that resends its history resends the same blocks, in order.
    assert b.blocks[: len(a.blocks)] == a.blocks
    # Any change to an earlier message changes every block from there on.
    changed = prompt_of(chat("x" + head[0], *head[1:], *tail), "chat")
    assert changed is not None and not set(changed.blocks) & set(b.blocks)


def test_blocks_follow_the_messages_and_a_long_text_is_cut_and_bounded() -> None:
    p = prompt_of(chat("s" * (BLOCK_CHARS * 2 + 1), "hello"), "chat")
    assert p is not None and len(p.blocks) == 4  # 3 for the system prompt, 1 for the user's
    huge = prompt_of({"prompt": "y" * BLOCK_CHARS * (prefix.MAX_BLOCKS + 50)}, "completions")
    assert huge is not None and len(huge.blocks) == prefix.MAX_BLOCKS
    assert prompt_of({"prompt": [1, 2, 3]}, "completions") is None
    assert prompt_of({"messages": "no"}, "chat") is None


@given(st.integers(min_value=1, max_value=40), st.integers(min_value=1, max_value=30))
@settings(max_examples=40, deadline=None)
def test_the_table_holds_at_most_its_bound_per_replica_and_forgets_the_oldest(
    bound: int, prompts: int
) -> None:
    table = PrefixTable(per_replica=bound)
    sent = []
    for i in range(prompts):
        p = prompt_of({"prompt": f"{i}-" + "z" * BLOCK_CHARS}, "completions")
        assert p is not None
        sent.append(p)
        table.record("m/0", p, 0)
        assert table.blocks("m/0") <= bound
    r = replicas(1)
    # The most recent prompt is held whole when it fits; the oldest is the first forgotten.
    last = sent[-1]
    if len(last.blocks) <= bound:
        assert table.match(last, r)["m/0"] == len(last.blocks)
    blocks = len(sent[0].blocks)
    if prompts * blocks > bound:
        # Past the bound the oldest goes first, its tail before its head (the head is
        # what a later prompt may share), and all of it once later ones fill the table.
        assert table.match(sent[0], r)["m/0"] < blocks
    if (prompts - 1) * blocks >= bound:
        assert table.match(sent[0], r)["m/0"] == 0


def test_the_longest_cached_prefix_wins_while_the_load_is_within_the_bound() -> None:
    rs = replicas(4)
    table = PrefixTable()
    conv = chat("system prompt " * 40, "question one", "answer one")
    p1 = prompt_of(conv, "chat")
    assert p1 is not None
    table.record("m/2", p1, 0)
    p2 = prompt_of({"messages": [*conv["messages"], {"role": "user", "content": "q2"}]}, "chat")
    assert p2 is not None
    loads = {r.key: Load() for r in rs}
    got = choose("prefix", rs, loads, prompt=p2, prefixes=table)
    assert got is not None and got.replica.key == "m/2" and got.prefix_blocks == len(p1.blocks)
    # Within the bound: still there.
    loads["m/2"].inflight = int(BALANCE)
    got = choose("prefix", rs, loads, prompt=p2, prefixes=table)
    assert got is not None and got.replica.key == "m/2"
    # Past it: spilled, and the reason says so (a hot replica is not piled on).
    loads["m/2"].inflight = int(BALANCE) + 1
    got = choose("prefix", rs, loads, prompt=p2, prefixes=table)
    assert got is not None and got.replica.key != "m/2" and "passed over" in got.reason


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=2, max_size=16), st.data())
@settings(max_examples=60, deadline=None)
def test_a_hot_prefix_never_goes_to_a_replica_loaded_past_the_bound(
    inflight: list[int], data: st.DataObject
) -> None:
    rs = replicas(len(inflight))
    table = PrefixTable()
    p = prompt_of({"prompt": "hot " * 500}, "completions")
    assert p is not None
    for r in data.draw(st.lists(st.sampled_from(rs), max_size=len(rs))):
        table.record(r.key, p, 0)
    loads = {r.key: Load(inflight=n) for r, n in zip(rs, inflight, strict=True)}
    got = choose("prefix", rs, loads, prompt=p, prefixes=table)
    assert got is not None
    assert loads[got.replica.key].inflight - min(inflight) <= BALANCE


@given(st.text(min_size=1, max_size=2000), st.integers(min_value=2, max_value=64))
@settings(max_examples=60, deadline=None)
def test_two_independent_routers_send_an_unseen_prefix_to_the_same_replica(
    text: str, n: int
) -> None:
    rs = replicas(n)
    # Two gateways: their own tables (each saw other traffic), their own prompt objects.
    a, b = PrefixTable(), PrefixTable()
    other = prompt_of({"prompt": "unrelated " + text[::-1]}, "completions")
    assert other is not None
    a.record("m/0", other, 0)
    pa = prompt_of({"prompt": text}, "completions")
    pb = prompt_of({"prompt": text}, "completions")
    assert pa is not None and pb is not None
    loads: dict[str, Load] = {}
    ga = choose("prefix", rs, loads, prompt=pa, prefixes=a)
    gb = choose("prefix", rs, loads, prompt=pb, prefixes=b)
    assert ga is not None and gb is not None
    if not a.match(pa, rs)["m/0"]:
        assert ga.replica.key == gb.replica.key


def test_conversations_sharing_a_system_prompt_spread_under_load_and_each_stays() -> None:
    rs = replicas(4)
    table = PrefixTable()
    loads = {r.key: Load() for r in rs}
    homes = {}
    for i in range(40):
        # Eight conversations at a time in flight: the shared system prompt's replica
        # fills up to the bound, then new ones spill (and cache it there too).
        if i % 8 == 0:
            for load in loads.values():
                load.inflight = 0
        p = prompt_of(chat("shared system prompt " * 30, f"conversation {i}"), "chat")
        assert p is not None
        got = choose("prefix", rs, loads, prompt=p, prefixes=table)
        assert got is not None
        table.record(got.replica.key, p, got.prefix_blocks)
        loads[got.replica.key].inflight += 1
        homes[i] = got.replica.key
    assert len(set(homes.values())) >= 3
    for load in loads.values():
        load.inflight = 0
    for i in range(40):
        p = prompt_of(chat("shared system prompt " * 30, f"conversation {i}", "ok", "more"), "chat")
        got = choose("prefix", rs, loads, prompt=p, prefixes=table)
        assert got is not None and got.replica.key == homes[i]


def test_a_guess_the_engine_denies_forgets_the_prefix_and_all_sent_there_before_it() -> None:
    table = PrefixTable()
    r = replicas(1)
    old = prompt_of({"prompt": "old " * 300}, "completions")
    p = prompt_of({"prompt": "mine " * 300}, "completions")
    later = prompt_of({"prompt": "later " * 300}, "completions")
    assert old is not None and p is not None and later is not None
    table.record("m/0", old, 0)
    table.record("m/0", p, 0)
    table.record("m/0", later, 0)
    matched = table.match(p, r)["m/0"]
    assert matched == len(p.blocks)
    ticket = table.record("m/0", p, matched)
    # The engine says it had none of it: the guess was wrong.
    predicted = table.check(ticket, prompt_tokens=300, cached_tokens=0)
    assert predicted == 300 * p.ends[matched - 1] // p.chars
    assert table.match(old, r)["m/0"] == 0  # sent before it: gone from the engine too
    assert table.match(later, r)["m/0"] == len(later.blocks)  # sent after: kept
    # The prompt itself was just computed again: the engine holds it now.
    assert table.match(p, r)["m/0"] == len(p.blocks)
    stats = table.stats["m/0"]
    assert stats.misses == 1 and stats.cached_tokens == 0 and stats.predicted_tokens == predicted
    # A confirmed guess is kept.
    ticket = table.record("m/0", p, len(p.blocks))
    table.check(ticket, prompt_tokens=300, cached_tokens=299)
    assert table.stats["m/0"].misses == 1 and table.match(p, r)["m/0"] == len(p.blocks)


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.sampled_from("abcd"), min_size=1, max_size=5)),
        min_size=1,
        max_size=20,
    ),
    st.integers(min_value=1, max_value=12),
)
@settings(max_examples=30, deadline=None)
def test_the_table_forgets_exactly_what_a_least_recently_used_list_of_blocks_would(
    sends: list[tuple[int, list[str]]], bound: int
) -> None:
    # Prompts that share heads (a conversation resent, a system prompt), sent again and
    # again to three replicas: what each replica holds is what an LRU of its blocks,
    # each send touching its blocks from the last to the first, would hold.
    from collections import OrderedDict

    rs = replicas(3)
    table = PrefixTable(per_replica=bound)
    lru: dict[str, OrderedDict[int, None]] = {r.key: OrderedDict() for r in rs}
    sent = []
    for i, parts in sends:
        p = prompt_of(chat(*(c * (BLOCK_CHARS // 2) for c in parts)), "chat")
        assert p is not None
        sent.append(p)
        key = rs[i].key
        table.record(key, p, table.match(p, rs)[key])
        for block in reversed(p.blocks):
            lru[key][block] = None
            lru[key].move_to_end(block)
        while len(lru[key]) > bound:
            lru[key].popitem(last=False)
    for p in sent:
        held = table.match(p, rs)
        for r in rs:
            expected = 0
            for i, block in enumerate(p.blocks):
                if block in lru[r.key]:
                    expected = i + 1
            assert held[r.key] == expected
    for r in rs:
        assert table.blocks(r.key) == len(lru[r.key])


def test_replicas_that_left_the_table_are_forgotten() -> None:
    table = PrefixTable()
    p = prompt_of({"prompt": "x" * 2000}, "completions")
    assert p is not None
    table.record("m/0", p, 0)
    table.record("m/1", p, 0)
    table.retain({"m/1"})
    assert table.blocks("m/0") == 0 and table.match(p, replicas(2)) == {"m/0": 0, "m/1": 4}


# -- the engine's own counts, as a stream's final chunk carries them ---------------------

LLAMACPP_LAST = (
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],'
    b'"object":"chat.completion.chunk","timings":{"cache_n":690,"prompt_n":1,'
    b'"prompt_ms":3.2,"predicted_n":2}}\n\ndata: [DONE]\n\n'
)
VLLM_LAST = (
    b'data: {"choices":[],"usage":{"prompt_tokens":691,"completion_tokens":2,'
    b'"total_tokens":693,"prompt_tokens_details":{"cached_tokens":672}}}\n\ndata: [DONE]\n\n'
)


def test_a_streams_final_chunk_gives_the_engines_prompt_and_cached_tokens() -> None:
    # llama-server (the version `make llamacpp` installs) ends a stream with its timings
    # (cache_n: reused, prompt_n: computed) and no usage unless asked; vLLM and the sim
    # with usage when asked (stream_options.include_usage).
    from gateway import usage
    from gateway.proxy import Trace, _Tally
    from gateway.stages import sse

    first = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    for last, prompt, cached in ((LLAMACPP_LAST, 691, 690), (VLLM_LAST, 691, 672)):
        tally = _Tally(first, 0.0, sse.Framing(), 0, usage.Events(strip=False))
        tally.passed(last)
        trace = Trace("r", "c", 0.0)
        tally.count(trace, 0.0)
        assert (trace.prompt_tokens, trace.cached_tokens) == (prompt, cached)
    # A stream with no usage says nothing: no guess is checked against it.
    tally = _Tally(b"", 0.0, sse.Framing(), 0, usage.Events(strip=False))
    tally.passed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n')
    trace = Trace("r", "c", 0.0)
    tally.count(trace, 0.0)
    assert trace.cached_tokens is None


def test_gateways_that_saw_different_traffic_agree_on_a_conversation() -> None:
    # Gateway A saw other conversations with the same system prompt go to m/0; gateway
    # B saw nothing. A shared head shorter than the key (the system prompt and the
    # opening of the conversation) does not outweigh the rendezvous hash, so both send a
    # new conversation, and each of its later turns, to the same replica.
    rs = replicas(8)
    a, b = PrefixTable(), PrefixTable()
    system = "shared system prompt " * 60
    for i in range(5):
        seen = prompt_of(chat(system, f"someone else {i}"), "chat")
        assert seen is not None
        a.record("m/0", seen, 0)
    loads: dict[str, Load] = {}
    agree = 0
    for i in range(40):
        turn = prompt_of(chat(system, f"conversation {i}", "answer", "again"), "chat")
        ga = choose("prefix", rs, loads, prompt=turn, prefixes=a)
        gb = choose("prefix", rs, loads, prompt=turn, prefixes=b)
        assert ga is not None and gb is not None
        agree += ga.replica.key == gb.replica.key
    assert agree == 40
