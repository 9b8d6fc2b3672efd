"""The nodes as their agents report them.

``NodeReport`` is the boundary: it validates what an agent sends, and its
errors name the node, the field and what to send instead, because the person
reading them is debugging an agent on a machine somewhere else. ``Node`` is
what the planner works with once a report has been accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from catalog.definition.identifiers import (
    FABRIC,
    GPU_CLASS,
    LABEL_KEY,
    LABEL_VALUE,
    NODE_NAME,
    Grammar,
    brief,
)
from catalog.forms.servers import MAX_SERVER_SWITCHES
from scheduler.lifecycle.replica_reports import MAX_REPLICAS_PER_REPORT, ReplicaReport


@dataclass(frozen=True, slots=True)
class Node:
    """One machine as last reported.

    ``gpu_class`` is None for a node without cards (``gpus`` is then 0).
    ``memory_gb`` is None when the agent does not report memory; such a node is
    never excluded for memory, because an older agent must not have its nodes
    quietly emptied by an upgrade of the control plane. Nodes sharing a
    ``fabric`` value can together host one multi-node replica.
    ``gpus_reserved`` are cards busy with work outside this control plane.
    """

    name: str
    gpu_class: str | None
    gpus: int
    memory_gb: float | None
    reported_at: datetime
    labels: Mapping[str, str] = field(default_factory=dict)
    fabric: str | None = None
    gpus_reserved: int = 0

    def __post_init__(self) -> None:
        # A naive timestamp would fail later, deep inside a placement round, as
        # a comparison between naive and aware datetimes; refuse it here.
        if self.reported_at.tzinfo is None:
            raise ValueError(
                f'node "{self.name}": reported_at {self.reported_at} has no time zone; '
                "give it in UTC"
            )


# A fresh node's report time as ``IncrementalRounds`` gives ``plan`` its nodes: after every
# freshness boundary, so that a node stays the same object while it is fresh (``plan``
# reads a fresh node's time only to judge it fresh). A round records such a node at its
# freshness boundary (``scheduler.persistence.record_format.recorded_time``).
FRESH = datetime.max.replace(tzinfo=UTC)


def reported_at(node: Node, at: datetime) -> Node:
    """``node`` as if reported at ``at``: ``dataclasses.replace(node, reported_at=at)``
    by its constructor (a third of the CPU: a round at 100,000 nodes may move every
    node's time to the freshness boundary)."""
    return Node(
        node.name, node.gpu_class, node.gpus, node.memory_gb, at, node.labels, node.fabric,
        node.gpus_reserved,
    )  # fmt: skip


class NodeReportError(ValueError):
    """An agent's report was refused; each problem names the node and the fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


class NodeReport(BaseModel):
    """What an agent says about its node.

    The report carries no timestamp: the control plane stamps the time it
    received it (``to_node``), so that staleness is measured on one clock
    rather than on every agent's.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str = Field(min_length=1)
    gpu_class: str | None = None
    # Bounds no real machine reaches: above them a report is corrupt, and the
    # numbers would overflow the inventory's columns.
    gpus: int = Field(default=0, ge=0, le=1024)
    gpus_reserved: int = Field(default=0, ge=0, le=1024)
    memory_gb: float | None = Field(default=None, gt=0, le=1 << 30, allow_inf_nan=False)
    labels: dict[str, str] = Field(default_factory=dict)
    fabric: str | None = None
    # The host its agent advertises (``--advertise``): registered with the node's first
    # report, it is the one host its replicas' endpoints may name (scheduler.lifecycle.endpoints).
    address: str | None = Field(default=None, min_length=1, max_length=253, pattern=r"^[!-~]+$")
    # The states of the replicas on this node (scheduler.lifecycle.replica_reports). Absent
    # leaves them as they were: an older agent does not send it.
    replicas: list[ReplicaReport] | None = Field(default=None, max_length=MAX_REPLICAS_PER_REPORT)
    # How many times its agent moved to the next control-plane server (agent.client), for
    # llmgw_agent_control_plane_switches_total{node}; not stored. Absent: an older agent.
    server_switches: int | None = Field(default=None, ge=0, le=MAX_SERVER_SWITCHES)

    @field_validator("gpu_class", "fabric", mode="before")
    @classmethod
    def _empty_means_none(cls, value: object) -> object:
        # Agents written against the Go control plane send "" for "no class"
        # and "no fabric"; both mean absent, not a class named "".
        return None if value == "" else value

    # The grammar of each name (catalog.definition.identifiers): printable ASCII that fits its
    # column, so a report cannot forge a line of `llmgw nodes list` or fail the insert.
    @field_validator("name")
    @classmethod
    def _name_grammar(cls, value: str) -> str:
        return _follows(NODE_NAME, value)

    @field_validator("gpu_class")
    @classmethod
    def _gpu_class_grammar(cls, value: str | None) -> str | None:
        return None if value is None else _follows(GPU_CLASS, value)

    @field_validator("fabric")
    @classmethod
    def _fabric_grammar(cls, value: str | None) -> str | None:
        return None if value is None else _follows(FABRIC, value)

    @field_validator("labels")
    @classmethod
    def _labels_grammar(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            for grammar, part in ((LABEL_KEY, key), (LABEL_VALUE, label)):
                problem = grammar.problem(part)
                if problem is not None:
                    part_name = "key" if grammar is LABEL_KEY else "value"
                    raise ValueError(f"{part_name} {brief(part)} {problem}")
        return value

    @model_validator(mode="after")
    def _cards_add_up(self) -> Self:
        if self.gpu_class is None and self.gpus > 0:
            raise ValueError(
                f"gpus is {self.gpus} but gpu_class is missing; "
                "name the card type, or report gpus 0 for a node without cards"
            )
        if self.gpu_class is not None and self.gpus == 0:
            raise ValueError(
                f"gpu_class is {self.gpu_class} but gpus is 0; "
                "report how many cards the node has, or leave gpu_class out"
            )
        if self.gpus_reserved > self.gpus:
            raise ValueError(
                f"gpus_reserved {self.gpus_reserved} is more than gpus {self.gpus}; "
                "report at most the cards the node has"
            )
        seen: set[tuple[str, int]] = set()
        for r in self.replicas or ():
            if (r.model, r.replica) in seen:
                raise ValueError(
                    f"replica {r.replica} of model {r.model!r} is reported twice; "
                    "report each replica once"
                )
            seen.add((r.model, r.replica))
        return self

    def to_node(self, received_at: datetime) -> Node:
        """The accepted report as the planner sees it, stamped with its arrival time."""
        return Node(
            name=self.name,
            gpu_class=self.gpu_class,
            gpus=self.gpus,
            memory_gb=self.memory_gb,
            reported_at=received_at.astimezone(UTC),
            labels=dict(self.labels),
            fabric=self.fabric,
            gpus_reserved=self.gpus_reserved,
        )


def _follows(grammar: Grammar, value: str) -> str:
    problem = grammar.problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


_FIXES = {
    "name": "every report must name its node",
    "gpu_class": "name the card type as a string, or leave it out for a node without cards",
    "gpus": "report the number of cards as an integer, 0 for a node without any",
    "gpus_reserved": "report the cards busy outside this control plane as an integer, 0 if none",
    "memory_gb": "report host memory in GB as a positive number, or leave it out if unknown",
    "labels": "report labels as a mapping of strings to strings",
    "fabric": "name the fabric as a string, or leave it out",
    "address": "report the host engines are reached at (the agent's --advertise) as a string",
    "replicas": 'report a list of {"model", "replica", "state": starting|ready|failed, '
    '"message", "endpoint"}, or leave it out to keep the states as they were',
}


def parse_node_report(raw: Mapping[str, Any]) -> NodeReport:
    """Validate an agent's report, or raise ``NodeReportError`` saying what to fix.

    >>> parse_node_report({"name": "gpu-7", "gpu_class": "A100", "gpus": 8}).gpus
    8
    """
    try:
        return NodeReport.model_validate(dict(raw))
    except ValidationError as exc:
        who = _who(raw)
        raise NodeReportError([f"{who}: {_problem(error)}" for error in exc.errors()]) from None


def _who(raw: Mapping[str, Any]) -> str:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        return "a node report"
    return f'node "{name}"' if NODE_NAME.problem(name) is None else f"node {brief(name)}"


def _problem(error: Any) -> str:
    """One pydantic error, reworded as field, problem and fix."""
    top = str(error["loc"][0]) if error["loc"] else "report"
    where = ".".join(str(part) for part in error["loc"])
    if error["type"] == "value_error":
        # Our own checks already say what is wrong and what to do.
        said = str(error["ctx"]["error"])
        if not error["loc"] or top == "labels":
            return f"{where} {said}" if where else said
        return f"{where} {brief(error.get('input'))} {said}"
    if error["type"] == "missing":
        return f"{where} is missing; {_FIXES.get(top, 'add it')}"
    if error["type"] == "extra_forbidden":
        if top == "replicas":
            known = ", ".join(ReplicaReport.model_fields)
            return f"{where} is not a field of a replica's report; the fields are {known}"
        known = ", ".join(NodeReport.model_fields)
        return f"{where} is not a field of a node report; the fields are {known}"
    got = brief(error.get("input"))
    return (
        f"{where} {got} is not accepted ({error['msg'].lower()}); {_FIXES.get(top, 'correct it')}"
    )
