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

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final, TypeVar

import msgspec
from msgspec import UNSET, Raw, UnsetType
from pydantic import BaseModel

from catalog.documents import Limits, read_json
from catalog.errors import CatalogError
from catalog.model import (
    SLO,
    Capabilities,
    Model,
    PlacementRules,
    Profile,
    Rollout,
    Scaling,
    _parse_duration_cached,
)
from catalog.model_rules import normalize, validate
from catalog.parse import parse_model

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

# Every field UNSET unless present, so that ``model_fields_set`` comes out as
# pydantic's would (the keys the text held), not merely equal values.
# forbid_unknown_fields: pydantic refuses unknown keys (extra="forbid").
# gc=False: these structs hold no cycles and live for one decode.
_STRUCT: dict[str, Any] = {"forbid_unknown_fields": True, "gc": False}


class _Scaling(msgspec.Struct, **_STRUCT):
    min: int | UnsetType = UNSET
    max: int | UnsetType = UNSET


class _Rollout(msgspec.Struct, **_STRUCT):
    max_surge: int | UnsetType = UNSET
    max_unavailable: int | UnsetType = UNSET


class _SLO(msgspec.Struct, **_STRUCT):
    # Only the written form: a duration given as a number takes the general path.
    ttft_p99: str | UnsetType = UNSET
    tpot_p99: str | UnsetType = UNSET


class _Capabilities(msgspec.Struct, **_STRUCT):
    tools: bool | UnsetType = UNSET
    vision: bool | UnsetType = UNSET
    embeddings: bool | UnsetType = UNSET


class _PlacementRules(msgspec.Struct, **_STRUCT):
    priority: int | UnsetType = UNSET
    spread_by: str | UnsetType | None = UNSET
    spread_required: bool | UnsetType = UNSET


class _Profile(msgspec.Struct, **_STRUCT):
    name: str | UnsetType = UNSET
    engine: str | UnsetType = UNSET
    gpu_class: str | UnsetType = UNSET
    tp: int | UnsetType = UNSET
    pp: int | UnsetType = UNSET
    gpus_per_node: int | UnsetType = UNSET
    nodes: int | UnsetType = UNSET
    args: tuple[str, ...] | UnsetType = UNSET
    env: dict[str, str] | UnsetType = UNSET
    min_memory_gb: int | UnsetType = UNSET
    node_selector: dict[str, str] | UnsetType = UNSET
    # msgspec takes a JSON integer for a float and converts it, as pydantic's
    # strict float does (1 -> 1.0); a bool is refused by both.
    weight: float | UnsetType = UNSET
    priority: int | UnsetType = UNSET
    startup_timeout: str | UnsetType = UNSET


class _Model(msgspec.Struct, **_STRUCT):
    name: str | UnsetType = UNSET
    aliases: tuple[str, ...] | UnsetType = UNSET
    source: str | UnsetType = UNSET
    # Sub-objects stay raw text here and are decoded (or found) by that text,
    # the list of profiles as a whole and then one by one; an empty Raw is an
    # absent key (any JSON value is one byte or more).
    profiles: Raw = Raw()
    scaling: Raw = Raw()
    fallbacks: tuple[str, ...] | UnsetType = UNSET
    routing_profile: str | UnsetType = UNSET
    slo: Raw = Raw()
    context_length: int | UnsetType = UNSET
    max_output: int | UnsetType = UNSET
    capabilities: Raw = Raw()
    placement: Raw = Raw()
    rollout: Raw = Raw()


# The same shapes with every key required but the two sections a definition
# leaves out while they are the default: what every stored definition holds
# (``to_definition()``). Decoding into them needs no per-field presence check,
# and the fields set is known; a payload missing a key takes the structs above.
class _ProfileComplete(msgspec.Struct, **_STRUCT):
    name: str
    engine: str
    gpu_class: str
    tp: int
    pp: int
    gpus_per_node: int
    nodes: int
    args: tuple[str, ...]
    env: dict[str, str]
    min_memory_gb: int
    node_selector: dict[str, str]
    weight: float
    priority: int
    startup_timeout: str


