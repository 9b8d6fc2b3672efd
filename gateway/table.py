"""The routing table: the catalog's models and their ready replicas, as one immutable value.

Built from the control plane's feeds (``GET /v1/catalog`` and ``GET /v1/placements``)
and swapped whole when either changes, so a request reads one consistent table without
locks. Only a ``ready`` replica with an endpoint takes requests; one that is starting is
counted (a request may wait for it), and draining, removed or failed ones are not in the
table at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.definition.model import DEFAULT_STARTUP_TIMEOUT, Model
from catalog.definition.routing_profiles import effective
from catalog.secrecy.secrets import engine_key_secret, sendable_key


def stable_hash(text: str) -> int:
    """A 64-bit hash every gateway computes alike (Python's ``hash`` is per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


READY = "ready"
# States from which a replica may still become ready: worth waiting for.
COMING = frozenset({"pending", "starting"})
# A model definition of this size or more in a feed is not one (a hostile feed).
MAX_NAME = 256
# A replica's context_detail longer than this in a feed is cut (the server allows 200).
MAX_CONTEXT_DETAIL = 200
# An effective_context_length at or above this is not one an engine reported.
MAX_CONTEXT = 1 << 31
# The engines' own flags for the requests they answer at once, by engine.
SLOT_FLAGS = {
    "vllm": ("--max-num-seqs",),
    "": ("--max-num-seqs",),  # the catalog's default engine
    "llamacpp": ("--parallel", "-np"),
    "sim": ("--slots",),
}
MAX_SLOTS = 4096
# Engines whose server says its slots on ``GET /props`` (``total_slots``): llama.cpp's.
# The sim answers /props too, but its count is its --slots, which the args already say.
PROPS_ENGINES = frozenset({"llamacpp"})
# Where a replica's slots came from (``Replica.slots_source``, ``GET /routing``).
FROM_PROFILE, FROM_ENGINE, FROM_ARGS = "profile", "engine", "args"


def slots_of(engine: str, args: Iterable[str], field: int = 0) -> int:
    """Requests one replica of a profile answers at once: the profile's ``slots`` when
    set, else its engine's flag in ``args`` (vLLM's ``--max-num-seqs``, llama.cpp's
    ``--parallel``, the sim's ``--slots``), else 0 (not known: never held back).

    >>> slots_of("vllm", ["--max-num-seqs", "8"]), slots_of("llamacpp", ["-np=2"])
    (8, 2)
    >>> slots_of("sim", ["--slots", "3"], field=5), slots_of("vllm", ["--max-num-seqs"])
    (5, 0)
    """
    if 0 < field <= MAX_SLOTS:
        return field
    flags = SLOT_FLAGS.get(engine, ())
    words = list(args)
    found = 0
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag not in flags:
            continue
        if not eq:
            value = words[i + 1] if i + 1 < len(words) else ""
        if value.isascii() and value.isdigit() and 0 < len(value) < 6:
            found = int(value)  # the last one given wins, as in the engines' parsers
    return found if 0 < found <= MAX_SLOTS else 0


@dataclass(frozen=True, slots=True)
class Replica:
    """One ready replica of a model: where to send, and its capacity weight."""

    key: str  # "model/replica", stable across tables
    model: str
    endpoint: str  # "http://host:port", no trailing slash
    weight: float
    profile: str
    # A stable 64-bit hash of ``key`` (routing.stable_hash), made once per table for the
    # session profile's rendezvous hashing.
    hash: int = 0
    # What one request may really use on this replica, as its engine said once ready
    # (the placements view's ``effective_context_length``; None: not known), and the
    # arithmetic behind it (``context_detail``, e.g. "--ctx-size 2048 / --parallel 4 = 512").
    context: int | None = None
    context_detail: str = ""
    # Requests its engine answers at once (``slots_of``, or its engine's ``/props``); 0:
    # not known, never full. ``slots_source``: profile, engine or args ("" when unknown).
    slots: int = 0
    slots_source: str = ""
    # The header line its engine's key goes in (``authorization: Bearer ...\r\n``; empty:
    # its profile gives the engine no key), and what to say when the engine refuses the
    # gateway's requests (401): which secret, and where this gateway looks for it.
    auth: bytes = field(default=b"", repr=False)  # (never in a log line or a traceback)
    auth_note: str = ""
    # The key before a rotation (``EngineAuth.previous``), asked with when ``auth`` is
    # refused: an engine keeps the key it was started with until it restarts.
    auth_previous: bytes = field(default=b"", repr=False)
    # Its profile's engine (``llamacpp``, ``vllm``, ``sim``...): how its own count of the
    # requests it is serving is read (gateway.engineload).
    engine: str = ""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """What the gateway needs of a catalog model, read once per table."""

    name: str
    aliases: tuple[str, ...]
    fallbacks: tuple[str, ...]
    routing_profile: str
    context_length: int
    max_output: int
    tools: bool
    vision: bool
    embeddings: bool
    ttft_slo_s: float  # 0: none
    tpot_slo_s: float
    startup_timeout_s: float  # the longest of its profiles': how long a request may wait

    @classmethod
    def of(cls, m: Model) -> ModelEntry:
        timeouts = [p.startup_timeout.total_seconds() for p in m.profiles]
        return cls(
            name=m.name,
            aliases=tuple(m.aliases),
            fallbacks=tuple(m.fallbacks),
            routing_profile=effective(m.routing_profile),
            context_length=m.context_length,
            max_output=m.max_output,
            tools=m.capabilities.tools,
            vision=m.capabilities.vision,
            embeddings=m.capabilities.embeddings,
            ttft_slo_s=m.slo.ttft_p99.total_seconds(),
            tpot_slo_s=m.slo.tpot_p99.total_seconds(),
            startup_timeout_s=max(timeouts, default=DEFAULT_STARTUP_TIMEOUT.total_seconds()),
        )

    def openai(self) -> dict[str, Any]:
        """The entry of ``GET /v1/models``: what a client sizes its prompts by."""
        return {
            "id": self.name,
            "object": "model",
            "created": 0,
            "owned_by": "llmgw",
            "aliases": list(self.aliases),
            "context_length": self.context_length,
            "max_output": self.max_output,
            "capabilities": {
                "tools": self.tools,
                "vision": self.vision,
                "embeddings": self.embeddings,
            },
        }


@dataclass(frozen=True, slots=True)
class Table:
    models: Mapping[str, ModelEntry] = field(default_factory=dict)
    # name or alias -> name (aliases share the names' namespace: the catalog's rule)
    index: Mapping[str, str] = field(default_factory=dict)
    # name -> its ready replicas, in a stable order (by key)
    ready: Mapping[str, tuple[Replica, ...]] = field(default_factory=dict)
    # name -> how many replicas are placed and on their way to ready
    coming: Mapping[str, int] = field(default_factory=dict)
    # The catalog's log position the table was built at.
    position: int = 0
    # The models with a ready replica whose slots are known: only they may queue.
    slotted: frozenset[str] = frozenset()
    # (replica key, endpoint) of the ready replicas whose engine says its slots on
    # ``/props`` and whose profile sets no ``slots``: gateway.engineslots asks them.
    ask_props: frozenset[tuple[str, str]] = frozenset()

    def resolve(self, name: str) -> ModelEntry | None:
        canonical = self.index.get(name)
        return None if canonical is None else self.models[canonical]

    def names(self) -> list[str]:
        return sorted(self.index)


def build(
    models: Iterable[Model],
    placements: Iterable[Mapping[str, Any]],
    position: int,
    engine_slots: Mapping[tuple[str, str], int] | None = None,
    auth: Mapping[tuple[str, str], EngineAuth] | None = None,
) -> Table:
    """A table from parsed catalog models and ``/v1/placements`` entries.

    A replica's weight is the feed's ``weight`` when it carries one (a weight derived
    from measured capacity), else its profile's ``weight`` in the catalog.

    A replica's slots: its profile's ``slots`` when set; else what its engine said on
    ``/props`` (``engine_slots``, by replica key and endpoint: gateway.engineslots);
    else its engine's flag in the profile's args; else not known.

    ``auth``: by (model, profile), the header line of its engine's key and what to say
    when the engine refuses it (``engine_auth``); none for a profile without a key.
    """
    entries: dict[str, ModelEntry] = {}
    index: dict[str, str] = {}
    weights: dict[tuple[str, str], float] = {}
    # (model, profile) -> (slots, source, whether its engine says them on /props)
    slots: dict[tuple[str, str], tuple[int, str, bool]] = {}
    engines: dict[tuple[str, str], str] = {}
    said = engine_slots or {}
    keys = auth or {}
    for m in models:
        entries[m.name] = ModelEntry.of(m)
        index[m.name] = m.name
        for alias in m.aliases:
            index[alias] = m.name
        for prof in m.profiles:
            weights[(m.name, prof.name)] = prof.weight if prof.weight > 0 else 1.0
            declared = 0 < prof.slots <= MAX_SLOTS
            found = slots_of(prof.engine, prof.args, prof.slots)
            source = FROM_PROFILE if declared else FROM_ARGS if found else ""
            asks = not declared and prof.engine in PROPS_ENGINES
            slots[(m.name, prof.name)] = (found, source, asks)
            engines[(m.name, prof.name)] = prof.engine
    ask: set[tuple[str, str]] = set()
    ready: dict[str, list[Replica]] = {}
    coming: dict[str, int] = {}
    for p in placements:
        model, state = p.get("model"), p.get("state")
        if not isinstance(model, str) or model not in entries:
            continue
        if state in COMING:
            coming[model] = coming.get(model, 0) + 1
            continue
        endpoint, replica = p.get("endpoint"), p.get("replica")
        if state != READY or not isinstance(endpoint, str) or not endpoint:
            continue
        if not isinstance(replica, int) or isinstance(replica, bool) or replica < 0:
            # A replica's key goes into every answer's x-llmgw-replica, written as the
            # gateway's own header (unchecked): a number, or the entry is not served.
            continue
        profile = str(p.get("profile", ""))
        fed = p.get("weight")
        weight = (
            float(fed)
            if isinstance(fed, int | float) and not isinstance(fed, bool) and 0 < fed < float("inf")
            else weights.get((model, profile), 1.0)
        )
        key = f"{model}/{replica}"
        context, detail = _context(p)
        count, source, asks = slots.get((model, profile), (0, "", False))
        if asks:
            where = (key, endpoint.rstrip("/"))
            ask.add(where)
            told = said.get(where, 0)
            if 0 < told <= MAX_SLOTS:
                count, source = told, FROM_ENGINE
        auth_of = keys.get((model, profile), _NO_AUTH)
        ready.setdefault(model, []).append(
            Replica(
                key,
                model,
                endpoint.rstrip("/"),
                weight,
                profile,
                stable_hash(key),
                context,
                detail,
                count,
                source,
                auth_of.line,
                auth_of.note,
                auth_of.previous,
                engines.get((model, profile), ""),
            )
        )
    return Table(
        models=entries,
        index=index,
        ready={m: tuple(sorted(rs, key=lambda r: r.key)) for m, rs in ready.items()},
        coming=coming,
        position=position,
        slotted=frozenset(m for m, rs in ready.items() if any(r.slots for r in rs)),
        ask_props=frozenset(ask),
    )


@dataclass(frozen=True, slots=True)
class EngineAuth:
    """How the gateway authenticates to the engines of one profile started with a key."""

    # ``authorization: Bearer ...\r\n``; empty: not sent (``problem`` says why). Never in
    # a repr: a log line or a traceback must not carry the key.
    line: bytes = field(repr=False)
    note: str  # what a 401 from such an engine tells the client: which secret, no paths
    problem: str  # for the operator's log (where it was looked for); "" when it is sent
    # The line this gateway sent before its copy of the secret changed (a rotation):
    # the engines started before it still hold that key, until they restart, and are
    # asked again with it when they refuse ``line`` (gateway.follower keeps it).
    previous: bytes = field(default=b"", repr=False)


_NO_AUTH = EngineAuth(b"", "", "")


def engine_auth(
    models: Iterable[Model], secret: Callable[[str], str]
) -> dict[tuple[str, str], EngineAuth]:
    """By (model, profile) whose engine was started with a key (its env's
    ``VLLM_API_KEY: {secret: NAME}``, catalog.secrecy.secrets.engine_key_secret): how the
    gateway sends it. ``secret`` looks a secret's value up (``LookupError`` saying what to
    do when there is none): the key is then not sent, the log says where to put it
    (``problem``) and the engine's 401 is answered naming the secret. A value no header
    can carry (empty, a space, a control character) is not sent either."""
    out: dict[tuple[str, str], EngineAuth] = {}
    for m in models:
        for prof in m.profiles:
            name = engine_key_secret(prof.engine, prof.env)
            if name is None:
                continue
            unsent = (
                f"this gateway has no usable key for it (secret {name!r}; its log's "
                "gateway.engine_key_unsent says why)"
            )
            try:
                value = secret(name)
            except LookupError as exc:
                out[(m.name, prof.name)] = EngineAuth(b"", unsent, str(exc))
                continue
            if not sendable_key(value):
                out[(m.name, prof.name)] = EngineAuth(
                    b"",
                    unsent,
                    f"secret {name!r}: its value cannot be sent in a header (empty, or a "
                    "space or a control character in it)",
                )
                continue
            out[(m.name, prof.name)] = EngineAuth(
                b"authorization: Bearer " + value.encode("ascii") + b"\r\n",
                f"it does not take this gateway's key (secret {name!r}): the agents' and "
                "the gateway's copies of the secret differ",
                "",
            )
    return out


def _context(p: Mapping[str, Any]) -> tuple[int | None, str]:
    """A feed entry's ``effective_context_length`` and ``context_detail``; a value that is
    not one (a bool, a non-positive or absurd number, a non-string) is read as unknown,
    so a hostile or older feed can only leave the catalog's limit in force."""
    value, detail = p.get("effective_context_length"), p.get("context_detail")
    context = (
        value
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_CONTEXT
        else None
    )
    text = detail[:MAX_CONTEXT_DETAIL] if isinstance(detail, str) and context is not None else ""
    return context, text
