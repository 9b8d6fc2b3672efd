"""Request bodies: read as the CLI reads files, then held to what the database can store.

A body is read by ``catalog.read_data``, like a file given to ``llmgw add``:
JSON or YAML, and a key written twice is refused, not silently dropped. On top
of that, the HTTP boundary refuses what no back end can store faithfully: a
NUL character or an unpaired surrogate in a string (PostgreSQL refuses the
first, UTF-8 cannot encode the second) and a non-finite number (JSON has no
NaN, so it could not be read back).
"""

from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request

from catalog import CatalogError, read_data
from llmgw.api.problems import Problem

ORIGIN = "request body"


async def read_body(request: Request, limit: int, kind: str) -> Any:
    """The parsed body; a ``Problem`` (413 or 422 of ``kind``) when it cannot be used."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Problem(413, "too-large", f"the body is {declared} bytes; at most {limit} are read")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise Problem(413, "too-large", f"the body is over {limit} bytes; at most that is read")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem(422, kind, f"{ORIGIN}: not UTF-8 text ({exc.reason})") from None
    if not text.strip():
        raise Problem(422, kind, f"{ORIGIN}: empty; send JSON (or YAML)")
    try:
        data = read_data(text, ORIGIN)
    except CatalogError as exc:
        raise Problem(422, kind, str(exc)) from None
    problem = storable(data)
    if problem is not None:
        raise Problem(422, kind, f"{ORIGIN}: {problem}")
    return data


def storable(value: Any, where: str = "") -> str | None:
    """Why ``value`` cannot be stored and read back unchanged, or None."""
    if isinstance(value, str):
        return text_problem(value, where)
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where or 'a value'} is {value}; JSON has no such number"
    if isinstance(value, dict):
        for k, v in value.items():
            at = f"{where}.{k}" if where else str(k)
            problem = (text_problem(k, at) if isinstance(k, str) else None) or storable(v, at)
            if problem:
                return problem
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            problem = storable(v, f"{where}[{i}]")
            if problem:
                return problem
    return None


def text_problem(text: str, where: str) -> str | None:
    if "\x00" in text:
        return f"{where or 'a string'} contains a NUL character, which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{where or 'a string'} contains an unpaired surrogate, which is not text"
    return None