class _ModelComplete(msgspec.Struct, **_STRUCT):
    name: str
    aliases: tuple[str, ...]
    source: str
    profiles: Raw
    scaling: Raw
    fallbacks: tuple[str, ...]
    routing_profile: str
    slo: Raw
    context_length: int
    max_output: int
    capabilities: Raw
    placement: Raw = Raw()
    rollout: Raw = Raw()


class _PayloadComplete(msgspec.Struct, **_STRUCT):
    model: _ModelComplete
    declared_digest: str | UnsetType | None = UNSET


class _Payload(msgspec.Struct, **_STRUCT):
    """A stored model.added (v2) or model.replaced (v1) payload, nothing more.

    Any other key takes the general path, which ignores it: the point is that
    every key here has a known, shallow shape, so the limits hold (above).
    """

    model: _Model
    declared_digest: str | UnsetType | None = UNSET


_M = TypeVar("_M", bound=BaseModel)
_set = object.__setattr__


def _construct(cls: type[_M], values: dict[str, Any], fields_set: set[str]) -> _M:
    """A pydantic model from already checked values, as ``model_construct`` builds it,
    without its per-call overhead (defaults are filled by the caller)."""
    obj = cls.__new__(cls)
    _set(obj, "__dict__", values)
    _set(obj, "__pydantic_fields_set__", fields_set)
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def _identity(value: Any) -> Any:
    return value


def _duration(value: Any) -> timedelta:
    # The same parse (and cache) as the model's BeforeValidator; a refusal raises
    # ValueError and the payload takes the general path.
    return _parse_duration_cached(value)


# How a struct's present value becomes the model's (only durations change).
_CONVERT: dict[tuple[type[BaseModel], str], Callable[[Any], Any]] = {
    (SLO, "ttft_p99"): _duration,
    (SLO, "tpot_p99"): _duration,
    (Profile, "startup_timeout"): _duration,
}


def _constant(value: Any) -> Callable[[], Any]:
    def default() -> Any:
        return value

    return default


def _spec(
    cls: type[BaseModel], struct: type[msgspec.Struct]
) -> tuple[tuple[str, Callable[[Any], Any], Callable[[], Any]], ...]:
    """(field, converter, default) for each field of ``cls``, in its order.

    Built from pydantic's own field table, and refused at import if the struct
    does not mirror it exactly: a field added to the model and forgotten here
    must fail loudly, not be decoded as its default.
    """
    if tuple(cls.model_fields) != struct.__struct_fields__:
        raise RuntimeError(
            f"catalog.fast_decode: {struct.__name__} fields {struct.__struct_fields__} do not "
            f"mirror {cls.__name__} fields {tuple(cls.model_fields)}"
        )
    out = []
    for name, info in cls.model_fields.items():
        factory = info.default_factory
        if isinstance(factory, type) and issubclass(factory, BaseModel):
            # A frozen section left out (placement and rollout usually are):
            # one default instance, shared, rather than a pydantic __init__ per model.
            default: Callable[[], Any] = _constant(factory())
        elif factory is not None:
            default = factory  # type: ignore[assignment]
        else:
            default = _constant(info.default)
        out.append((name, _CONVERT.get((cls, name), _identity), default))
    return tuple(out)


_asdict = msgspec.structs.asdict


def _builder(cls: type[_M], struct: type[msgspec.Struct]) -> Callable[[Any], _M]:
    spec = _spec(cls, struct)
    defaults = {name: default for name, _, default in spec}
    converters = {name: convert for name, convert, _ in spec if convert is not _identity}

    def build(decoded: Any) -> _M:
        # asdict (in C) keeps the struct's field order, which is the model's (checked).
        values = _asdict(decoded)
        fields_set: set[str] = set()
        for name, value in values.items():
            if value is UNSET:
                values[name] = defaults[name]()
            else:
                fields_set.add(name)
                convert = converters.get(name)
                if convert is not None:
                    values[name] = convert(value)
        return _construct(cls, values, fields_set)

    return build


def _complete_builder(cls: type[_M], struct: type[msgspec.Struct]) -> Callable[[Any], _M]:
    """The builder for a struct with every key required: every field was given."""
    spec = _spec(cls, struct)
    names = frozenset(name for name, _, _ in spec)
    converters = tuple((name, convert) for name, convert, _ in spec if convert is not _identity)

    def build(decoded: Any) -> _M:
        values = _asdict(decoded)
        for name, convert in converters:
            values[name] = convert(values[name])
        return _construct(cls, values, set(names))

    return build


