"""Pydantic models built from decoded msgspec Structs without validating twice
(catalog.stored.fast_decode), and the bounded memos of what was built, by raw JSON text.

``_construct`` sets exactly what pydantic's own validation would set, including
``model_fields_set``; the values come from Structs that already hold the types
pydantic would accept, and ``catalog.definition.model_rules`` then checks the model as a
whole. The equivalence is proven in tests/unit/catalog/test_fast_decode.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, Raw
from pydantic import BaseModel

from catalog.definition.model import SLO, Profile
from catalog.forms.durations import parse_duration

_M = TypeVar("_M", bound=BaseModel)


# BaseModel's four slots, set through their own descriptors: what ``object.__setattr__``
# ends up calling, without looking each name up on every call (replay builds a model
# per stored add). BaseModel has no ``__new__`` of its own (checked here).
assert "__new__" not in BaseModel.__dict__
_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def _construct(cls: type[_M], values: dict[str, Any], fields_set: set[str]) -> _M:
    """A pydantic model from already checked values, as ``model_construct`` builds it,
    without its per-call overhead (defaults are filled by the caller)."""
    obj = _new(cls)
    _set_dict(obj, values)
    _set_fields_set(obj, fields_set)
    _set_extra(obj, None)
    _set_private(obj, None)
    return obj


def _identity(value: Any) -> Any:
    return value


def _duration(value: Any) -> timedelta:
    # The same parse (and memo) as the model's BeforeValidator; a refusal raises
    # ValueError and the payload takes the general path.
    return parse_duration(value)


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
            f"catalog.stored.fast_decode: {struct.__name__} fields {struct.__struct_fields__} "
            f"do not mirror {cls.__name__} fields {tuple(cls.model_fields)}"
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

    __slots__ = ("cache", "decode", "limit", "profiles")

    def __init__(self, limit: int, profiles: _Memo) -> None:
        self.decode = msgspec.json.Decoder(tuple[Raw, ...]).decode
        self.cache: dict[bytes, tuple[Profile, ...]] = {}
        self.limit = limit
        self.profiles = profiles  # each profile through the profiles' own memo

    def get(self, raw: Raw) -> tuple[Profile, ...]:
        key = bytes(raw)
        found = self.cache.get(key)
        if found is None:
            get = self.profiles.get
            found = tuple([get(item) for item in self.decode(key)])
            if self.limit > 0:
                if len(self.cache) >= self.limit:
                    self.cache.clear()
                self.cache[key] = found
        return found
