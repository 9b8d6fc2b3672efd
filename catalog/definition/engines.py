"""The engines a profile may name: those the agents implement. Pure.

The agent (agent.engines) has an adapter for each of these and no other; the
list lives here so that the catalog, which imports nothing of ours, can refuse
a typo when a definition is loaded or added rather than let every node fail it
later ("engine 'vlm' has no adapter in this agent", on every node, with
back-off everywhere). Checked at the doors (the declared file's load, add,
apply), not on replay: a stored event that named another engine still replays
as it did, so an old log reads the same.
"""

from __future__ import annotations

from difflib import get_close_matches

from catalog.definition.engine_names import KNOWN_ENGINES
from catalog.definition.identifiers import brief
from catalog.definition.model import Model
from catalog.errors import CatalogError


def did_you_mean(engine: str) -> str | None:
    close = get_close_matches(engine.lower(), KNOWN_ENGINES, n=1, cutoff=0.6)
    return close[0] if close else None


def check_engines(model: Model, origin: str = "") -> None:
    """Refuse a profile whose engine no agent implements, naming the closest one."""
    for p in model.profiles:
        if p.engine in KNOWN_ENGINES:
            continue
        guess = did_you_mean(p.engine)
        hint = f"did you mean {guess!r}? " if guess else ""
        prefix = f"{origin}: " if origin else ""
        raise CatalogError(
            f"{prefix}model {brief(model.name)} profile {brief(p.name)}: engine "
            f"{brief(p.engine)} is not one the agents run; {hint}set engine to one of "
            f"{', '.join(KNOWN_ENGINES)}",
            model=model.name,
            profile=p.name,
            field="engine",
        )
