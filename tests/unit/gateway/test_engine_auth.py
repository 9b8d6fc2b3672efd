"""The key of an engine started with one, as the gateway sends it: which profiles name
one (``catalog.secrecy.secrets.engine_key_secret``), how the gateway's copy becomes a
header line (``gateway.table.engine_auth``), what goes on the wire (``enginepool``, to a
scripted engine) and what a 401 tells the client (``upstream``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.sim import KEY_VARIABLE
from catalog.definition.parse import parse_model
from catalog.secrecy.secrets import ENGINE_KEY_VARIABLES, engine_key_secret
from gateway.enginepool import EnginePool, Unreachable
from gateway.table import build, engine_auth
from gateway.upstream import Upstream
from tests.unit.gateway.test_enginepool import WHOLE, Engine, _request, run


def keyed(engine: str = "vllm", secret: str = "engine-key", **more: Any) -> Any:
    variable = ENGINE_KEY_VARIABLES[engine]
    return parse_model(
        {
            "name": "m",
            "source": "org/m",
            "profiles": [
                {
                    "name": "p",
                    "engine": engine,
                    "gpu_class": "" if engine == "llamacpp" else "a100",
                    "env": {variable: {"secret": secret}, **more},
                },
                {
                    "name": "open",
                    "engine": engine,
                    "gpu_class": "" if engine == "llamacpp" else "a100",
                    "priority": 1,
                },
            ],
        }
    )


def test_each_engine_reads_its_key_from_its_own_variable_and_the_sim_agrees() -> None:
    assert ENGINE_KEY_VARIABLES["sim"] == KEY_VARIABLE
    for engine in ("vllm", "llamacpp", "sim"):
        m = keyed(engine)
        assert engine_key_secret(engine, m.profiles[0].env) == "engine-key"
        assert engine_key_secret(engine, m.profiles[1].env) is None
    # Another engine's variable is not this engine's key; the JSON form reads alike.
    assert engine_key_secret("llamacpp", {"VLLM_API_KEY": {"secret": "k"}}) is None
    assert engine_key_secret("vllm", {"VLLM_API_KEY": {"secret": "k"}}) == "k"
    assert engine_key_secret("vllm", {"VLLM_API_KEY": "[redacted]"}) is None
    assert engine_key_secret("vllm", {"VLLM_API_KEY": {"secret": "../etc/passwd"}}) is None
    assert engine_key_secret("tgi", {"VLLM_API_KEY": {"secret": "k"}}) is None


def test_the_gateways_copy_is_sent_and_a_missing_one_says_what_to_do() -> None:
    m = keyed()
    auth = engine_auth([m], {"engine-key": "s3cret"}.__getitem__)
    assert set(auth) == {("m", "p")}
    assert auth[("m", "p")].line == b"authorization: Bearer s3cret\r\n"
    assert auth[("m", "p")].problem == ""

    def missing(name: str) -> str:
        raise LookupError(f"secret {name!r} is on neither the file /etc/x/{name} nor ...")

    (unsent,) = engine_auth([m], missing).values()
    assert unsent.line == b""
    assert unsent.note.startswith("this gateway has no usable key for it (secret 'engine-key'")
    assert "/etc/x" not in unsent.note  # a client reads the note; the log the problem
    assert "/etc/x/engine-key" in unsent.problem


@given(st.text(max_size=40))
def test_no_value_of_the_secret_can_add_a_line_to_the_request_head(value: str) -> None:
    (auth,) = engine_auth([keyed()], lambda _: value).values()
    if auth.line:
        assert auth.line.count(b"\r\n") == 1 and auth.line.endswith(b"\r\n")
        assert b"\n" not in auth.line[:-2] and b"\r" not in auth.line[:-2]
        assert b" " not in auth.line.removeprefix(b"authorization: Bearer ")
    else:
        assert auth.problem and "cannot be sent in a header" in auth.problem


@pytest.mark.parametrize("hostile", ["k\r\nx-admin: 1", "k\nx: y", "a b", "", "k\x00", "ключ"])
def test_a_value_a_header_cannot_carry_is_not_sent(hostile: str) -> None:
    (bad,) = engine_auth([keyed()], lambda _: hostile).values()
    assert bad.line == b"" and "cannot be sent in a header" in bad.problem


def test_a_replica_carries_its_profiles_auth_and_an_open_profile_none() -> None:
    m = keyed()
    placements = [
        {"model": "m", "replica": 0, "state": "ready", "endpoint": "http://h:1", "profile": "p"},
        {"model": "m", "replica": 1, "state": "ready", "endpoint": "http://h:2", "profile": "open"},
    ]
    auth = engine_auth([m], lambda _: "s3cret")
    table = build([m], placements, 1, None, auth)
    first, second = table.ready["m"]
    assert first.auth == b"authorization: Bearer s3cret\r\n" and "secret 'engine-key'" in (
        first.auth_note
    )
    assert (second.auth, second.auth_note) == (b"", "")


def test_the_key_goes_in_the_request_head_and_a_new_key_in_the_next_one() -> None:
    heads: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await _request(reader)) is not None:
            heads.append(request.split(b"\r\n\r\n", 1)[0])
            writer.write(WHOLE)
            await writer.drain()

    async def main() -> None:
        async with Engine(engine) as url:
            pool = EnginePool(2, 5)
            for auth in (b"", b"authorization: Bearer one\r\n", b"authorization: Bearer two\r\n"):
                answer = await pool.post(url + "/v1/completions", b"{}", auth)
                await answer.read()
                answer.release()
            await pool.close()

    run(main())
    said = [[x for x in h.split(b"\r\n") if x.startswith(b"authorization")] for h in heads]
    assert said == [[], [b"authorization: Bearer one"], [b"authorization: Bearer two"]]


@pytest.mark.parametrize("note", ["", "it does not take this gateway's key (secret 'k')"])
def test_an_engines_401_is_the_gateways_failure_never_the_clients(note: str) -> None:
    refused = (
        b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n"
        b'content-length: 30\r\n\r\n{"error":"Invalid API Key...."}'
    )

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while await _request(reader) is not None:
            writer.write(refused)
            await writer.drain()

    async def main() -> None:
        async with Engine(engine) as url:
            upstream = Upstream(2, 5, 60)
            with pytest.raises(Unreachable) as caught:
                await upstream.open(url + "/v1/completions", b"{}", b"", note)
            await upstream.close()
        assert caught.value.status == 401
        assert caught.value.reason.startswith(
            "answered 401: the engine refused the gateway's request: "
        )
        assert (note or "gives the engine no key") in caught.value.reason

    run(main())


def test_the_key_is_in_no_repr() -> None:
    m = keyed()
    auth = engine_auth([m], lambda _: "s3cret-value")
    placements = [
        {"model": "m", "replica": 0, "state": "ready", "endpoint": "http://h:1", "profile": "p"}
    ]
    (replica,) = build([m], placements, 1, None, auth).ready["m"]
    assert "s3cret-value" not in repr(replica) + repr(auth)


def test_props_is_asked_with_the_key_of_the_replica_at_that_endpoint_only() -> None:
    # Attack: engineslots asks (replica key, endpoint) pairs, and looked the key up by
    # the replica key alone. Between the pair being taken and asked (asyncio.gather
    # starts the asks on a later turn) a new table may hold that replica elsewhere,
    # under another profile: its key was sent to the old endpoint, which may now be
    # another engine's (or anyone's) port.
    from gateway.engineslots import EngineSlots
    from gateway.state import State

    heads: list[bytes] = []
    props = b'{"total_slots": 3}'
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(props)).encode()
        + b"\r\n\r\n"
        + props
    )

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        writer.write(answer)
        await writer.drain()

    async def main() -> None:
        async with Engine(engine) as old:
            m = keyed("llamacpp")
            moved = [
                {"model": "m", "replica": 0, "state": "ready", "endpoint": "http://h:9"}
                | {"profile": "p"}
            ]
            state = State("gw-test")
            state.install(build([m], moved, 1, None, engine_auth([m], lambda _: "s3cret")))
            slots = EngineSlots(state, lambda: None, timeout_s=5)
            try:
                assert await slots.ask(("m/0", old)) == (3, "")
            finally:
                await slots.close()

    run(main())
    (head,) = heads
    assert b"s3cret" not in head, head


def test_a_key_rotated_as_documented_leaves_the_running_engines_served() -> None:
    # Attack (docs/operator/gateway.md: "put the new value in the gateways' files, then
    # in the agents'; an engine takes a new key when it restarts"): at the gateway's
    # next table every engine still running refused its new key, and each of them was
    # set aside: every keyed model 503 until all its engines restarted. The engines
    # not yet restarted are asked again with the key before.
    import time

    from gateway.follower import Follower
    from gateway.proxy import Call, Proxy, Trace
    from gateway.settings import GatewaySettings
    from gateway.stages import admission
    from gateway.state import State

    copies = {"engine-key": "old"}  # the gateway's copy of the secret
    engine_keys = {b"Bearer old"}  # what the running engine was started with
    ok = b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    heard: list[set[bytes]] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while (request := await _request(reader)) is not None:
            head = request.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
            said = {x.split(b": ", 1)[1] for x in head if x.startswith(b"authorization: ")}
            heard.append(said)
            if said & engine_keys:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(ok), ok))
            else:
                writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()

    async def serve(state: State, proxy: Proxy) -> Trace:
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        trace = Trace("r", "c", time.monotonic())
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        call = Call(admission.parse_request(body, admission.CHAT), body, b"{}", None, send, trace)
        resolved = state.table.resolve("m")
        assert resolved is not None
        await proxy.serve(call, resolved)
        return trace

    outcomes: list[str] = []

    async def main() -> None:
        async with Engine(engine) as url:
            state = State("gw-test")
            follower = Follower(state, "http://cp", "t", 5.0, copies.__getitem__)
            follower.models = [keyed("sim")]
            follower.placements = [
                {"model": "m", "replica": i, "state": "ready", "endpoint": url, "profile": "p"}
                for i in range(2)
            ]
            upstream = Upstream(2, 5, 1)
            proxy = Proxy(state, upstream, GatewaySettings(server="http://cp", token="t"))
            try:
                follower.install()
                outcomes.append((await serve(state, proxy)).outcome)
                copies["engine-key"] = "new"  # step 1: the gateways' files
                follower.install()  # (its next table: a resync)
                outcomes.append((await serve(state, proxy)).outcome)
                engine_keys.add(b"Bearer new")  # step 2: the engines restarted with it...
                engine_keys.discard(b"Bearer old")
                outcomes.append((await serve(state, proxy)).outcome)
            finally:
                await upstream.close()
                await follower.close()

    run(main())
    assert outcomes == ["ok", "ok", "ok"]
    # The key before is sent only to an engine that refused the new one.
    old, new = {b"Bearer old"}, {b"Bearer new"}
    assert heard == [old, new, old, new], heard
