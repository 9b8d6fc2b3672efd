"""The routing profiles a model may name (``routing_profile``), known to the catalog.

A profile name is read by the gateway at request time. An unknown one used to be
stored as written and would have surfaced only then, when the router met it, much
as a typo in a fallback would surface during the outage that needed it: so the
catalog refuses it when the definition is loaded, and suggests the closest name.
Empty means the default, ``least-loaded``.
"""

from __future__ import annotations

import difflib

from catalog.errors import CatalogError

LEAST_LOADED = "least-loaded"
ROUND_ROBIN = "round-robin"
SESSION = "session"
LATENCY = "latency"
PREFIX = "prefix"
DEFAULT = LEAST_LOADED
# What each does, for refusals and docs.
KNOWN: dict[str, str] = {
    LEAST_LOADED: "fewest in-flight requests per unit of weight (the default)",
    ROUND_ROBIN: "in turn, in proportion to weight",
    SESSION: "a stable key (the `user` field or an x-session-id header) sticks to a replica",
    LATENCY: "lowest predicted time to first token; fallbacks first when none meets slo.ttft_p99",
    PREFIX: "where the prompt's longest prefix was sent (the engines' prefix caches), "
    "unless that replica is loaded",
}


def effective(name: str) -> str:
    """The profile in force: the name, or the default for an empty one."""
    return name or DEFAULT


def check_routing_profile(model: str, name: str) -> None:
    """Refuse an unknown profile name, naming the model, the field and the nearest name."""
    if not name or name in KNOWN:
        return
    close = difflib.get_close_matches(name, sorted(KNOWN), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise CatalogError(
        f"model {model!r}: routing_profile {name[:64]!r} is not a routing profile; {hint}"
        f"use one of {', '.join(KNOWN)}, or leave it empty for {DEFAULT!r}",
        model=model,
        field="routing_profile",
    )
