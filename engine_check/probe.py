"""The requests ``llmgw engine-check`` sends, and the check of one model.

Direct to a ready replica's endpoint (found in the placements), or through a
gateway with a client token. Every answer is read up to ``MAX_ANSWER`` bytes and
parsed with a bound on nesting: an engine (or anything listening where one
should be) is not trusted to answer sensibly.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.context import direct_opener
from engine_check.claims import (
    EMBEDDINGS_REQUEST,
    TOOLS_REQUEST,
    UNCHECKED,
    Answer,
    Verdict,
    judge_context,
    judge_embeddings,
    judge_tools,
)

if TYPE_CHECKING:
    from catalog import Model

MAX_ANSWER = 1 << 20
TIMEOUT_S = 120.0

# The engines on a node and a gateway are reached directly, never through an
# http_proxy the environment may name; a redirect elsewhere is followed without the key
# or token (context.KeyStaysHome). Each request's opener bounds the whole exchange by its
# timeout: a timeout alone bounds each read, and an engine dripping a byte just within
# it held engine-check for as long as it liked.


@dataclass(frozen=True, slots=True)
class Target:
    """Where the requests go: a replica's endpoint, or a gateway (with its token)."""

    base_url: str
    model: str
    via: str
    headers: dict[str, str] = field(default_factory=dict)
    direct: bool = True


def post(target: Target, path: str, body: dict[str, Any], timeout: float = TIMEOUT_S) -> Answer:
    request = urllib.request.Request(
        target.base_url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **target.headers},
        method="POST",
    )
    try:
        with direct_opener(within=timeout).open(request, timeout=timeout) as answer:
            status, raw = int(answer.status), answer.read(MAX_ANSWER + 1)
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read(MAX_ANSWER + 1)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        return Answer(None, None, f"{target.base_url}{path}: {reason}")
    if len(raw) > MAX_ANSWER:
        return Answer(status, None, f"an answer of more than {MAX_ANSWER} bytes")
    text = raw.decode("utf-8", "replace")
    try:
        parsed: Any = json.loads(text)
    except (ValueError, RecursionError):
        parsed = None
    return Answer(status, parsed, text)


def check(
    model: Model,
    target: Target,
    *,
    engine: str,
    reported: tuple[int | None, str] = (None, ""),
    args: Sequence[str] = (),
) -> list[Verdict]:
    """Each claim of ``model``, asked of ``target``: tools, embeddings, vision (no probe
    yet: unchecked), context_length. ``engine`` is the replica's engine (how to ask it
    for its context); ``reported`` what its agent reported, used through a gateway,
    where the engine's own /props or /v1/models cannot be reached; ``args`` the
    profile's args (how the engine was asked, for the arithmetic)."""
    verdicts: list[Verdict] = []
    caps = model.capabilities
    if caps.tools:
        asked = {**TOOLS_REQUEST, "model": target.model}
        verdicts.append(judge_tools(post(target, "/v1/chat/completions", asked)))
    if caps.embeddings:
        asked = {**EMBEDDINGS_REQUEST, "model": target.model}
        verdicts.append(judge_embeddings(post(target, "/v1/embeddings", asked)))
    if caps.vision:
        verdicts.append(Verdict("vision", UNCHECKED, "engine-check has no vision probe yet"))
    if model.context_length > 0:
        verdicts.append(_context(model.context_length, target, engine, reported, args))
    return verdicts


def _context(
    declared: int,
    target: Target,
    engine: str,
    reported: tuple[int | None, str],
    args: Sequence[str],
) -> Verdict:
    from agent import context

    if not target.direct:
        return judge_context(declared, *reported, "as the replica's agent reported it")
    path = context.probe_path(engine)
    if path is None:
        return judge_context(declared, None, "", f"a {engine} engine")
    auth = target.headers.get("Authorization", "")
    found = context.read(
        engine,
        target.base_url,
        target.model,
        timeout=10.0,
        argv=args,
        key=auth.removeprefix("Bearer ") or None,
    )
    if found is None:
        return judge_context(declared, None, "", f"{target.base_url}{path}")
    return judge_context(declared, found.tokens, found.detail, f"{path} of the engine")