class _Memo:
    """One kind of sub-object, decoded once per distinct raw text and then shared."""

    __slots__ = ("build", "build_complete", "cache", "decode", "decode_complete", "limit")

    def __init__(
        self,
        cls: type[BaseModel],
        struct: type[msgspec.Struct],
        limit: int,
        complete: type[msgspec.Struct] | None = None,
    ) -> None:
        self.decode = msgspec.json.Decoder(struct).decode
        self.build = _builder(cls, struct)
        self.decode_complete = None if complete is None else msgspec.json.Decoder(complete).decode
        self.build_complete = None if complete is None else _complete_builder(cls, complete)
        self.cache: dict[bytes, Any] = {}
        self.limit = limit

    def get(self, raw: Raw) -> Any:
        key = bytes(raw)
        found = self.cache.get(key)
        if found is None:
            found = self._decode(key)
            # Only what decoded and built is remembered: a refusal raises every time.
            if self.limit > 0:
                if len(self.cache) >= self.limit:
                    self.cache.clear()
                self.cache[key] = found
        return found

    def _decode(self, key: bytes) -> Any:
        if self.decode_complete is not None and self.build_complete is not None:
            try:
                return self.build_complete(self.decode_complete(key))
            except msgspec.ValidationError:
                pass  # a key left out, or refused: the struct with defaults decides
        return self.build(self.decode(key))


class _ListMemo:
    """The list of a model's profiles, by its raw text: most models repeat a list whole."""

    __slots__ = ("cache", "decode", "limit")

    def __init__(self, limit: int) -> None:
        self.decode = msgspec.json.Decoder(tuple[Raw, ...]).decode
        self.cache: dict[bytes, tuple[Profile, ...]] = {}
        self.limit = limit

    def get(self, raw: Raw) -> tuple[Profile, ...]:
        key = bytes(raw)
        found = self.cache.get(key)
        if found is None:
            get = _PROFILES.get
            found = tuple([get(item) for item in self.decode(key)])
            if self.limit > 0:
                if len(self.cache) >= self.limit:
                    self.cache.clear()
                self.cache[key] = found
        return found


_MEMO_LIMIT = 4096
_PROFILES = _Memo(Profile, _Profile, _MEMO_LIMIT, _ProfileComplete)
_PROFILE_LISTS = _ListMemo(_MEMO_LIMIT)
_SECTIONS: dict[str, _Memo] = {
    "scaling": _Memo(Scaling, _Scaling, _MEMO_LIMIT),
    "slo": _Memo(SLO, _SLO, _MEMO_LIMIT),
    "capabilities": _Memo(Capabilities, _Capabilities, _MEMO_LIMIT),
    "placement": _Memo(PlacementRules, _PlacementRules, _MEMO_LIMIT),
    "rollout": _Memo(Rollout, _Rollout, _MEMO_LIMIT),
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
_MODEL_DEFAULTS = {name: default for name, _, default in _MODEL_SPEC}
# One default of each section for every definition that leaves it out, shared as the
# remembered sections are (frozen; catalog.model_rules.validate then knows it by identity).
_SHARED_PLACEMENT = _MODEL_DEFAULTS["placement"]()
_SHARED_ROLLOUT = _MODEL_DEFAULTS["rollout"]()
_ALL_BUT_SECTIONS = frozenset(Model.model_fields) - {"placement", "rollout"}


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
    # In the model's field order, which model_dump follows.
    values = {
        "name": d.name,
        "aliases": d.aliases,
        "source": d.source,
        "profiles": _PROFILE_LISTS.get(d.profiles),
        "scaling": _SCALING(d.scaling),
        "fallbacks": d.fallbacks,
        "routing_profile": d.routing_profile,
        "slo": _SLO_GET(d.slo),
        "context_length": d.context_length,
        "max_output": d.max_output,
        "capabilities": _CAPABILITIES(d.capabilities),
        "placement": placement_value,
        "rollout": rollout_value,
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


class _Removal(msgspec.Struct, **_STRUCT):
    name: str


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
