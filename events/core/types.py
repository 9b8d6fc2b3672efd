"""Events as the rest of the system sees them: what is appended and what is read back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

MODEL_ADDED = "model.added"
MODEL_REMOVED = "model.removed"
MODEL_REPLACED = "model.replaced"
# The declared catalog file changed and a running process took the new one. No
# change to the catalog's state on replay (the file is the declared catalog's
# source); recorded so that `history` shows when configuration changed.
DECLARED_CHANGED = "catalog.declared_changed"
# A bearer token was issued into, or revoked from, the database's token table
# (``llmgw token new|revoke|import``). No change to the catalog's state on replay:
# the table is the tokens' state and these events their audit trail, in the hash
# chain. The payload names the token and its scope, never the token or its hash.
TOKEN_ISSUED = "token.issued"
TOKEN_REVOKED = "token.revoked"
# A client token's limits changed (``llmgw token limits``): who, when, before and after.
TOKEN_LIMITS_CHANGED = "token.limits_changed"
# The usage counts of one (client, model asked, model served, replica, minute), summed
# over the flushes of all gateways (events.core.usage). No change to the catalog's
# state on replay: the usage ledger is the sum of these events (events.read.ledger),
# in the hash chain.
USAGE_RECORDED = "usage.recorded"

# The version of each event type's payload this code writes. Older versions
# are upcast on read (events.core.upcast); stored rows are never rewritten.
#   model.added 1: {"model": definition}
#   model.added 2: {"model": definition, "declared_digest": hex or null}: the
#     digest (catalog.changes.digest) of the declared catalog the add was validated
#     against, so that a later skip ("collides with a model declared since")
#     can be told apart from a bad write.
#   model.removed 1: {"name": name}
#   model.replaced 1: {"model": definition, "declared_digest": hex}: a runtime
#     model's whole new definition (defaults applied), as model.added 2 holds
#     it, so that replay needs nothing but the event to apply it.
#   catalog.declared_changed 1: {"path": file, "old_digest": hex, "new_digest": hex,
#     "added": [names], "removed": [names], "changed": [names]}: the declared
#     catalog's digests (catalog.changes.digest) before and after, and its models that changed.
#   token.issued 1: {"name": name, "role": role, "nodes": [names], "models": [names],
#     "via": "new" or "import"}: who holds the token and what it may do.
#     A client token issued with limits also holds "limits": {...}
#     (catalog.forms.client_limits.ClientLimits.to_json); absent: none.
#   token.revoked 1: {"name": name, "role": role}.
#   token.limits_changed 1: {"name": name, "role": role, "before": limits, "after": limits}.
#   usage.recorded 2: {"gateways": [posters], "flushes": n, "minute": ISO minute,
#     "client": name, "model": asked, "served": name or null, "replica": key or null,
#     "requests": n, "outcomes": {outcome: n}, "prompt_tokens": n, "cached_tokens": n,
#     "completion_tokens": n, "estimated": n}: one closed minute's flushes of one key,
#     summed by the roll-up (events.core.usage). Version 1 (one flush's row) had
#     "gateway": poster and "flush": id instead of the first two; upcast.
CURRENT_SCHEMA: dict[str, int] = {
    MODEL_ADDED: 2,
    MODEL_REMOVED: 1,
    MODEL_REPLACED: 1,
    DECLARED_CHANGED: 1,
    TOKEN_ISSUED: 1,
    TOKEN_REVOKED: 1,
    TOKEN_LIMITS_CHANGED: 1,
    USAGE_RECORDED: 2,
}
# The types that record a token's change (events.core.token_change).
TOKEN_TYPES = frozenset({TOKEN_ISSUED, TOKEN_REVOKED, TOKEN_LIMITS_CHANGED})
# The types whose payload is a whole definition under "model".
DEFINITION_TYPES = frozenset({MODEL_ADDED, MODEL_REPLACED})


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event about to be appended; the store assigns position, id and time."""

    type: str
    model: str
    payload: str  # JSON text
    schema_version: int = 1


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One row of the log, as stored. The payload stays text: decoding is replay's job,
    so that a row that cannot be decoded is skipped and named rather than crashing a read."""

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
    # Why a column of the stored row could not be read as its type (SQLite stores
    # whatever it is given), or None. Replay skips such a row and names it.
    unreadable: str | None = None
