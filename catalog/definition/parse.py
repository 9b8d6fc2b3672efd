"""From raw data (YAML or JSON) to a normalised, validated model.

Pydantic's own errors are precise but speak in its vocabulary; an operator
wants the model, the field and the fix. This is the translation.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from catalog.definition.model import Model, Profile
from catalog.definition.model_rules import normalize, validate
from catalog.errors import CatalogError

_KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "model": frozenset(Model.model_fields),
    "profile": frozenset(Profile.model_fields),
}


def parse_model(raw: object, *, origin: str = "") -> Model:
    """Parse, normalise and validate one model definition.

    ``origin`` says where the definition came from (a file and index) and is
    prefixed to every refusal, so a refusal of a declared model points at the
    line to edit.
    """
    prefix = f"{origin}: " if origin else ""
    if not isinstance(raw, Mapping):
        raise CatalogError(
            f"{prefix}a model definition must be a mapping of fields, not {type(raw).__name__}"
        )
    name = raw.get("name")
    label = f"model {name!r}" if isinstance(name, str) and name else "a model with no name"
    try:
        model = Model.model_validate(dict(raw))
    except ValidationError as exc:
        raise _translate(exc, raw, label, prefix) from None
    model = normalize(model)
    try:
        validate(model)
    except CatalogError as exc:
        if not prefix:
            raise
        raise CatalogError(
            prefix + exc.message, model=exc.model, profile=exc.profile, field=exc.field
        ) from None
    return model


class _Wrapped(BaseModel):
    """A JSON object holding a model definition under ``"model"``; other keys are not read."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    model: Model


def parse_wrapped_model_json(text: str) -> Model | None:
    """The definition under ``"model"`` in a JSON object, as ``parse_model`` would return it.

    A fast path for reading back what was stored (each event of a replay): the
    text is validated in one pass by pydantic's JSON parser, with no
    intermediate dicts, then normalised and validated exactly as
    ``parse_model`` does. It answers only when everything is in order; for
    anything else (not JSON, not an object, no ``"model"``, an invalid or
    refused definition) it returns None, and the caller takes the general path
    (``json.loads`` and ``parse_model``), which refuses with the usual,
    precise reason. So a definition is never accepted here that
    ``parse_model`` would refuse, and a refusal always reads the same.
    """
    try:
        model = normalize(_Wrapped.model_validate_json(text).model)
        validate(model)
    except (ValidationError, CatalogError, ValueError):
        return None
    return model


def _translate(
    exc: ValidationError, raw: Mapping[Any, Any], label: str, prefix: str
) -> CatalogError:
    errors = exc.errors()
    problems = [_describe(err, _profile_name(raw, tuple(err["loc"]))) for err in errors]
    first_loc = tuple(errors[0]["loc"]) if errors else ()
    name = raw.get("name")
    return CatalogError(
        f"{prefix}{label}: " + "; ".join(problems),
        model=name if isinstance(name, str) else None,
        profile=_profile_name(raw, first_loc),
        field=_dotted(first_loc) or None,
    )


def _profile_name(raw: Mapping[Any, Any], loc: tuple[Any, ...]) -> str | None:
    """The name of the profile an error is in, so the message can say which."""
    if len(loc) < 2 or loc[0] != "profiles" or not isinstance(loc[1], int):
        return None
    profiles = raw.get("profiles")
    if not isinstance(profiles, list) or loc[1] >= len(profiles):
        return None
    profile = profiles[loc[1]]
    name = profile.get("name") if isinstance(profile, Mapping) else None
    return name if isinstance(name, str) and name else None


def _describe(err: Any, profile: str | None) -> str:
    loc = tuple(err["loc"])
    field = _dotted(loc)
    if profile is not None:
        field = f"profile {profile!r} ({field})"
    if err["type"] == "extra_forbidden":
        known = _KNOWN_FIELDS["profile" if "profiles" in loc else "model"]
        if len(loc) >= 2 and loc[-2] in {
            "scaling",
            "slo",
            "capabilities",
            "placement",
            "rollout",
            "disruption",
        }:
            known = _nested_fields(str(loc[-2]))
        hint = difflib.get_close_matches(str(loc[-1]), sorted(known), n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return f"{field}: unknown field{suggestion} (known: {', '.join(sorted(known))})"
    shown = repr(err.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{field}: {err['msg']} (got {shown}){_write_as(err['type'], loc)}"


# What to write instead, for the values a strict definition refuses by their type: the
# type's own message says what was expected, not how to write it in YAML.
_WRITE_AS = {
    "int_type": "a whole number, unquoted, e.g. `{key}: 2`",
    "int_parsing": "a whole number, unquoted, e.g. `{key}: 2`",
    "int_from_float": "a whole number, unquoted, e.g. `{key}: 2`",
    "bool_type": "true or false, unquoted",
    "bool_parsing": "true or false, unquoted",
    "float_type": "a number, unquoted, e.g. `{key}: 1.5`",
    "float_parsing": "a number, unquoted, e.g. `{key}: 1.5`",
    "string_type": 'text, quoted if YAML would read it as something else, e.g. `{key}: "8"`',
}


def _write_as(kind: str, loc: tuple[Any, ...]) -> str:
    advice = _WRITE_AS.get(kind)
    if advice is None or not loc:
        return ""
    key = loc[-1]
    if not (isinstance(key, str) and key.isidentifier() and len(key) <= 40):
        # An item of a list, or a key the definition chose (an env variable, a label):
        # the advice without an example written with it.
        advice = advice.split(", e.g.")[0]
    return "; write " + advice.format(key=key)


def _nested_fields(section: str) -> frozenset[str]:
    annotation = Model.model_fields[section].annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return frozenset(annotation.model_fields)
    return frozenset()


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
