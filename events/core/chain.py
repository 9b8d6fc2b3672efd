"""Tamper evidence: every event carries a hash over its own content and the previous hash.

``hash(N) = sha256(canonical(hash(N-1), row N))`` with ``hash(0) = GENESIS``.
The canonical form is a compact JSON array (``json.dumps(..., separators=(",",
":"))``, ASCII with ``\\u`` escapes) of::

    [prev_hash, position, event_id, command_id, type, schema_version, model,
     payload, actor, reason, recorded_at]

where ``payload`` is the stored JSON text exactly as written and
``recorded_at`` is the UTC time as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``: the same
string on SQLite (which stores no zone) and PostgreSQL (timestamptz), so a log
copied from one to the other verifies unchanged. An auditor can recompute the
chain with nothing but a SQL client and sha256. The form is frozen: changing it
would be a new chain, not an edit of this one.

Rows written before the chain existed (migration 0002) keep no hash: stored
rows are never rewritten. The migration computed the chain over them and
recorded its value at their last position as the *seal* (table
``event_chain_seal``), and the first hashed event chains on from it. So every
event is covered, the older ones from the moment of the migration on: nothing
can say what they were before it.

After the seal every row must carry its hash. A row without one was written
outside llmgw (or by a release before the chain, still running during an
upgrade), and nothing says it is genuine: ``verify`` fails at its position,
and appends refuse to chain over it (events.storage.sql_log). If an operator knows it is
genuine, adopting it is an explicit, recorded act (``llmgw verify
--adopt-unhashed --actor --reason``, table ``event_chain_adoptions``) that
fixes the chain's value over the row as it was then: an edit of it since is
still caught.

A hash chain alone proves the log consistent with itself. Deleting events at
the end, or rewriting the log and recomputing every hash after the edit, is
caught only against a head hash recorded somewhere else (``llmgw verify
--expect-head``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import msgspec

GENESIS = "0" * 64


def canonical_time(at: datetime) -> str:
    """A recorded time as hashed: UTC, always with microseconds."""
    if at.tzinfo is not UTC:  # every time the log records is UTC already
        at = at.astimezone(UTC)
    return at.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


# The canonical form is json.dumps's; msgspec writes the very same bytes, at a
# twentieth of the cost, for what an append hashes: ASCII strings without DEL
# (json.dumps escapes it as \u007f, msgspec leaves it), integers and null
# (tests/unit/events/test_chain_and_upcast.py holds the two to the same bytes).
# Anything else, a non-ASCII name or payload for one, takes json.dumps.
_ENCODE = msgspec.json.Encoder().encode


def _encodes_alike(items: list[object]) -> bool:
    for value in items:
        if type(value) is str:
            if not value.isascii() or "\x7f" in value:
                return False
        elif type(value) is not int and value is not None:
            return False
    return True


def canonical_bytes(items: list[object]) -> bytes:
    """``json.dumps(items, separators=(",", ":"))`` as ASCII bytes: the form a hash covers."""
    if _encodes_alike(items):
        return _ENCODE(items)
    return json.dumps(items, separators=(",", ":")).encode("ascii")


def event_hash(  # noqa: PLR0917  (the arguments are the canonical order, and rows unpack into it)
    prev_hash: str,
    position: int,
    event_id: str,
    command_id: str,
    type: str,
    schema_version: int,
    model: str | None,
    payload: str,
    actor: str,
    reason: str,
    recorded_at: datetime,
) -> str:
    """The chain's value at one event, given the value at the event before it."""
    content = canonical_bytes(
        [
            prev_hash,
            position,
            event_id,
            command_id,
            type,
            schema_version,
            model,
            payload,
            actor,
            reason,
            canonical_time(recorded_at),
        ]
    )
    return hashlib.sha256(content).hexdigest()


@dataclass(frozen=True, slots=True)
class ChainRow:
    """One stored event with its chain columns, as ``verify`` reads it."""

    position: int
    event_id: str
    command_id: str
    type: str
    schema_version: int
    model: str | None
    payload: str
    actor: str
    reason: str
    recorded_at: datetime
    prev_hash: str | None
    hash: str | None
    # Why the row's columns cannot be read as their types (see events.core.rows.decode);
    # such a row was written outside llmgw, and verify says so rather than crash.
    unreadable: str | None = None

    def computed_hash(self, prev_hash: str) -> str:
        return event_hash(
            prev_hash,
            self.position,
            self.event_id,
            self.command_id,
            self.type,
            self.schema_version,
            self.model,
            self.payload,
            self.actor,
            self.reason,
            self.recorded_at,
        )


@dataclass(frozen=True, slots=True)
class Seal:
    """The chain's value over the events written before it existed (migration 0002)."""

    position: int
    hash: str
    sealed_at: datetime


@dataclass(frozen=True, slots=True)
class VerifyReport:
    ok: bool
    events: int
    head_position: int
    head_hash: str
    seal: Seal | None
    # Rows after the seal with no stored hash that an operator adopted.
    adopted: int
    failed_at: int | None = None
    reason: str | None = None
    # Where the head hash given with --expect-head was found (None: not found / not asked).
    expected_head_at: int | None = None
    # With adopting: the unhashed rows found, as (position, chain value over the row).
    to_adopt: tuple[tuple[int, str], ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "events": self.events,
            "head": {"position": self.head_position, "hash": self.head_hash},
            "sealed_before_chain": None
            if self.seal is None
            else {
                "position": self.seal.position,
                "hash": self.seal.hash,
                "sealed_at": canonical_time(self.seal.sealed_at),
            },
            "adopted": self.adopted,
            "failed_at": self.failed_at,
            "reason": self.reason,
            "expected_head_at": self.expected_head_at,
        }


