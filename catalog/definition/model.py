"""A model definition: what a model is, how it can run, and how many copies to keep.

The field names are the YAML keys operators write in ``catalog.yaml`` and in a
runtime definition; the two are the same shape on purpose, so a model tried at
runtime can be moved into reviewed configuration by copying it.

Defaults are applied in one place (``catalog.definition.model_rules.normalize``) and
checks in another (``catalog.definition.model_rules.validate``), in that order, as the Go
control plane did. Parsing refuses
unknown fields: a typo such as ``gpu_clas`` must stop the change, not be
silently dropped and turn a GPU profile into a CPU one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, Strict
from pydantic_core import PydanticCustomError

from catalog.definition.engine_names import KNOWN_ENGINES
from catalog.definition.routing_profiles import KNOWN as ROUTING_PROFILES
from catalog.definition.views import EngineProfile, PlacementProfile
from catalog.forms.durations import format_duration, parse_duration
from catalog.secrecy.secret_words import SECRET_NAMES_PATTERN, SECRET_PATTERN

T = TypeVar("T")

# Written as operators write it, held as a timedelta; parse and format remember
# their answers (catalog.forms.durations), since replay and every add meet the same few.
Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
]

# A list in YAML or JSON, held as a tuple so a definition cannot change in place.
# Only the container is lax: its items stay strict.
Seq = Annotated[tuple[T, ...], Strict(False)]

DEFAULT_ENGINE = "vllm"
# Upper bounds no real definition reaches; above them a number is a typo.
MAX_REPLICAS = 10_000
MAX_PARALLEL = 1_024
MAX_MEMORY_GB = 1 << 20
# Requests one replica's engine serves at once: no engine runs this many slots.
MAX_SLOTS = 4_096
# Loading a large model across nodes takes tens of minutes; twenty is the
# default the Go control plane used, and profiles that need more say so.
DEFAULT_STARTUP_TIMEOUT = timedelta(minutes=20)
_ZERO = timedelta(0)

# Strict: a YAML "8" (a string) is not silently an int, and a boolean is not a
# number. Frozen: a definition handed out by the catalog cannot be edited in
# place behind the catalog's back.
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


def cpu_capable(engine: str) -> bool:
    """Whether an engine can serve a model without a GPU.

    llama.cpp is the one that can, and it is what makes a cluster with no cards
    testable end to end.
    """
    return engine == "llamacpp"


class Scaling(BaseModel):
    """How many replicas a model should have."""

    model_config = _STRICT

    min: int = 0
    max: int = 0


class Rollout(BaseModel):
    """How a model's replicas are replaced when what they run changes, or their node drains.

    Surge-first by default: one extra replica is started and must report ready
    before an old one is stopped, so the model never has fewer ready replicas
    than ``scaling.min`` while there is room for the extra one. Where there is
    no room, ``max_unavailable`` lets that many be stopped first instead.
    """

    model_config = _STRICT

    # How many replicas beyond the wanted count may run during the change.
    max_surge: int = 1
    # How many of the wanted replicas may be not ready during the change.
    max_unavailable: int = 0


class Disruption(BaseModel):
    """How far defragmentation and spread repair may disturb a model (``disruption:``).

    Moving a replica is surge-first (the new copy runs and reports ready before the
    old one stops), so a move never lowers the replicas ready; the budget still
    counts a replica in motion as unavailable, the worst case if its new copy
    never comes up. ``max_unavailable`` (a count, or ``"N%"`` of the wanted
    replicas, rounded down) caps how many may be in motion at once; absent, any
    number may, as long as the model keeps ``scaling.min`` ready without them.
    ``movable: false`` never moves the model's replicas. ``repair_spread`` opts the
    model into having a worsened spread repaired (two replicas on one node after a
    node loss) once a node with room returns, one move at a time.
    """

    model_config = _STRICT

    max_unavailable: int | str | None = None
    movable: bool = True
    repair_spread: bool = False


class SLO(BaseModel):
    """The latency a model is expected to meet; benchmarks measure capacity against it."""

    model_config = _STRICT

    ttft_p99: Duration = timedelta(0)
    tpot_p99: Duration = timedelta(0)


class Capabilities(BaseModel):
    """What a client may ask a model for, beyond plain completion.

    These are the operator's claims, not discoveries: there is no way to ask an
    engine what its model can do. The reason they exist is that a model given a
    tools array it cannot use answers in prose, and every client then behaves
    as though the model were broken.
    """

    model_config = _STRICT

    tools: bool = False
    vision: bool = False
    embeddings: bool = False


class PlacementRules(BaseModel):
    """How the scheduler treats a model's replicas as a whole (``placement:``).

    ``priority`` decides the order models claim hardware and who may preempt
    whom: a missing replica may evict replicas of models with a strictly lower
    priority. ``spread_by`` names a node label (``zone``, ``rack``) whose values
    the replicas are spread over as evenly as possible, so that losing one
    zone does not take the model down; without it they still go on distinct
    nodes while a fitting node without one exists. ``spread_required`` leaves a
    replica unplaced, and says why, rather than break that spread.
    """

    model_config = _STRICT

    priority: int = 0
    spread_by: str | None = None
    spread_required: bool = False


_DEFAULT_PLACEMENT = PlacementRules()
_DEFAULT_ROLLOUT = Rollout()
_DEFAULT_DISRUPTION = Disruption()
# Priorities beyond this are typos; Kubernetes caps user priorities at 1e9 too.
MAX_PRIORITY = 1_000_000_000
# placement.spread_by names a node label: printable, no spaces, as long as a host name.
MAX_SPREAD_BY = 253


class SecretRef(BaseModel):
    """An env value held by the agent on its node, named here (``{secret: hf-token}``).

    The catalog stores and shows only the name; see ``catalog.secrecy.secrets``.
    """

    model_config = _STRICT

    # The grammar is checked by the rules (catalog.definition.model_rules), with a refusal that
    # says what a name may hold; the schema states it for clients.
    secret: str = Field(json_schema_extra={"pattern": SECRET_PATTERN, "maxLength": 128})


def _env_value(value: object) -> object:
    # One plain refusal rather than a union's two (a string, or a SecretRef).
    if isinstance(value, str | SecretRef):
        return value
    if isinstance(value, dict):
        if set(value) == {"secret"} and isinstance(value["secret"], str):
            return value
        raise PydanticCustomError(
            "env_reference", "a mapping in env is a secret's name and nothing else: {secret: NAME}"
        )
    # The type a plain value's refusal has always had, and so its advice (catalog.definition.parse).
    raise PydanticCustomError(
        "string_type", "Input should be text, or a secret the agent holds: {secret: NAME}"
    )


# What a profile's env maps a variable to: a plain value, or a secret's name.
EnvValue = Annotated[str | SecretRef, BeforeValidator(_env_value)]


def _secret_names_take_references(schema: dict[str, Any]) -> None:
    # In the schema: a variable whose name looks like a secret's takes only a reference.
    refs = [s for s in schema.get("additionalProperties", {}).get("anyOf", []) if "$ref" in s]
    if refs:
        schema["patternProperties"] = {SECRET_NAMES_PATTERN: refs[0]}


class Profile(BaseModel):
    """How a model runs on one GPU class (or on CPU, for an engine that can)."""

    model_config = _STRICT

    name: str = ""
    # One of the engines agents run (catalog.definition.engines); empty: the default, vllm.
    engine: str = Field(default="", json_schema_extra={"enum": ["", *KNOWN_ENGINES]})
    gpu_class: str = ""
    tp: int = 0
    pp: int = 0
    # Defaults to TP / nodes: a single-node profile uses TP cards on one node.
    gpus_per_node: int = 0
    # Above 1 makes this a multi-node profile, which needs nodes sharing a fabric.
    nodes: int = 0
    args: Seq[str] = ()
    # A secret is given by reference ({secret: name}), never as a plain value: the
    # schema says so for names that look like a secret's (catalog.secrecy.secrets).
    env: dict[str, EnvValue] = Field(
        default_factory=dict,
        json_schema_extra=_secret_names_take_references,
    )
    # The host RAM this profile needs: the weights, the KV cache for the whole
    # context pool and the engine's overhead. Small for a GPU profile, the whole
    # working set for a CPU one; wrong means an OOM on a node that reported
    # itself healthy. Zero is unconstrained, which every older profile is.
    min_memory_gb: int = 0
    # Restricts the profile to nodes carrying every one of these labels with
    # these values. A CPU profile otherwise fits everywhere, which is right for
    # a 0.5B model and wrong for a 14B one: the operator says which nodes are
    # meant for it rather than the scheduler guessing.
    node_selector: dict[str, str] = Field(default_factory=dict)
    # The router's capacity weight; it should come from a benchmark, not a guess.
    weight: float = 0.0
    # Requests one replica answers at once (its engine's slots), for the gateway's queue:
    # 0 reads it from the engine's args (vLLM's --max-num-seqs, llama.cpp's --parallel,
    # the sim's --slots), and with neither the gateway never holds a request back.
    slots: int = 0
    # Orders profiles during placement: the highest that fits wins.
    priority: int = 0
    # Per profile, because a 70B model across two nodes takes tens of minutes
    # to load and a 0.5B one seconds.
    startup_timeout: Duration = timedelta(0)

    @property
    def cpu_only(self) -> bool:
        """Whether this profile needs no GPUs.

        Naming no GPU class is how a profile says so, and only an engine that can
        serve without a card may leave it out: otherwise an omitted class would
        quietly become a replica placed on a machine with no hardware to run it.
        """
        return self.gpu_class == "" and cpu_capable(self.engine)

    def placement_view(self) -> PlacementProfile:
        return PlacementProfile(
            name=self.name,
            engine=self.engine,
            gpu_class=None if self.cpu_only else self.gpu_class,
            gpus_per_node=self.gpus_per_node,
            nodes=self.nodes,
            priority=self.priority,
            node_selector=dict(self.node_selector),
            min_memory_gb=self.min_memory_gb,
        )


class Model(BaseModel):
    """A catalog entry as clients see it."""

    model_config = _STRICT

    name: str = ""
    aliases: Seq[str] = ()
    # The weights path or a HuggingFace id.
    source: str = ""
    profiles: Seq[Profile] = ()
    scaling: Scaling = Field(default_factory=Scaling)
    fallbacks: Seq[str] = ()
    # How the router scores endpoints for this model (catalog.definition.routing_profiles); empty:
    # the default, least-loaded.
    routing_profile: str = Field(default="", json_schema_extra={"enum": ["", *ROUTING_PROFILES]})
    slo: SLO = Field(default_factory=SLO)
    # Tokens one request may use, prompt and completion together; max_output
    # bounds the completion alone. Zero is unknown. Without them an over-long
    # prompt is admitted, given a replica and fails at the engine, and a client
    # sizing its prompts has nothing to read.
    context_length: int = 0
    max_output: int = 0
    capabilities: Capabilities = Field(default_factory=Capabilities)
    # Left out of the definition while they are the default, so that a model
    # that says nothing about placement or rollout records, hashes and diffs as
    # it did before the fields existed (the declared digest of an unchanged
    # catalog.yaml must not change with an upgrade).
    # Compared by their fields' values (__dict__): pydantic's __eq__ checks the type, the
    # private and extra attributes first, which these strict, frozen models cannot differ
    # in, and it ran on every dump of every definition (about 1 us each).
    placement: PlacementRules = Field(
        default_factory=PlacementRules,
        exclude_if=lambda v: v.__dict__ == _DEFAULT_PLACEMENT.__dict__,
    )
    rollout: Rollout = Field(
        default_factory=Rollout, exclude_if=lambda v: v.__dict__ == _DEFAULT_ROLLOUT.__dict__
    )
    disruption: Disruption = Field(
        default_factory=Disruption,
        exclude_if=lambda v: v.__dict__ == _DEFAULT_DISRUPTION.__dict__,
    )

    @property
    def simulated(self) -> bool:
        """Whether this model produces synthetic text rather than inference output.

        Derived rather than configured: an operator who added a sim profile and
        forgot a flag would ship placeholder text under a real model's name. Only
        a model whose every profile is simulated counts; one real profile means a
        request can land on a real engine.
        """
        return bool(self.profiles) and all(p.engine == "sim" for p in self.profiles)

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def placement_profiles(self) -> tuple[PlacementProfile, ...]:
        return tuple(p.placement_view() for p in self.profiles)

    def engine_profile(self, name: str) -> EngineProfile | None:
        p = self.profile(name)
        if p is None:
            return None
        return EngineProfile(
            name=p.name,
            engine=p.engine,
            gpu_class=None if p.cpu_only else p.gpu_class,
            tp=p.tp,
            pp=p.pp,
            gpus_per_node=p.gpus_per_node,
            nodes=p.nodes,
            args=p.args,
            env={k: v if isinstance(v, str) else v.model_dump() for k, v in p.env.items()},
            model_path=self.source,
            served_model_name=self.name,
        )

    def to_definition(self) -> dict[str, Any]:
        """The definition as JSON-ready data with the YAML keys: parses back to an equal model."""
        return self.model_dump(mode="json")
