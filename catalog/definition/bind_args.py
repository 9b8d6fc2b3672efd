"""The address an engine listens on is the agent's, never a profile's ``args``. Pure.

The agent starts every engine on its ``--engine-host`` (127.0.0.1 by default) and a
port it picks, and the gateway is the only way in: its admission, tokens and quotas.
An engine told ``--host 0.0.0.0`` in a profile's args (both vLLM and llama-server take
the last value of a flag) would listen on every interface, past all of that. So the
flags that choose where an engine listens are refused in args at the doors (add, apply,
the declared file) and dropped by the agent from what it runs (``drop_bind_args``: an
event stored before this rule still replays as it was, and the agent is the last line).

The flags: ``--host`` and ``--port`` (vLLM, llama-server and the sim engine all spell
them so), vLLM's ``--uds`` (listen on a Unix socket instead), in the ``--flag=value``
form too, and any abbreviation argparse would expand to one of them (``--hos``: vLLM's
and the sim engine's parsers accept a unique prefix). llama-server has no other
spelling of them on its command line.
"""

from __future__ import annotations

from collections.abc import Sequence

from catalog.errors import CatalogError

BIND_FLAGS = ("--host", "--port", "--uds")


def bind_flag(item: str) -> str | None:
    """The bind flag ``item`` is (``--host``, ``--port``, ``--uds``), in any form, or None."""
    if not item.startswith("--"):
        return None
    flag = item.partition("=")[0].lower()
    if len(flag) < 3:
        return None
    for known in BIND_FLAGS:
        if known.startswith(flag):
            return known
    return None


def bind_problem(model: str, profile: str, index: int, flag: str) -> CatalogError:
    return CatalogError(
        f"model {model!r} profile {profile!r}: args[{index}] sets {flag}; the host and port "
        "an engine listens on are the agent's (`llmgw agent --engine-host`, and a port it "
        "picks), so that the gateway stays the only way in. Remove it from args; to reach "
        "engines from other machines, start the agents with --engine-host",
        model=model,
        profile=profile,
        field=f"profiles.args[{index}]",
    )


def check_no_bind_args(profiles: Sequence[object], model: str) -> None:
    """Refuse (``CatalogError``) a profile whose args choose where its engine listens."""
    for p in profiles:
        for i, item in enumerate(getattr(p, "args", ())):
            flag = bind_flag(item)
            if flag is not None:
                raise bind_problem(model, str(getattr(p, "name", "")), i, flag)


def drop_bind_args(args: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``args`` without any bind flag and its value, and what was dropped.

    The value is the next item unless the flag is written ``--flag=value`` or the next
    item is another long flag.
    """
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(args):
        item = args[i]
        if bind_flag(item) is None:
            kept.append(item)
            i += 1
            continue
        dropped.append(item)
        i += 1
        if "=" not in item and i < len(args) and not args[i].startswith("--"):
            dropped.append(args[i])
            i += 1
    return tuple(kept), tuple(dropped)
