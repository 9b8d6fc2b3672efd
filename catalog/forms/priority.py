"""A client token's place in a full model's queue: its priority class and its share. Pure.

One definition for every floor that checks or uses them: the token's events
(events.core.token_change), the configured tokens (llmgw.api.guards.tokens), the CLI's
choices and the gateway's queue (gateway.stages.queue).
"""

from __future__ import annotations

CRITICAL, STANDARD, BATCH = "critical", "standard", "batch"
# Highest first: a higher class leaves the queue first.
PRIORITY_CLASSES = (CRITICAL, STANDARD, BATCH)
# The largest share a client token may have (its part of a full model, within its class).
MAX_SHARE = 1000
