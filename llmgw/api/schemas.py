"""Response shapes, for the OpenAPI document (``/openapi.json``) and its clients.

Routes build plain dicts (``views``) and these describe them; the fuzz tests
check every answer against this document.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from catalog.identifiers import Grammar


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ModelCapabilities(BaseModel):
    tools: bool
    vision: bool
    embeddings: bool


class OpenAIModel(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    aliases: list[str]
    context_length: int
    max_output: int
    capabilities: ModelCapabilities
    declared: bool


class OpenAIModelList(BaseModel):
    object: Literal["list"]
    data: list[OpenAIModel]


class CatalogEntry(_Open):
    """A full definition with every default applied (see the README's table), and
    whether it is declared in the configuration file."""

    name: str
    aliases: list[str]
    source: str
    profiles: list[dict[str, Any]]
    scaling: dict[str, Any]
    fallbacks: list[str]
    declared: bool
    # Replicas wanted (scaling.min), placed, and ready (or unreported).
    replicas: dict[str, int]
    # The fewest node losses (and spread_by domain losses) that leave it no replica,
    # under the placements now; null for a model the scheduler does not place.
    resilience: dict[str, Any] | None


class Event(BaseModel):
    position: int
    event_id: str
    command_id: str
    type: str
    schema_version: int
    model: str | None
    actor: str
    reason: str
    recorded_at: str
    payload: Any


class EventPage(BaseModel):
    events: list[Event]
    # Pass as ?after= for the next page; there is no more when next_after >= head.
    next_after: int
    head: int


class CommandOutcome(BaseModel):
    """What a change recorded (or, for a repeated key, what the first attempt recorded)."""

    already_recorded: bool
    events: list[Event]
    position: int


class ApplyOutcome(BaseModel):
    """What ``PUT /v1/catalog/models/{name}`` did (as ``llmgw apply --json``, plus the
    events): ``added``, ``replaced`` or ``unchanged`` (nothing written: no events,
    ``position`` null), and the change in ``llmgw diff --json``'s shape."""

    outcome: Literal["added", "replaced", "unchanged"]
    model: str
    position: int | None
    already_recorded: bool
    diff: dict[str, Any]
    events: list[Event]


class NodeState(BaseModel):
    name: str
    gpu_class: str | None
    gpus: int
    gpus_reserved: int
    memory_gb: float | None
    labels: dict[str, str]
    fabric: str | None
    reported_at: str
    stale: bool
    state: Literal["fresh", "stale", "lost"]
    # "-" in service, "cordoned", or "draining (k replicas left)"; see ``cordon``.
    service: str
    cordon: dict[str, str] | None
    replicas: int


class EngineLaunch(_Open):
    name: str
    engine: str
    gpu_class: str | None
    tp: int
    pp: int
    gpus_per_node: int
    nodes: int
    args: list[str]
    env: dict[str, str]
    model_path: str
    served_model_name: str


class PlacementEntry(BaseModel):
    model: str
    replica: int
    profile: str
    nodes: list[str]
    gpus_per_node: int
    gpu_class: str | None
    fingerprint: str
    # placed (nothing reported yet), starting, ready, failed; unreported when the
    # node's agent does not report replica states (it then counts as ready).
    state: Literal["placed", "starting", "ready", "failed", "unreported"]
    state_since: str
    endpoint: str | None
    message: str
    engine: EngineLaunch | None


class FleetModel(_Open):
    """Per model: replicas wanted (scaling.min), placed, ready (or unreported), and
    unplaced, each with the reason the daemon's next round would give."""

    name: str
    declared: bool
    wanted: int
    placed: int
    ready: int
    unplaced: int
    unplaced_reasons: list[dict[str, Any]]


class FleetNode(_Open):
    name: str
    gpu_class: str | None
    gpus: int
    gpus_reserved: int
    gpus_used: int
    gpus_free: int
    replicas: int
    state: Literal["fresh", "stale", "lost"]
    cordoned: bool
    cordon: Literal["cordoned", "draining"] | None


class Fleet(BaseModel):
    """``GET /v1/fleet``: what runs and why not, in one read (the dashboard's page)."""

    catalog_position: int
    # The placement log's last position when this was read: follow the stream from
    # here (``placements_after``) for what changed since.
    placement_head: int
    checked_at: str
    policy: dict[str, float]
    models: list[FleetModel]
    nodes: list[FleetNode]
    placements: list[PlacementEntry]


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    schema_revision: str | None
    catalog_position: int


# -- the identifier grammar, as the document states it ----------------------------------
#
# A request the document calls valid must not be refused (issue 11, item 10): a
# ``?reason=`` with a control character, a node or model name outside its grammar,
# or a duration such as "" were valid by the document and answered 422. Each
# grammar of ``catalog.identifiers`` is written here as a JSON Schema pattern, so
# the document refuses exactly what the server does.


# What "printable text" refuses most often, written with escapes ECMA and Python
# regexes read alike: C0 and C1 controls, DEL, and the invisible, bidi and
# line-separator characters that forged or reversed rows of ``llmgw history``. The
# exact rule is ``str.isprintable`` (unassigned and private-use code points too), and
# a class of every printable range (700 of them) made schemathesis take seconds a
# string; the server's 422 for the rest is documented on each route.
NOT_PRINTABLE = r"\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff"


def grammar_schema(grammar: Grammar, *, empty: bool | None = None) -> dict[str, Any]:
    """The JSON Schema of a string in ``grammar``; ``empty`` also allows "" (a default)."""
    may_be_empty = grammar.may_be_empty if empty is None else empty
    body = f"(?:{grammar.pattern.pattern})" if grammar.pattern is not None else None
    if body is None:
        pattern = f"^[^{NOT_PRINTABLE}]*$"
    else:
        pattern = f"^{body}?$" if may_be_empty else f"^{body}$"
    schema: dict[str, Any] = {"type": "string", "maxLength": grammar.max_length, "pattern": pattern}
    if not may_be_empty:
        schema["minLength"] = 1
    return schema


# A duration as ``catalog.durations`` reads it: seconds, or parts such as 1h30m.
DURATION_PATTERN = r"^\s*(?:\d+(?:\.\d+)?|(?:\d+(?:\.\d+)?(?:us|ms|h|m|s))+)\s*$"
