"""The catalog's ``context_length`` held to what one request may really use on a replica. Pure.

llama.cpp divides ``--ctx-size`` across its ``--parallel`` slots: a pool of 8192
across four slots is 2048 a request, and nothing says so unless someone asks the
engine. The agent asks it once the engine is ready (``agent.context``) and reports
the figure with the replica's state; this module says, in the operator's words,
when the catalog promises clients more than that.
"""

from __future__ import annotations

# What to change, by engine: the flags that set the window one request gets.
_REMEDY = {
    "llamacpp": "raise --ctx-size or lower --parallel in its args",
    "vllm": "raise --max-model-len in its args",
}


def context_warning(
    *,
    model: str,
    profile: str,
    engine: str,
    context_length: int,
    effective: int | None,
    detail: str,
) -> str | None:
    """A warning when the catalog's ``context_length`` exceeds what the engine gives one
    request; None when it does not, or when either number is unknown (0: not declared).

    >>> context_warning(model="m", profile="cpu", engine="llamacpp", context_length=4096,
    ...     effective=2048, detail="--ctx-size 8192 / --parallel 4 = 2048")[:59]
    '--ctx-size 8192 / --parallel 4 = 2048 < context_length 4096'
    """
    if context_length <= 0 or effective is None or effective >= context_length:
        return None
    arithmetic = detail or f"the engine gives one request {effective}"
    remedy = _REMEDY.get(engine, "give its engine a larger context")
    return (
        f"{arithmetic} < context_length {context_length}: a request to model {model!r} "
        f"may use {effective} tokens on this replica, not {context_length}; {remedy} "
        f"(model {model!r}, profile {profile!r}), or lower the model's context_length "
        f"to {effective}"
    )
