"""Stored definitions decoded at msgspec's speed, into the models pydantic would give.

Replay decodes every stored add and replacement, and pydantic's strict JSON
validation of one definition costs several times what reading the row does.
This module decodes the payload with msgspec into plain structs that mirror
``Model`` field for field, builds the pydantic objects from them without
validating again, then normalises and validates exactly as ``parse_model``
does.

It answers only when it is sure. Anything it does not accept (not JSON, a
field of another type, an unknown key, a number too large, text too long to
be certain of the general path's limits, a refused definition) gives None from
``decode_definition``, and ``decode_added`` then takes the general path
(``read_json`` and ``parse_model``), so every refusal is pydantic's and reads
as it always has. The property tests (tests/unit/catalog/test_fast_decode.py)
hold it to that: it never accepts what the general path refuses, and what both
accept is an equal model.

Decoded sub-objects repeat across a log (a few distinct profiles among tens of
thousands stored), so each profile and each nested section is remembered by its
raw JSON text: a repeat costs a dictionary look-up instead of a decode. The
remembered objects are frozen pydantic models shared between the models that
hold them; their ``env`` and ``node_selector`` dicts are shared too, which is
safe because nothing edits a definition in place (views copy them).

Pure: no I/O, no logging; module state is only the bounded caches.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from msgspec import UNSET, Raw

from catalog.definition.model import (
    SLO,
    Capabilities,
    Disruption,
    Model,
    PlacementRules,
    Profile,
    Rollout,
    Scaling,
)
from catalog.definition.model_rules import normalize, validate
from catalog.definition.parse import parse_model
from catalog.errors import CatalogError
from catalog.reading.documents import Limits, read_json
from catalog.stored.fast_build import _construct, _ListMemo, _Memo, _spec
from catalog.stored.stored_shapes import (
    _SLO,
    _Capabilities,
    _Disruption,
    _Model,
    _ModelComplete,
    _Payload,
    _PayloadComplete,
    _PlacementRules,
    _Profile,
    _ProfileComplete,
    _Removal,
    _Rollout,
    _Scaling,
)

__all__ = [
    "FAST_MAX_CHARS",
    "cache_sizes",
    "clear_caches",
    "decode_added",
    "decode_definition",
    "decode_general",
    "decode_removal",
    "fast_path_applies",
    "set_memo_limit",
]

# Longer payloads take the general path. A text of N characters holds fewer
# than N JSON values, so below this no payload can exceed the general path's
# node limit (100,000 for stored rows), and the schema below nests at most five
# levels deep, far under its depth limit: the fast path cannot accept a payload
# those limits would refuse. A real definition is well under 2 KiB.
FAST_MAX_CHARS: Final = 65_536
# The deepest a payload this module accepts can nest: payload > model >
# profiles > profile > env.
FAST_MAX_DEPTH: Final = 5

_MEMO_LIMIT = 4096
_PROFILES = _Memo(Profile, _Profile, _MEMO_LIMIT, _ProfileComplete)
_PROFILE_LISTS = _ListMemo(_MEMO_LIMIT, _PROFILES)
_SECTIONS: dict[str, _Memo] = {
    "scaling": _Memo(Scaling, _Scaling, _MEMO_LIMIT),
    "slo": _Memo(SLO, _SLO, _MEMO_LIMIT),
    "capabilities": _Memo(Capabilities, _Capabilities, _MEMO_LIMIT),
    "placement": _Memo(PlacementRules, _PlacementRules, _MEMO_LIMIT),
    "rollout": _Memo(Rollout, _Rollout, _MEMO_LIMIT),
    "disruption": _Memo(Disruption, _Disruption, _MEMO_LIMIT),
}
_MODEL_SPEC = _spec(Model, _Model)
_spec(Model, _ModelComplete)  # the mirror check; _model_complete below names the fields
_DECODE_PAYLOAD = msgspec.json.Decoder(_Payload).decode
_DECODE_COMPLETE = msgspec.json.Decoder(_PayloadComplete).decode
_SCALING = _SECTIONS["scaling"].get
_SLO_GET = _SECTIONS["slo"].get
_CAPABILITIES = _SECTIONS["capabilities"].get
_PLACEMENT = _SECTIONS["placement"].get
_ROLLOUT = _SECTIONS["rollout"].get
_DISRUPTION = _SECTIONS["disruption"].get
# The dictionaries behind them (each memo keeps its one dict: clear() empties it in place).
_PROFILE_LISTS_CACHE = _PROFILE_LISTS.cache
_SCALING_CACHE = _SECTIONS["scaling"].cache
_SLO_CACHE = _SECTIONS["slo"].cache
_CAPABILITIES_CACHE = _SECTIONS["capabilities"].cache
_MODEL_DEFAULTS = {name: default for name, _, default in _MODEL_SPEC}
# One default of each section for every definition that leaves it out, shared as the
# remembered sections are (frozen; catalog.definition.model_rules.validate then knows it
# by identity).
_SHARED_PLACEMENT = _MODEL_DEFAULTS["placement"]()
_SHARED_ROLLOUT = _MODEL_DEFAULTS["rollout"]()
_SHARED_DISRUPTION = _MODEL_DEFAULTS["disruption"]()
_ALL_BUT_SECTIONS = frozenset(Model.model_fields) - {"placement", "rollout", "disruption"}


def _model(decoded: _Model) -> Model:
    values: dict[str, Any] = {}
    fields_set: set[str] = set()
    for name, _convert, default in _MODEL_SPEC:
        value = getattr(decoded, name)
        if value is UNSET or (type(value) is Raw and not value):
            values[name] = default()
            continue
        fields_set.add(name)
        if name == "profiles":
            values[name] = _PROFILE_LISTS.get(value)
        elif type(value) is Raw:
            values[name] = _SECTIONS[name].get(value)
        else:
            values[name] = value
    return _construct(Model, values, fields_set)


def _model_complete(d: _ModelComplete) -> Model:
    """``_model`` for a definition holding every key: written out, the hot path of replay."""
    fields_set = set(_ALL_BUT_SECTIONS)
    placement = d.placement
    if placement:
        fields_set.add("placement")
        placement_value = _PLACEMENT(placement)
    else:
        placement_value = _SHARED_PLACEMENT
    rollout = d.rollout
    if rollout:
        fields_set.add("rollout")
        rollout_value = _ROLLOUT(rollout)
    else:
        rollout_value = _SHARED_ROLLOUT
    disruption = d.disruption
    if disruption:
        fields_set.add("disruption")
        disruption_value = _DISRUPTION(disruption)
    else:
        disruption_value = _SHARED_DISRUPTION
    # The memos' own look-ups first (a hit is nearly every definition), their get() on a miss.
    raw = d.profiles
    profiles = _PROFILE_LISTS_CACHE.get(bytes(raw)) or _PROFILE_LISTS.get(raw)
    raw = d.scaling
    scaling = _SCALING_CACHE.get(bytes(raw)) or _SCALING(raw)
    raw = d.slo
    slo = _SLO_CACHE.get(bytes(raw)) or _SLO_GET(raw)
    raw = d.capabilities
    capabilities = _CAPABILITIES_CACHE.get(bytes(raw)) or _CAPABILITIES(raw)
    # In the model's field order, which model_dump follows.
    values = {
        "name": d.name,
        "aliases": d.aliases,
        "source": d.source,
        "profiles": profiles,
        "scaling": scaling,
        "fallbacks": d.fallbacks,
        "routing_profile": d.routing_profile,
        "slo": slo,
        "context_length": d.context_length,
        "max_output": d.max_output,
        "capabilities": capabilities,
        "placement": placement_value,
        "rollout": rollout_value,
        "disruption": disruption_value,
    }
    return _construct(Model, values, fields_set)


def fast_path_applies(limits: Limits) -> bool:
    """Whether the fast path's bounds lie within ``limits`` (see ``FAST_MAX_CHARS``)."""
    return (
        limits.max_nodes >= FAST_MAX_CHARS
        and limits.max_bytes >= FAST_MAX_CHARS
        and limits.max_depth >= FAST_MAX_DEPTH
    )


