"""Response shapes, for the OpenAPI document (``/openapi.json``) and its clients.

Routes build plain dicts (``views``) and these describe them; the fuzz tests
check every answer against this document.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from catalog.definition.identifiers import Grammar
from catalog.definition.model import MAX_SPREAD_BY
from catalog.forms.printable import WHITESPACE_CLASS, character_class


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


class ReportAnswer(NodeState):
    """The answer to a node report: the node, and what its heartbeats name."""

    # The id of this report: a heartbeat naming it renews the node's lease.
    report_id: str | None = None
    # The heartbeat listener's port on this server (None: send full reports only).
    heartbeat_port: int | None = None
    # The node's placement generation (llmgw.api.reports.placement_generations): its
    # placements have not changed while its heartbeats are answered the same (None: not
    # known yet).
    placements_generation: int | None = None


class SecretReference(_Open):
    """An env value the agent resolves on its node: only the secret's name is served."""

    secret: str


class EngineLaunch(_Open):
    name: str
    engine: str
    gpu_class: str | None
    tp: int
    pp: int
    gpus_per_node: int
    nodes: int
    args: list[str]
    env: dict[str, str | SecretReference]
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
    # The model version (definition digest) the replica was placed with; ``engine``
    # is that version's, so a catalog change never changes it ("" before versions).
    version: str
    # Non-empty while the replica is being moved, surge-first, by defragmentation or a
    # spread repair: why ("to make room for model X, profile P on node N").
    moving: str = ""
    # placed (nothing reported yet), starting, ready, failed; unreported when the
    # node's agent does not report replica states (it then counts as ready).
    state: Literal["placed", "starting", "ready", "failed", "unreported"]
    state_since: str
    endpoint: str | None
    message: str
    engine: EngineLaunch | None
    # The router's capacity weight in force: the profile's declared weight, else the
    # capacity `llmgw bench --record` measured, else 1 (null: the model is gone).
    weight: float | None = None
    # What one request may really use on the replica's engine (llama.cpp's context per
    # slot, vLLM's max_model_len), read by its agent once ready; None: not known.
    effective_context_length: int | None
    # How the engine came to it: "--ctx-size 8192 / --parallel 4 = 2048".
    context_detail: str
    # Set when the catalog's context_length exceeds effective_context_length.
    context_warning: str | None


class FleetModel(_Open):
    """Per model: replicas wanted (scaling.min), placed, ready (or unreported), and
    unplaced, each with the reason the scheduler's last round gave; and resilience."""

    name: str
    declared: bool
    wanted: int
    placed: int
    ready: int
    unplaced: int
    unplaced_reasons: list[dict[str, Any]]
    # Under the placements now, as /v1/catalog and `llmgw models` give it; null when no
    # replica of the model is wanted.
    resilience: dict[str, Any] | None = None


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


class FleetReasons(BaseModel):
    """The scheduler round whose unplaced replicas and reasons ``/v1/fleet`` shows."""

    planned_at: str | None
    catalog_position: int | None
    # The last recorded round (placement_rounds) when they were written; 0 if none.
    recorded_round: int | None
    unreadable: str | None = None


class Fleet(BaseModel):
    """``GET /v1/fleet``: what runs and why not, in one read (the dashboard's page)."""

    catalog_position: int
    # The placement log's last position when this was read: follow the stream from
    # here (``placements_after``) for what changed since.
    placement_head: int
    checked_at: str
    policy: dict[str, float]
    # Where each model's ``unplaced_reasons`` come from: the scheduler's round that
    # gave them (they held in every round since); null before its first round, or
    # when the stored row cannot be read (``unreadable`` then says why).
    reasons_from: FleetReasons | None
    models: list[FleetModel]
    nodes: list[FleetNode]
    placements: list[PlacementEntry]


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    schema_revision: str | None
    catalog_position: int
    # The declared catalog file as this server last read it: "loaded", or "refused" with
    # where and why (the previous catalog keeps running). None when no file is given.
    declared: dict[str, Any] | None = None


# -- the identifier grammar, as the document states it ----------------------------------
#
# A request the document calls valid must not be refused (issue 11, item 10): a
# ``?reason=`` with a control character, a node or model name outside its grammar,
# or a duration such as "" were valid by the document and answered 422. Each
# grammar of ``catalog.definition.identifiers`` is written here as a JSON Schema pattern, so
# the document refuses exactly what the server does.