class ChainVerifier:
    """Checks the log row by row, in position order, keeping only the running hash.

    Names the first position that does not match: a gap (a deleted row), a
    ``prev_hash`` that is not the previous event's hash (a row removed, inserted
    or moved), a stored hash that does not match the row's content (an edited
    row), a row after the seal with no hash that no operator adopted (a forged
    row), a recorded time that goes backwards, or a seal that the rows written
    before the chain no longer reproduce.

    ``adoptions`` are the chain values operators recorded for unhashed rows
    (position -> hash). With ``adopting``, an unhashed row nobody adopted yet is
    collected in ``to_adopt`` instead of failing, for ``verify --adopt-unhashed``.
    """

    def __init__(
        self,
        seal: Seal | None,
        expect_head: str | None = None,
        adoptions: Mapping[int, str] | None = None,
        *,
        adopting: bool = False,
    ) -> None:
        self.seal = seal
        self.expect_head = expect_head
        self.adoptions = adoptions or {}
        self.adopting = adopting
        self.to_adopt: list[tuple[int, str]] = []
        self.hash = GENESIS
        self.position = 0
        self.adopted = 0
        self.failed_at: int | None = None
        self.reason: str | None = None
        self.expected_head_at: int | None = 0 if expect_head == GENESIS else None
        self._last_time: datetime | None = None
        if seal is not None and seal.position == 0 and seal.hash != GENESIS:
            self._fail(0, f"the chain's seal at position 0 is {seal.hash}, not the genesis hash")

    @property
    def failed(self) -> bool:
        return self.failed_at is not None

    def _fail(self, position: int, reason: str) -> None:
        self.failed_at = position
        self.reason = reason

    def feed(self, row: ChainRow) -> bool:
        """Check one more row; False once the chain is broken (later rows are not read)."""
        if self.failed:
            return False
        expected = self.position + 1
        if row.position != expected:
            self._fail(
                expected,
                f"position {expected} is missing: the log goes from {self.position} to "
                f"{row.position} (a deleted row)",
            )
            return False
        if row.unreadable is not None:
            self._fail(
                row.position,
                f"the row cannot be read ({row.unreadable}): it was written or edited "
                "outside llmgw",
            )
            return False
        computed = row.computed_hash(self.hash)
        seal = self.seal
        if seal is not None and row.position <= seal.position:
            if row.position == seal.position and computed != seal.hash:
                self._fail(
                    row.position,
                    f"the events written before the hash chain (positions 1..{seal.position}) "
                    f"no longer match the seal recorded at {canonical_time(seal.sealed_at)}: "
                    "one of them was edited or reordered",
                )
                return False
        elif row.hash is None:
            if not self._unhashed(row.position, computed):
                return False
        elif row.prev_hash != self.hash:
            self._fail(
                row.position,
                f"its prev_hash does not match the hash of position {self.position}: an event "
                "was removed, inserted or reordered here",
            )
            return False
        elif row.hash != computed:
            self._fail(
                row.position,
                "its content does not match its stored hash: the row was edited",
            )
            return False
        if self._last_time is not None and row.recorded_at < self._last_time:
            self._fail(
                row.position,
                f"its recorded time {canonical_time(row.recorded_at)} is before the previous "
                "event's: the row was edited or moved",
            )
            return False
        self.hash = computed
        self.position = row.position
        self._last_time = row.recorded_at
        if self.expect_head is not None and computed == self.expect_head:
            self.expected_head_at = row.position
        return True

    def _unhashed(self, position: int, computed: str) -> bool:
        adopted = self.adoptions.get(position)
        if adopted == computed:
            self.adopted += 1
            return True
        if adopted is not None:
            self._fail(
                position,
                "it carries no hash and was adopted by an operator, but its content changed "
                "since it was adopted: the row was edited",
            )
            return False
        if self.adopting:
            self.to_adopt.append((position, computed))
            return True
        after = f"the chain's seal at position {self.seal.position}" if self.seal else "genesis"
        self._fail(
            position,
            f"it carries no hash, after {after}: it was written outside llmgw (or by a "
            "release before the chain) and nothing vouches for it. If you know an upgrade "
            "wrote it, adopt it: llmgw verify --adopt-unhashed --actor NAME --reason WHY",
        )
        return False

    def finish(self) -> VerifyReport:
        seal = self.seal
        if not self.failed and seal is not None and self.position < seal.position:
            self._fail(
                self.position + 1,
                f"positions {self.position + 1}..{seal.position} were sealed when the chain "
                "began but are missing (deleted rows)",
            )
        if not self.failed and self.expect_head is not None and self.expected_head_at is None:
            self._fail(
                self.position + 1,
                f"the expected head {self.expect_head} is not the hash of any position up to "
                f"{self.position}: the log was truncated or rewritten since it was recorded",
            )
        return VerifyReport(
            ok=not self.failed,
            events=self.position,
            head_position=self.position,
            head_hash=self.hash,
            seal=seal,
            adopted=self.adopted,
            failed_at=self.failed_at,
            reason=self.reason,
            expected_head_at=self.expected_head_at,
            to_adopt=tuple(self.to_adopt),
        )


def verify_chain(
    rows: Iterable[ChainRow],
    seal: Seal | None,
    expect_head: str | None = None,
    adoptions: Mapping[int, str] | None = None,
    *,
    adopting: bool = False,
) -> VerifyReport:
    """Check a whole log, read in position order; stops at the first break."""
    verifier = ChainVerifier(seal, expect_head, adoptions, adopting=adopting)
    for row in rows:
        if not verifier.feed(row):
            break
    return verifier.finish()