def decode_definition(raw: str | bytes) -> Model | None:
    """The normalised, validated model under ``"model"`` in a stored payload, or None.

    A drop-in for ``parse_wrapped_model_json``, narrower: None whenever this
    decoder is not certain (the caller then takes the general path, which
    accepts or refuses with its usual reason). The caller must read with limits
    for which ``fast_path_applies`` is true, as ``decode_added`` checks.
    """
    if len(raw) > FAST_MAX_CHARS:
        return None
    try:
        try:
            built = _model_complete(_DECODE_COMPLETE(raw).model)
        except msgspec.ValidationError:
            # A key left out (an older or hand-written row), or a value refused:
            # the structs with defaults decide.
            built = _model(_DECODE_PAYLOAD(raw).model)
        model = normalize(built)
        validate(model)
    except Exception:
        # Whatever went wrong (a decode error, a refused duration, a refused
        # definition, or a surprise), the answer is "not sure": the general
        # path decides, and names the reason if there is one.
        return None
    return model


_DECODE_REMOVAL = msgspec.json.Decoder(_Removal).decode


def decode_removal(raw: str | bytes) -> str | None:
    """The name in a stored removal's payload (``{"name": ...}`` and nothing else), or
    None when not sure: the caller then reads it the general way (``read_json``).

    An object with one string member is two JSON values one level deep, far within
    the general path's limits, and where msgspec accepts such a text ``json.loads``
    reads the same name (a repeated key: the last; tests/unit/catalog/test_fast_decode.py).
    """
    if len(raw) > FAST_MAX_CHARS:
        return None
    try:
        return _DECODE_REMOVAL(raw).name
    except msgspec.DecodeError:
        return None


