"""The shapes a stored definition's JSON may take, as msgspec Structs (catalog.stored.fast_decode).

Each mirrors a pydantic class of ``catalog.definition.model`` field for field (the decoder
checks this when it is imported, so a field added to a model and not here
fails at once). The ``Complete`` variants are the stored form, every field
present, which decodes without looking up defaults.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

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


class _Disruption(msgspec.Struct, **_STRUCT):
    max_unavailable: int | str | UnsetType | None = UNSET
    movable: bool | UnsetType = UNSET
    repair_spread: bool | UnsetType = UNSET


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
    slots: int | UnsetType = UNSET
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
    disruption: Raw = Raw()


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
    slots: int
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
    disruption: Raw = Raw()


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


class _Removal(msgspec.Struct, **_STRUCT):
    name: str
