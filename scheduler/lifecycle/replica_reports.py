"""What an agent says about the replicas on its node, and what the control plane keeps of it.

A replica is *placed* by a round, then *starting*, *ready* or *failed* as its
agent reports. The report is the boundary: bounded (an agent is a program on
a machine somewhere else, and a bug there must not fill the database or a
terminal) and strict (a state we do not know is refused, not guessed at).

An agent that predates replica states sends no ``replicas`` at all. Its node
is marked as not reporting them, and its replicas count as ready and never
time out: an upgrade of the control plane must not fail every replica an
older agent runs for want of a report that agent cannot send.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from catalog.forms.printable import printable

# The states an agent may report. PLACED is the control plane's own: a round
# placed the replica and its agent has not said anything about it since.
PLACED = "placed"
STARTING = "starting"
READY = "ready"
FAILED = "failed"
# Shown for a replica whose node's agent does not report replica states.
UNREPORTED = "unreported"
# What a stored replica state may be. Anything else in the database (written by hand,
# by a newer release, or corrupted) is unreadable: a round would otherwise decide on a
# state it does not know (rollout.py treats each of these four its own way), and the
# API would answer a state its OpenAPI document says it never sends.
STORED_STATES = (PLACED, STARTING, READY, FAILED)

ReportedState = Literal["starting", "ready", "failed"]

# A node runs a handful of replicas; a report listing thousands is corrupt.
MAX_REPLICAS_PER_REPORT = 1024
MAX_MESSAGE = 1000
MAX_ENDPOINT = 2048
MAX_CONTEXT_DETAIL = 200
# No engine serves a window of a billion tokens; a larger figure is a bug in an agent.
MAX_CONTEXT_TOKENS = 1 << 30


def _printable(value: str) -> str:
    # Reports are shown in terminals (`llmgw placements`, `history`): a control
    # character in a message would be an escape sequence on an operator's screen.
    if not printable(value):  # catalog.forms.printable: the rule the API document states
        raise ValueError("contains control or non-printable characters; send plain text")
    return value


def _url(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.startswith(("http://", "https://")) or len(value) < len("http://x"):
        raise ValueError("must be an http:// or https:// URL such as http://10.0.0.7:8000")
    return _printable(value)


Printable = Annotated[str, AfterValidator(_printable)]


class ReplicaReport(BaseModel):
    """One replica as its agent sees it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    model: Printable = Field(min_length=1, max_length=255)
    replica: int = Field(ge=0, le=10_000)
    state: ReportedState
    message: Printable = Field(default="", max_length=MAX_MESSAGE)
    # The ready replica's URL, for a router to send requests to.
    endpoint: Annotated[str | None, AfterValidator(_url)] = Field(
        default=None, max_length=MAX_ENDPOINT
    )
    # The model version the reporting engine was started for (sent only by an agent
    # of a control plane that pins versions). A report of another version than the
    # placement now in the slot is about the replica that was there before: ignored.
    version: str = Field(default="", max_length=64, pattern=r"^[0-9a-f]*$")
    # The profile it was started with (sent with ``version``): what lets a round place
    # the replica again where it runs once its node was given up and came back
    # (``scheduler.planner.readoption``). "" from an agent that does not say.
    profile: Printable = Field(default="", max_length=255)
    # What one request may really use on the ready engine, as the engine itself says
    # (llama.cpp's context per slot, vLLM's max_model_len), and how it came to that
    # ("--ctx-size 8192 / --parallel 4 = 2048"). Absent: not known.
    effective_context_length: int | None = Field(default=None, ge=1, le=MAX_CONTEXT_TOKENS)
    context_detail: Printable = Field(default="", max_length=MAX_CONTEXT_DETAIL)


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """What the control plane knows of one placed replica, as a round sees it.

    ``state`` is one of PLACED, STARTING, READY, FAILED; ``since`` is when it
    entered that state and ``placed_at`` when the replica was placed, which is
    what its startup timeout counts from. ``reported`` is False when its node's
    agent does not report replica states (see the module).
    """

    state: str
    since: datetime
    placed_at: datetime
    message: str = ""
    endpoint: str | None = None
    reported: bool = True
    effective_context_length: int | None = None
    context_detail: str = ""

    @property
    def shown_state(self) -> str:
        return self.state if self.reported else UNREPORTED

    @property
    def counts_as_ready(self) -> bool:
        """Ready for rollouts, drains and `llmgw models`: reported ready, or not reported at all."""
        return self.state == READY or not self.reported
