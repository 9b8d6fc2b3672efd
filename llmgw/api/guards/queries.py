"""Unknown query parameters are refused (422), not ignored.

Ignoring them is the web's habit and a trap here: an agent asking for
``/v1/placements?nodes=gpu-7`` (a typo for ``node``) would be answered with
every placement in the cluster, and start them all. Each route's parameters
are read from its own signature, once.
"""

from __future__ import annotations

import difflib

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from llmgw.api.rendering.problems import Problem

_known: dict[int, frozenset[str]] = {}


def _parameters(route: APIRoute) -> frozenset[str]:
    names = _known.get(id(route))
    if names is None:
        names = frozenset(_query_names(route.dependant))
        _known[id(route)] = names
    return names


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def known_query(request: Request) -> None:
    if not request.query_params:
        return
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    allowed = _parameters(route)
    unknown = sorted(set(request.query_params.keys()) - allowed)
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(allowed), n=1)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    takes = ", ".join(sorted(allowed)) or "none"
    raise Problem(
        422,
        "invalid-request",
        f"unknown query parameter {', '.join(hints)}; {request.url.path} takes: {takes}",
    )
