"""The msgspec decoder of stored definitions accepts nothing the general path refuses.

``catalog.stored.fast_decode`` decodes a stored add or replacement without pydantic's
validation; these properties hold it to the general path (``read_json`` within
replay's limits, then ``parse_model``), which is the judge:

- whenever the fast decoder answers, the general path accepts the same text and
  gives an equal model: equal values of the same types, the same definition,
  the same ``model_fields_set``, all the way down;
- ``decode_added`` answers exactly as the general path does, and a refusal is
  the general path's, word for word, and the reason replay records;
- a payload as the commands store it (valid, normalised, ``sort_keys``) does
  take the fast path, so the speed is not bought by declining everything.

Payloads are generated valid, then mutated: fields of the wrong type, unknown
and missing fields, booleans for numbers and numbers for booleans, floats,
integers past 64 bits, unicode, NUL and lone surrogates, keys written twice,
numbers spelt otherwise, stray text, and sizes beyond the general path's limits.
"""

from __future__ import annotations

import copy
import json
import math
import operator
import string
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from pydantic import BaseModel

from bench.shared import gen
from catalog import CatalogError, Model, parse_model
from catalog.definition.model import Scaling
from catalog.definition.parse import parse_wrapped_model_json
from catalog.reading.documents import Limits
from catalog.stored import fast_build
from catalog.stored import fast_decode as fd
from events.core.types import MODEL_ADDED, StoredEvent
from events.read.replay import STORED_LIMITS, replay

# -- strict equality ------------------------------------------------------------------------


