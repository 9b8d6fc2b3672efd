"""Replay's fast path for stored adds accepts exactly what the general path accepts.

``parse_wrapped_model_json`` validates an add's payload straight from its text;
whenever it answers, ``json.loads`` + ``parse_model`` must give an equal model
(and the same definition back), and whatever it declines falls back to the
general path, so skip reasons cannot change. Checked here on payloads that are
valid, subtly invalid, or written in ways the two JSON parsers might read
differently (duplicate keys, escapes, number forms, stray text).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import CatalogError, parse_model
from catalog.definition.parse import parse_wrapped_model_json

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["20m", "90s", "1h30m", "80ms", "", "  x ", "1e3", "2", "-1s"]),
)


# The strategies below are built once (``functools.cache``, module constants), not inside
# each draw, where each was built and validated again every time: the same strategies,
# so the same examples, for about a third of the CPU.
@functools.cache
def _value(field: str, *, odd: bool = False) -> st.SearchStrategy[Any]:
    """A value for ``field``: one of its usual shapes, or (``odd``) anything at all."""
    typical: dict[str, st.SearchStrategy[Any]] = {
        "name": st.sampled_from(["m", "p", " m", ""]),
        "engine": st.sampled_from(["", "vllm", "llamacpp", "sim"]),
        "gpu_class": st.sampled_from(["", "A100", "T4"]),
        "tp": st.sampled_from([-1, 0, 1, 2, 4, 8]),
        "pp": st.sampled_from([-1, 0, 1]),
        "nodes": st.integers(-1, 3),
        "gpus_per_node": st.integers(-1, 8),
        "weight": st.one_of(st.floats(-1, 4), st.integers(-1, 4)),
        "priority": st.integers(-5, 5),
        "min_memory_gb": st.integers(-1, 64),
        "startup_timeout": st.sampled_from(["20m", "0s", 90, 1.5, "1h30m", "80ms"]),
        "args": st.lists(st.text(max_size=3), max_size=2),
        "env": st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2),
        "node_selector": st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2),
    }
    usual = typical.get(field, _SCALARS)
    return st.one_of(usual, _SCALARS) if odd else usual


@functools.cache
def _profile_fields(odd: bool) -> st.SearchStrategy[list[str]]:
    fields = ["engine", "gpu_class", "tp", "pp", "weight", "priority", "min_memory_gb"]
    fields += ["startup_timeout", "args", "env", "node_selector"]
    if odd:
        fields += ["name", "nodes", "gpus_per_node"]
    return st.lists(st.sampled_from(fields), unique=True, max_size=6)


_ONE_IN_21 = st.integers(0, 20)


@st.composite
def profiles(draw: st.DrawFn, index: int, odd: bool) -> dict[str, Any]:
    chosen = draw(_profile_fields(odd))
    out = {"name": f"p{index}", "gpu_class": "A100"}
    out.update({f: draw(_value(f, odd=odd)) for f in chosen})
    if draw(_ONE_IN_21) == 7:
        out["gpu_clas"] = "A100"  # a typo: refused as unknown
    return out


@functools.cache
def _optional(odd: bool) -> tuple[dict[str, st.SearchStrategy[Any]], st.SearchStrategy[list[str]]]:
    """The optional fields' strategies, and which of them a definition has."""
    optional: dict[str, st.SearchStrategy[Any]] = {
        "aliases": st.lists(
            st.sampled_from(["a", "b", "llama", " "] if odd else ["a", "b"]),
            max_size=3,
            unique=not odd,
        ),
        "fallbacks": st.lists(st.sampled_from(["a", "z"]), max_size=2),
        "scaling": st.fixed_dictionaries(
            {}, optional={"min": _value("tp", odd=odd), "max": _value("tp", odd=odd)}
        ),
        "slo": st.fixed_dictionaries(
            {},
            optional={
                "ttft_p99": _value("startup_timeout", odd=odd),
                "tpot_p99": _value("startup_timeout", odd=odd),
            },
        ),
        "capabilities": st.fixed_dictionaries(
            {}, optional={"tools": _SCALARS if odd else st.booleans()}
        ),
        "context_length": st.one_of(st.integers(-1, 10**6), _SCALARS) if odd else st.integers(0, 9),
        "max_output": st.integers(-1, 10**6) if odd else st.integers(0, 9),
        "routing_profile": _SCALARS if odd else st.sampled_from(["", "latency"]),
    }
    return optional, st.lists(st.sampled_from(sorted(optional)), unique=True)