def decode_general(raw: str | bytes, limits: Limits) -> Model:
    """The general path, as replay takes it for a current-version definition.

    Raises ``CatalogError`` with the reason replay records for a skipped row.
    """
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CatalogError(f"payload: not UTF-8 text ({exc.reason})") from None
    payload = read_json(raw, "payload", limits)
    if not isinstance(payload, dict):
        # The same words replay uses (it raises them as UnreadableEvent).
        raise CatalogError("payload is not a JSON object")
    return parse_model(payload.get("model"))


def decode_added(raw: str | bytes, limits: Limits) -> Model:
    """Decode a stored definition payload (model.added v2, model.replaced v1).

    The fast path when it is sure, else the general path: the same model either
    way, and for a payload that cannot be accepted a ``CatalogError`` carrying
    pydantic's (and ``read_json``'s) reason. ``limits`` are the general path's
    (replay's ``STORED_LIMITS``).
    """
    if fast_path_applies(limits):
        model = decode_definition(raw)
        if model is not None:
            return model
    return decode_general(raw, limits)


def clear_caches() -> None:
    """Forget every remembered sub-object (for measurements and tests)."""
    _PROFILES.cache.clear()
    _PROFILE_LISTS.cache.clear()
    for memo in _SECTIONS.values():
        memo.cache.clear()


def set_memo_limit(limit: int) -> None:
    """How many distinct sub-objects of each kind to remember (0: none, to measure without)."""
    clear_caches()
    _PROFILES.limit = limit
    _PROFILE_LISTS.limit = limit
    for memo in _SECTIONS.values():
        memo.limit = limit


def cache_sizes() -> dict[str, int]:
    """How many distinct sub-objects are remembered, by kind."""
    return {"profiles": len(_PROFILES.cache), "profile lists": len(_PROFILE_LISTS.cache)} | {
        k: len(m.cache) for k, m in _SECTIONS.items()
    }