def _same_value(a: Any, b: Any, where: str) -> None:
    # Hot: called about a million times a module run. Values that compare equal and are of
    # one immutable scalar type are done at once; the path is built only to go deeper.
    if type(a) is not type(b):
        raise AssertionError(f"{where}: {type(a).__name__} != {type(b).__name__}")
    if type(a) in _SCALARS:
        assert a == b or (type(a) is float and math.isnan(a) and math.isnan(b)), where
    elif isinstance(a, BaseModel):
        _same_model(a, b, where, dump=False)
    elif isinstance(a, tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_value(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a.items()) == list(b.items()), where  # order too: it shows in dumps
        for k in a:
            _same_value(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


_SCALARS = frozenset({str, int, float, bool, type(None), bytes})


def _same_model(a: BaseModel, b: BaseModel, where: str = "model", *, dump: bool = True) -> None:
    """Equal as pydantic compares, and beyond: field types, key order, fields set."""
    assert type(a) is type(b), where
    assert a == b, where
    assert a.model_fields_set == b.model_fields_set, f"{where}: fields set"
    assert a.__pydantic_extra__ == b.__pydantic_extra__, where
    assert a.__pydantic_private__ == b.__pydantic_private__, where
    assert list(a.__dict__) == list(b.__dict__), where
    for name in a.__dict__:
        _same_value(a.__dict__[name], b.__dict__[name], f"{where}.{name}")
    if dump:  # once, at the top: a nested model's dump is part of its container's
        assert a.model_dump_json() == b.model_dump_json(), where


def _general(text: str | bytes) -> Model | str:
    """The judge: the general path's model, or its refusal as replay would word it."""
    try:
        return fd.decode_general(text, STORED_LIMITS)
    except CatalogError as exc:
        return f"refused: {exc}"


def _check(text: str | bytes) -> Model | None:
    """Every property of one payload; returns the fast decoder's answer."""
    fast = fd.decode_definition(text)
    general = _general(text)
    if fast is not None:
        assert isinstance(general, Model), f"fast accepted what the general path {general}"
        _same_model(fast, general)
        assert fast.to_definition() == general.to_definition()
        # And today's pydantic fast path, which replay takes now, agrees.
        if isinstance(text, str):
            wrapped = parse_wrapped_model_json(text)
            assert wrapped is not None
            _same_model(fast, wrapped)
    try:
        added: Model | str = fd.decode_added(text, STORED_LIMITS)
    except CatalogError as exc:
        added = f"refused: {exc}"
    if isinstance(general, Model):
        assert isinstance(added, Model), added
        _same_model(added, general)
    else:
        assert added == general
    if currently_in_test_context():
        event(
            "fast" if fast else "general path accepts" if isinstance(general, Model) else "refused"
        )
    return fast


# -- valid definitions, as the commands store them -------------------------------------------

# Text the grammars leave free (args, env, source): any unicode, NUL included; no
# lone surrogates, which neither a request body nor YAML can carry into a definition.
_FREE = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
_PRINTABLE = st.text(
    st.characters(exclude_categories=["Cs", "Cc", "Zs", "Zl", "Zp", "Cf", "Co", "Cn"]),
    min_size=1,
    max_size=8,
)
# The identifiers' languages, drawn character by character: the same strings as
# ``st.from_regex`` draws for ``[a-z][a-z0-9-]{0,10}[a-z0-9]`` (``_NAME``), ``[a-z]{1,6}``
# and ``[a-z0-9]{1,6}``, without its regex machinery (which, with the filter it puts on
# every value, was a quarter of these tests' CPU).
_LOWER = string.ascii_lowercase
_LOWER_DIGITS = _LOWER + string.digits
_NAME = st.builds(
    operator.add,
    st.builds(operator.add, st.sampled_from(_LOWER), st.text(_LOWER_DIGITS + "-", max_size=10)),
    st.sampled_from(_LOWER_DIGITS),
)
_DURATION = st.sampled_from(["20m", "0s", "90s", "1h30m", "80ms", "1.5s", "250us", "2h"])


# The optional fields' strategies, built once: built inside each draw, hypothesis validated
# every one again (regexes included), a third of these tests' CPU.
_PROFILE_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "args": st.lists(_FREE, max_size=3),
    "env": st.dictionaries(_FREE, _FREE, max_size=3),
    "min_memory_gb": st.integers(0, 1 << 20),
    "node_selector": st.dictionaries(
        st.text(_LOWER, min_size=1, max_size=6),
        st.text(_LOWER_DIGITS, min_size=1, max_size=6),
        max_size=2,
    ),
    "weight": st.one_of(st.floats(0, 1e6, allow_nan=False), st.integers(0, 2**70), st.just(-0.0)),
    "priority": st.integers(-(2**70), 2**70),
    "startup_timeout": _DURATION,
}
_PROFILE_KEYS = st.lists(st.sampled_from(sorted(_PROFILE_OPTIONAL)), unique=True)


# The strategies the composites and tests below draw from, made once (so too the node
# counts each tp allows): an inline strategy is a new object hypothesis validates again.
_ONE_IN_SIX = st.integers(0, 5)
_ENGINE = st.sampled_from(["vllm", "sim", "sglang"])
_GPU_CLASS = st.sampled_from(["A100", "T4", "H100", "l40s"])
_TP = st.sampled_from([1, 2, 4, 8])
_BOOL = st.booleans()
_NODES = {tp: st.sampled_from([n for n in (1, 2, 4) if tp % n == 0]) for tp in (1, 2, 4, 8)}


@st.composite
def valid_profiles(draw: st.DrawFn, name: str) -> dict[str, Any]:
    cpu = draw(_ONE_IN_SIX) == 0
    body: dict[str, Any] = {"name": name}
    if cpu:
        body["engine"] = "llamacpp"
    else:
        body["engine"] = draw(_ENGINE)
        body["gpu_class"] = draw(_GPU_CLASS)
        tp = draw(_TP)
        body["tp"] = tp
        if draw(_BOOL):
            nodes = draw(_NODES[tp])
            body["nodes"] = nodes
            body["gpus_per_node"] = tp // nodes
    for key in draw(_PROFILE_KEYS):
        body[key] = draw(_PROFILE_OPTIONAL[key])
    return body


_BODY_OPTIONAL: dict[str, st.SearchStrategy[Any]] = {
    "aliases": st.lists(_NAME, max_size=2, unique=True),  # the model's own name dropped below
    "fallbacks": st.lists(_NAME, max_size=2),
    "scaling": st.fixed_dictionaries(
        {}, optional={"min": st.integers(0, 3), "max": st.integers(4, 10_000)}
    ),
    "slo": st.fixed_dictionaries({}, optional={"ttft_p99": _DURATION, "tpot_p99": _DURATION}),
    "capabilities": st.fixed_dictionaries(
        {},
        optional={"tools": st.booleans(), "vision": st.booleans(), "embeddings": st.booleans()},
    ),
    "context_length": st.integers(0, 2**70),
    "routing_profile": st.sampled_from(["", "latency", "round-robin"]),
    "placement": st.fixed_dictionaries(
        {},
        optional={
            "priority": st.integers(-5, 5),
            "spread_by": st.one_of(st.none(), st.sampled_from(["zone", "rack", ""]), _PRINTABLE),
            "spread_required": st.booleans(),
        },
    ),
    "rollout": st.fixed_dictionaries(
        {}, optional={"max_surge": st.integers(1, 3), "max_unavailable": st.integers(0, 3)}
    ),
}
_BODY_KEYS = st.lists(st.sampled_from(sorted(_BODY_OPTIONAL)), unique=True)
_PROFILE_NAMES = st.lists(_NAME, min_size=1, max_size=3, unique=True)
_SOURCES = st.one_of(_PRINTABLE, st.just("org/model"))


@st.composite
def valid_bodies(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(_NAME)
    names = draw(_PROFILE_NAMES)
    body: dict[str, Any] = {
        "name": name,
        "source": draw(_SOURCES),
        "profiles": [draw(valid_profiles(n)) for n in names],
    }
    for key in draw(_BODY_KEYS):
        body[key] = draw(_BODY_OPTIONAL[key])
    if "aliases" in body:
        body["aliases"] = [a for a in body["aliases"] if a != name]
    return body


_VALID_BODIES = valid_bodies()


@st.composite
def stored_models(draw: st.DrawFn) -> Model:
    try:
        model = parse_model(draw(_VALID_BODIES))
    except CatalogError:
        assume(False)
        raise
    return model


def _stored_text(model: Model, digest: str | None = None, **dumps: Any) -> str:
    """The payload as the commands write it (``json.dumps(..., sort_keys=True)``)."""
    options: dict[str, Any] = {"sort_keys": True, **dumps}
    return json.dumps({"model": model.to_definition(), "declared_digest": digest}, **options)


_DIGESTS = st.one_of(st.none(), st.text("0123456789abcdef", min_size=64, max_size=64))


@settings(max_examples=300)
@given(stored_models(), _DIGESTS, st.booleans(), st.booleans(), st.booleans())
def test_a_definition_as_stored_takes_the_fast_path_and_equals_pydantics(
    model: Model, digest: str | None, ascii_only: bool, as_bytes: bool, replaced: bool
) -> None:
    text = _stored_text(model, digest, ensure_ascii=ascii_only)
    if replaced:  # model.replaced: the same shape
        text = json.dumps(json.loads(text), sort_keys=False)
    raw: str | bytes = text.encode() if as_bytes else text
    fast = _check(raw)
    assert fast is not None
    # Equal to the model that was stored (its fields set differs: the stored text has them all).
    assert fast == model
    assert fast.to_definition() == model.to_definition()


@settings(max_examples=200)
@given(valid_bodies())
def test_a_definition_not_yet_normalised_decodes_as_parse_model_would(
    body: dict[str, Any],
) -> None:
    # Older rows, or rows written by hand: defaults left out, keys in any order.
    _check(json.dumps({"model": body}))
    _check(json.dumps({"model": body, "declared_digest": None}, sort_keys=True))


# -- mutations ----------------------------------------------------------------------------------

_ODD: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**30,
    10**400,
    1.0,
    0.5,
    -0.0,
    1e308,
    1e-320,
    float("inf"),
    float("-inf"),
    float("nan"),
    "",
    "x",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "é",
    "\U0001f600",
    "\u2028",
    " zone",
    "20m",
    "90",
    "-1s",
    "1e3",
    [],
    ["a"],
    [1],
    [None],
    {},
    {"a": "b"},
    {"a": 1},
    {"name": "p"},
]
_KNOWN_KEYS = sorted(set(Model.model_fields) | {"gpu_class", "tp", "weight", "min", "max"})


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _at(root: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        root = root[part]
    return root


# Made once, as above (the paths, drawn from the payload at hand, cannot be).
_STEPS = st.integers(1, 3)
_KIND = st.sampled_from(["replace", "delete", "extra", "wrap", "stringify"])
_EXTRA_KEY = st.one_of(st.sampled_from(_KNOWN_KEYS), st.text(max_size=4))
_AN_ODD = st.sampled_from(_ODD)


@st.composite
def mutated(draw: st.DrawFn, data: dict[str, Any]) -> dict[str, Any]:
    """One to three structural changes anywhere in a payload."""
    for _ in range(draw(_STEPS)):
        paths = _paths(data)
        path = draw(st.sampled_from(paths))
        kind = draw(_KIND)
        if not path:
            kind = "extra"
        if kind == "extra":
            target = _at(data, path)
            if isinstance(target, dict):
                key = draw(_EXTRA_KEY)
                # A copy: an odd value that is a dict or a list may be changed by a later
                # step, and the shared one would then differ from one example to the next.
                target[key] = copy.deepcopy(draw(_AN_ODD))
            continue
        parent, last = _at(data, path[:-1]), path[-1]
        old = parent[last]
        if kind == "replace":
            parent[last] = copy.deepcopy(draw(_AN_ODD))
        elif kind == "delete":
            del parent[last]
        elif kind == "wrap":
            parent[last] = [old]
        else:
            parent[last] = json.dumps(old)
    return data


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
@settings(max_examples=700)
@given(stored_models(), _DIGESTS, st.data())
def test_a_mutated_payload_is_never_accepted_unless_the_general_path_accepts_it_equal(
    model: Model, digest: str | None, data: st.DataObject
) -> None:
    payload = json.loads(_stored_text(model, digest))
    changed = data.draw(mutated(payload))
    text = json.dumps(changed, sort_keys=data.draw(st.booleans()))
    _check(text)
    _check(text.encode("utf-8", "surrogatepass"))


# The respellings' strategies, made once, as above.
_TRICK = st.integers(0, 13)
_TWICE_KEY = st.sampled_from(["name", "source", "profiles", "scaling", "context_length"])
_INNER_KEY = st.sampled_from(["tp", "name", "weight", "min", "tools", "env", "engine"])
_TRAILER = st.sampled_from([" ", "\n", "\t", "\r", " x", "}", "\ufeff", "\x00", "\u00a0"])
_LEADER = st.sampled_from(["\ufeff", " ", "[", "\n", "\x0b", "\u00a0"])
_NUMBER_FROM = st.sampled_from([": 1,", ": 2,", ": 0,", ": 1.0,", ": 0.0,", ": 1}", ": 4,"])
_NUMBER_TO = st.sampled_from([": 1.0,", ": 1e0,", ": 1E0,", ": -0,", ": 01,", ": 1.,", ": +1,"])
_ESCAPE_FROM = st.sampled_from(['"', '"name": "'])
_ESCAPE_TO = st.sampled_from(
    [
        '"\\u0000',
        '"\x00',
        '"\t',
        '"\x7f',
        '"\\ud800',
        '"\\udc00\\ud800',
        '"\\ud83d\\ude00',
        '"\ud800',
        '"\\/',
        '"\\x41',
        '"\u2028',
    ]
)
_MODEL_KEY = st.sampled_from(['"Model"', '"model "', '"mode"'])
_LITERAL = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400"])
_WHITESPACE = st.sampled_from([" ", "\n\t", "\r\n", "\x0c", "\u3000"])
_HOW_MANY = st.integers(1, 5)
_LEVELS = st.sampled_from([30, 31, 32, 40])


def _respell(draw: Callable[[st.SearchStrategy[Any]], Any], text: str) -> str:
    """The same text changed in ways two JSON parsers might read differently."""
    trick = draw(_TRICK)
    if trick == 0:  # a key written twice, the first or the second one odd
        odd = json.dumps(draw(_AN_ODD))
        key = draw(_TWICE_KEY)
        first = draw(_BOOL)
        spliced = f'"{key}": {odd}, ' if first else ""
        text = text.replace('{"model": {', '{"model": {' + spliced, 1)
        if not first:
            text = text.replace('"model": {', '"model": {' + f'"{key}": {odd}, ', 1)
            text = text.replace('}, "declared_digest"', f', "{key}": {odd}}}, "declared_digest"', 1)
    elif trick == 1:  # the same key twice inside a profile or a section
        key = draw(_INNER_KEY)
        value = json.dumps(draw(_AN_ODD))
        text = text.replace(f'"{key}": ', f'"{key}": {value}, "{key}": ', 1)
    elif trick == 2:
        text += draw(_TRAILER)
    elif trick == 3:
        text = draw(_LEADER) + text
    elif trick == 4:  # a number spelt otherwise
        old = draw(_NUMBER_FROM)
        new = draw(_NUMBER_TO)
        text = text.replace(old, new, 1)
    elif trick == 5:  # escapes and raw characters inside strings
        frm = draw(_ESCAPE_FROM)
        to = draw(_ESCAPE_TO)
        if frm == '"':
            # Inside the first string value after a colon.
            text = text.replace(': "', ": " + to, 1)
        else:
            text = text.replace(frm, '"name": ' + to, 1)
    elif trick == 6:
        text = text.replace('"model"', draw(_MODEL_KEY), 1)
    elif trick == 7:  # cut short
        text = text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    elif trick == 8:  # literals json.loads reads and JSON does not have
        lit = draw(_LITERAL)
        text = text.replace(": 1.0", ": " + lit, 1).replace(": 0,", ": " + lit + ",", 1)
    elif trick == 9:  # whitespace where JSON allows it and where it does not
        ws = draw(_WHITESPACE)
        text = text.replace(": ", ":" + ws, draw(_HOW_MANY)).replace(", ", "," + ws, 2)
    elif trick == 10:  # declared_digest of other shapes
        digest = json.dumps(draw(_AN_ODD))
        text = text.replace('"declared_digest": ', f'"declared_digest": {digest}, "x": ', 1)
    elif trick == 11:  # not an object at all
        text = draw(
            st.sampled_from(["[" + text + "]", "null", "1", '"x"', "", "{}", '{"model": null}'])
        )
    elif trick == 12:  # nested deeper than the general path reads
        levels = draw(_LEVELS)
        deep = "[" * levels + "]" * levels
        text = text.replace('"declared_digest": ', f'"declared_digest": {deep}, "d": ', 1)
    return text


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
@settings(max_examples=700)
@given(stored_models(), _DIGESTS, st.booleans(), st.data())
def test_a_payload_respelt_is_never_accepted_unless_the_general_path_accepts_it_equal(
    model: Model, digest: str | None, ascii_only: bool, data: st.DataObject
) -> None:
    text = _stored_text(model, digest, ensure_ascii=ascii_only)
    for _ in range(data.draw(st.integers(1, 2))):
        text = _respell(data.draw, text)
    _check(text)
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        return
    _check(encoded)


# -- the general path's limits, and refusals --------------------------------------------------


def test_the_fast_path_is_within_the_limits_replay_reads_with() -> None:
    assert fd.fast_path_applies(STORED_LIMITS)
    # A model nests five levels deep at most: payload > model > profiles > profile > env.
    assert STORED_LIMITS.max_depth >= fd.FAST_MAX_DEPTH


def test_a_payload_past_the_general_paths_node_limit_is_refused_with_its_reason() -> None:
    model = parse_model(
        {
            "name": "big",
            "source": "org/big",
            "profiles": [{"name": "p", "gpu_class": "A100", "args": ["x"] * 100_001}],
        }
    )
    text = _stored_text(model)
    assert fd.decode_definition(text) is None
    with pytest.raises(CatalogError) as refused:
        fd.decode_added(text, STORED_LIMITS)
    assert "100000" in str(refused.value).replace(",", "")


def test_a_payload_longer_than_the_fast_bound_takes_the_general_path() -> None:
    model = parse_model(
        {
            "name": "long",
            "source": "org/long",
            "profiles": [{"name": "p", "gpu_class": "A100", "args": ["y" * fd.FAST_MAX_CHARS]}],
        }
    )
    text = _stored_text(model)
    assert fd.decode_definition(text) is None
    assert fd.decode_added(text, STORED_LIMITS) == model


def test_limits_narrower_than_the_fast_bound_turn_the_fast_path_off() -> None:
    model = parse_model({"name": "m", "source": "s", "profiles": [{"name": "p", "gpu_class": "A"}]})
    text = _stored_text(model)
    tight = Limits(max_bytes=len(text) - 1, max_nodes=100_000)
    assert not fd.fast_path_applies(Limits(max_nodes=10))
    with pytest.raises(CatalogError, match="larger than"):
        fd.decode_added(text, tight)


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"declared_digest": null}',
        '{"model": {"name": "m", "source": "s", "profiles": [{"name": "p", "tp": true}]}}',
        '{"model": {"name": "m", "source": "s", "profiles": [], "gpu_clas": "A100"}}',
        '{"model": {"name": "m", "source": "s", "profiles": [{"name": "p", "gpu_class": "A",'
        ' "tp": 4, "nodes": 3, "gpus_per_node": 1}]}}',
        b'{"model": {"name": "\xff"}}',
    ],
)
def test_a_refusal_reads_as_replay_records_it(text: str | bytes) -> None:
    with pytest.raises(CatalogError) as refused:
        fd.decode_added(text, STORED_LIMITS)
    if isinstance(text, bytes):
        return  # replay reads text; bytes come only from a lean read
    stored = StoredEvent(
        position=1,
        event_id="e",
        command_id="c",
        type=MODEL_ADDED,
        schema_version=2,
        model="m",
        payload=text,
        actor="a",
        reason="",
        recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    skipped = replay(gen.declared_catalog(), [stored]).skipped
    assert [s.reason for s in skipped] == [str(refused.value)]


# -- remembering sub-objects ---------------------------------------------------------------------


def test_a_repeated_profile_is_decoded_once_and_shared() -> None:
    fd.clear_caches()
    base = parse_model(
        {
            "name": "a",
            "source": "org/a",
            "profiles": [{"name": "p", "gpu_class": "A100", "env": {"K": "v"}}],
        }
    )
    other = base.model_copy(update={"name": "b"})
    first = fd.decode_definition(_stored_text(base))
    second = fd.decode_definition(_stored_text(other))
    assert first is not None and second is not None
    assert first.profiles[0] is second.profiles[0]
    assert first.scaling is second.scaling
    assert fd.cache_sizes()["profiles"] == 1
    fd.clear_caches()
    assert fd.cache_sizes()["profiles"] == 0


def test_a_refused_sub_object_is_not_remembered() -> None:
    fd.clear_caches()
    text = '{"model": {"name": "m", "source": "s", "profiles": [{"name": "p", "tp": "2"}]}}'
    assert fd.decode_definition(text) is None
    assert fd.decode_definition(text) is None
    assert fd.cache_sizes()["profiles"] == 0


def test_the_structs_mirror_the_models_fields() -> None:
    class Short(msgspec.Struct):
        min: int = 0

    with pytest.raises(RuntimeError, match="do not mirror"):
        fast_build._spec(Scaling, Short)  # the check fast_decode's structs pass at import


# -- the real payloads ---------------------------------------------------------------------------


@pytest.mark.slow  # (tests/xdist_groups.py: handed out first)
def test_every_generated_stored_payload_decodes_as_the_general_path_does() -> None:
    """The bench generator's log (what ``CatalogService`` writes, and its bad rows)."""
    commands, _ = gen.generate(6_000)
    fd.clear_caches()
    adds = fast = 0
    for rows in commands:
        for row in rows:
            if row["type"] != MODEL_ADDED:
                continue
            adds += 1
            if _check(row["payload"]) is not None:
                fast += 1
    assert adds > 2_500
    # Every add but the deliberately bad ones takes the fast path.
    assert fast >= adds - 10
    # Few distinct profiles and sections: that is what the caches are for.
    assert fd.cache_sizes()["profiles"] < 50


# -- removals ------------------------------------------------------------------------------


def _removal_texts() -> st.SearchStrategy[str]:
    names = st.text(max_size=20)
    plain = names.map(lambda n: json.dumps({"name": n}))
    unicode = names.map(lambda n: json.dumps({"name": n}, ensure_ascii=False))
    others = st.dictionaries(
        st.sampled_from(["name", "Name", "x", "model"]),
        st.one_of(names, st.integers(), st.none(), st.lists(st.integers(), max_size=2)),
        max_size=3,
    ).map(json.dumps)
    spelt = st.tuples(names, names, st.sampled_from(["", " ", "\n", "\t"])).map(
        lambda t: f'{t[2]}{{"name":{json.dumps(t[0])},{t[2]}"name":{json.dumps(t[1])}}}{t[2]}'
    )
    deep = st.integers(1, 40).map(lambda k: '{"name": "a", "x": ' + "[" * k + "]" * k + "}")
    return st.one_of(plain, unicode, others, spelt, deep, st.text(max_size=30))


@settings(max_examples=500)
@given(_removal_texts(), st.data())
def test_a_removal_is_never_read_unless_the_general_path_reads_the_same_name(
    text: str, data: st.DataObject
) -> None:
    if text and data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(text) - 1))
        text = text[:cut] + data.draw(st.sampled_from(["", '"', "\\", "\x01", "}"])) + text[cut:]
    fast = fd.decode_removal(text)
    event("fast" if fast is not None else "general")
    if fast is None:
        return
    from catalog.reading.documents import read_json

    payload = read_json(text, "payload", STORED_LIMITS)
    assert isinstance(payload, dict)
    assert payload.get("name") == fast