_ONE_IN_5 = st.integers(0, 4)
_DEFINITION_NAMES = st.sampled_from(["llama", " x", ""])
_SOURCES = st.sampled_from(["org/m", ""])
_PROFILE_COUNT = {odd: st.integers(0 if odd else 1, 3) for odd in (False, True)}
_PROFILES = {(i, odd): profiles(i, odd) for i in range(3) for odd in (False, True)}


@st.composite
def definitions(draw: st.DrawFn) -> dict[str, Any]:
    # Mostly plausible definitions (so that many are valid), some with anything in them.
    odd = draw(_ONE_IN_5) == 3
    count = draw(_PROFILE_COUNT[odd])
    body: dict[str, Any] = {
        "name": draw(_DEFINITION_NAMES) if odd else "llama",
        "source": draw(_SOURCES) if odd else "org/m",
        "profiles": [draw(_PROFILES[i, odd]) for i in range(count)],
    }
    optional, keys = _optional(odd)
    for key in draw(keys):
        body[key] = draw(optional[key])
    return body


_TRICKS = st.integers(0, 9)
_TRAILERS = st.sampled_from([" ", "\n", " x", "}", "\ufeff"])
_LEADERS = st.sampled_from(["\ufeff", " ", "[", "\n"])
_ESCAPED = st.sampled_from(['"ll\\u0061ma"', '"\\ud800"'])
_DEFINITIONS = definitions()
_BOOL = st.booleans()


@st.composite
def payload_texts(draw: st.DrawFn) -> str:
    body = draw(_DEFINITIONS)
    text = json.dumps({"model": body, "declared_digest": None}, sort_keys=draw(_BOOL))
    trick = draw(_TRICKS)
    if trick == 1:  # a key written twice: both parsers must keep the same one
        text = text.replace('{"model": {', '{"model": {"name": "dup", ', 1)
    elif trick == 2:
        text = text + draw(_TRAILERS)
    elif trick == 3:
        text = draw(_LEADERS) + text
    elif trick == 4:  # a number spelt otherwise
        text = text.replace(": 1,", ": 1.0,", 1).replace(": 2,", ": 2e0,", 1)
    elif trick == 5:  # escapes, including a lone surrogate
        text = text.replace('"llama"', draw(_ESCAPED))
    elif trick == 6:
        text = text.replace('"model"', '"Model"', 1)
    return text


def _general(text: str) -> object:
    """What the general path (json.loads + parse_model) makes of an add's payload."""
    try:
        payload = json.loads(text)
    except ValueError:
        return "unreadable"
    if not isinstance(payload, dict):
        return "not an object"
    try:
        return parse_model(payload.get("model"))
    except CatalogError as exc:
        return f"refused: {exc}"


@settings(max_examples=600, deadline=None)
@given(payload_texts())
def test_the_fast_path_never_accepts_what_the_general_path_refuses(text: str) -> None:
    fast = parse_wrapped_model_json(text)
    if fast is None:
        return  # the general path decides, as before
    general = _general(text)
    assert general == fast
    assert not isinstance(general, str)
    assert general.to_definition() == fast.to_definition()


@settings(max_examples=200, deadline=None)
@given(definitions())
def test_a_definition_as_the_commands_store_it_takes_the_fast_path(body: dict[str, Any]) -> None:
    try:
        model = parse_model(body)
    except CatalogError:
        return
    stored = json.dumps({"model": model.to_definition(), "declared_digest": None}, sort_keys=True)
    assert parse_wrapped_model_json(stored) == model
