"""The node's placements as the control plane sends them, read strictly and bounded.

``GET /v1/placements?node=NAME`` answers a list of replicas, each with the
engine view of its profile. A field the agent needs that is missing or of the
wrong type refuses the whole answer (acting on half of it could stop engines
that should run); fields it does not know are ignored, so a newer server
can add some.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.engines import Launch

MAX_PLACEMENTS = 4096


class _Secret(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # Resolved on this node (agent.secrets): the control plane sends the name only.
    secret: str = Field(min_length=1, max_length=128)


class _Engine(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: str = Field(min_length=1, max_length=255)
    engine: str = Field(min_length=1, max_length=64)
    tp: int = Field(ge=1, le=1024)
    pp: int = Field(default=0, ge=0, le=1024)
    gpus_per_node: int = Field(ge=0, le=1024)
    nodes: int = Field(default=1, ge=1, le=1024)
    args: list[str] = Field(default_factory=list, max_length=1024)
    env: dict[str, str | _Secret] = Field(default_factory=dict, max_length=1024)
    model_path: str = Field(max_length=4096)
    served_model_name: str = Field(min_length=1, max_length=255)


class _Placement(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(min_length=1, max_length=255)
    replica: int = Field(ge=0)
    profile: str = Field(min_length=1, max_length=255)
    nodes: list[str] = Field(min_length=1, max_length=1024)
    gpus_per_node: int = Field(ge=0, le=1024)
    engine: _Engine | None = None
    state: str | None = None
    # Where the replica's head answers, as its agent reported it (None until then).
    endpoint: str | None = Field(default=None, max_length=2048)
    # The model version the replica was placed with ("" from a server before versions).
    version: str = Field(default="", max_length=64)


class PlacementsError(ValueError):
    """The control plane's answer could not be read; nothing is changed on its account."""


@dataclass(frozen=True, slots=True, order=True)
class Key:
    """A replica: its model and slot, stable for as long as it runs."""

    model: str
    replica: int

    def __str__(self) -> str:
        return f"{self.model}[{self.replica}]"


@dataclass(frozen=True, slots=True)
class Want:
    """One replica the scheduler placed on this node.

    A replica spanning nodes runs one engine on each: ``rank`` is this node's
    index in the placement (0, the first node, is the head that serves the
    API) and ``nnodes`` their number; a worker finds its head through
    ``head_endpoint``, the endpoint the head's agent reported. ``launch`` is
    None when the model or profile has left the catalog while the replica was
    being removed: such a replica is not started.
    """

    key: Key
    gpus: int
    launch: Launch | None
    fingerprint: str
    server_state: str | None = None
    rank: int = 0
    nnodes: int = 1
    head: str = ""
    head_endpoint: str | None = None
    # The model version the control plane placed this replica with; its ``launch`` is
    # that version's, and does not change while the replica stays placed.
    version: str = ""

    @property
    def worker(self) -> bool:
        return self.rank > 0


def parse_placements(data: Any, node: str) -> list[Want]:
    if not isinstance(data, list):
        raise PlacementsError("the placements answer is not a list")
    if len(data) > MAX_PLACEMENTS:
        raise PlacementsError(f"the placements answer lists {len(data)} replicas for one node")
    wants: dict[Key, Want] = {}
    for i, raw in enumerate(data):
        try:
            p = _Placement.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise PlacementsError(f"placement {i}: {where}: {first['msg']}") from None
        if node not in p.nodes:
            continue  # an older server without ?node= answers every placement
        key = Key(p.model, p.replica)
        launch = None if p.engine is None else _launch(p.engine)
        rank = p.nodes.index(node)
        # A worker started against one head address must restart when its head
        # moves (restarted on another port): the address is part of what it runs.
        head_endpoint = p.endpoint if rank > 0 else None
        wants[key] = Want(
            key=key,
            gpus=p.gpus_per_node,
            launch=launch,
            fingerprint=fingerprint(p.gpus_per_node, p.engine, head_endpoint),
            server_state=p.state,
            rank=rank,
            nnodes=len(p.nodes),
            head=p.nodes[0],
            head_endpoint=head_endpoint,
            version=p.version,
        )
    return sorted(wants.values(), key=lambda w: w.key)


def _launch(e: _Engine) -> Launch:
    return Launch(
        engine=e.engine,
        profile=e.name,
        model_path=e.model_path,
        served_model_name=e.served_model_name,
        tp=e.tp,
        pp=e.pp,
        gpus_per_node=e.gpus_per_node,
        nodes=e.nodes,
        args=tuple(e.args),
        env={k: v if isinstance(v, str) else {"secret": v.secret} for k, v in e.env.items()},
    )


def fingerprint(gpus: int, engine: _Engine | None, head_endpoint: str | None = None) -> str:
    """What an engine was started with: a running engine whose fingerprint changed is restarted."""
    body: dict[str, Any] = {
        "gpus": gpus,
        "engine": None if engine is None else engine.model_dump(mode="json"),
    }
    if head_endpoint is not None:
        body["head"] = head_endpoint
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