# Printable text as ``catalog.forms.printable`` defines it for every path, written out as
# the class of its printable ranges at a fixed Unicode version: the same set the
# server checks, character for character (tests/unit/catalog/test_printable.py),
# and a class Hypothesis, hence schemathesis, draws from at ordinary speed.
PRINTABLE_TEXT = f"^{character_class()}*$"
# The pattern is exact but no one reads 700 ranges: each such string also names its rule
# in a ``format`` (JSON Schema: an annotation), which a generator may draw from by name
# (tests/api/test_api_fuzz.py does, since Hypothesis builds a class code point by code
# point, over a second per pattern); the pattern still decides.
PRINTABLE = "printable"
HTTP_URL = "printable-http-url"
NODE_LABEL = "node-label"


def printable_schema(max_length: int) -> dict[str, Any]:
    """A string of at most ``max_length`` printable characters."""
    return {
        "type": "string",
        "format": PRINTABLE,
        "maxLength": max_length,
        "pattern": PRINTABLE_TEXT,
    }


def http_url_schema(max_length: int) -> dict[str, Any]:
    """An http:// or https:// URL of printable characters, such as http://10.0.0.7:8000."""
    return {
        "type": "string",
        "format": HTTP_URL,
        "minLength": len("http://x"),
        "maxLength": max_length,
        "pattern": f"^https?://{character_class()}*$",
    }


def grammar_schema(grammar: Grammar, *, empty: bool | None = None) -> dict[str, Any]:
    """The JSON Schema of a string in ``grammar``; ``empty`` also allows "" (a default)."""
    may_be_empty = grammar.may_be_empty if empty is None else empty
    if grammar.pattern is None:
        schema = printable_schema(grammar.max_length)
    else:
        body = f"(?:{grammar.pattern.pattern})"
        pattern = f"^{body}?$" if may_be_empty else f"^{body}$"
        schema = {"type": "string", "maxLength": grammar.max_length, "pattern": pattern}
    if not may_be_empty:
        schema["minLength"] = 1
    return schema


# A duration as ``catalog.forms.durations`` reads it: seconds, or parts such as 1h30m, with
# what ``str.strip`` removes around it (not ``\s``, which ECMA-262 reads otherwise).
DURATION_PATTERN = (
    f"^{WHITESPACE_CLASS}*(?:[0-9]+(?:\\.[0-9]+)?|(?:[0-9]+(?:\\.[0-9]+)?(?:us|ms|h|m|s))+)"
    f"{WHITESPACE_CLASS}*$"
)


def spread_by_schema() -> dict[str, Any]:
    """``placement.spread_by`` as ``catalog.definition.model_rules`` takes it: stripped, then a node
    label of printable characters without spaces (the length is the stripped one's)."""
    label = f"{character_class(space=False)}{{0,{MAX_SPREAD_BY}}}"
    return {
        "type": "string",
        "format": NODE_LABEL,
        "pattern": f"^{WHITESPACE_CLASS}*{label}{WHITESPACE_CLASS}*$",
    }


# The printable classes are ~5 KB each and a document names them at every printable
# field: written out each time they made /openapi.json three times its size. Served,
# each is one component, referenced where it applies (``share_patterns``); the
# functions above still return the whole schema, which the unit tests check as is.
SHARED = {
    PRINTABLE: "PrintableText",
    HTTP_URL: "PrintableHttpUrl",
    NODE_LABEL: "SpreadByLabel",
}


def share_patterns(doc: dict[str, Any], components: dict[str, Any]) -> None:
    """Each pattern of a format in ``SHARED`` moved to its one component, the schemas
    that carried it referring to it (``allOf``, so their own bounds still apply)."""
    shared: dict[str, dict[str, Any]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = (
                SHARED.get(node.get("format", "")) if isinstance(node.get("format"), str) else None
            )
            if name is not None and "pattern" in node:
                pattern = node.pop("pattern")
                first = shared.setdefault(name, {"type": "string", "pattern": pattern})
                # One format, one pattern: a second would be silently dropped.
                assert first["pattern"] == pattern, f"two patterns for format {node['format']}"
                node.setdefault("allOf", []).append({"$ref": f"#/components/schemas/{name}"})
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    components.update(shared)
