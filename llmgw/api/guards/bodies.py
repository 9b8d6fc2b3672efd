"""Request bodies: read as the CLI reads files, then held to what the database can store.

A body is received on the event loop with a size cap (``receive``), and parsed
in a worker thread (``parse``), never on the loop: parsing is the one step
whose cost the client chooses, and one slow request must not stop other
clients, ``/healthz`` or a SIGTERM. It is parsed by ``catalog.reading.documents``, like
a file given to ``llmgw add``: JSON or YAML within the body limits (no anchors
or aliases, bounded depth and node count), and a key written twice is
refused, not silently dropped. On top
of that, the HTTP boundary refuses what no back end can store faithfully: a
NUL character or an unpaired surrogate in a string (PostgreSQL refuses the
first, UTF-8 cannot encode the second) and a non-finite number (JSON has no
NaN, so it could not be read back).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from starlette.requests import Request

from catalog import CatalogError
from catalog.reading.documents import BODY_LIMITS, DocumentRefused, NotJSON, read_data
from llmgw.api.rendering.problems import Problem

ORIGIN = "request body"


# More digits than this (leading zeros aside) is more than any body limit.
_LENGTH_DIGITS = 18
_TOO_LONG: int = 10**_LENGTH_DIGITS


def declared_length(value: str | bytes) -> int | None:
    """A ``Content-Length`` header's value, or None when it is not a plain count.

    ASCII digits only: ``str.isdigit`` also takes "²", which ``int`` refuses. Leading
    zeros are valid HTTP, and the server reads "000...046" as 46, but ``int`` of more
    than 4,300 digits raises: they are dropped first, and a count of more digits than
    any limit is capped rather than converted. Either mistake was a 500.
    """
    raw = value.encode("latin-1") if isinstance(value, str) else value
    if not raw or not raw.isascii() or not raw.isdigit():
        return None
    digits = raw.lstrip(b"0")
    if len(digits) > _LENGTH_DIGITS:
        return _TOO_LONG
    return int(digits or b"0")


async def receive(request: Request, limit: int) -> bytes:
    """The raw body, refused with a 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = declared_length(request.headers.get("content-length", ""))
    if declared is not None and declared > limit:
        raise Problem(413, "too-large", f"the body is {declared} bytes; at most {limit} are read")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise Problem(413, "too-large", f"the body is over {limit} bytes; at most that is read")
    return bytes(body)


def parse(body: bytes, limit: int, kind: str, *, json_only: bool = False) -> Any:
    """The parsed body; a ``Problem`` (413 or 422 of ``kind``) when it cannot be used.

    Blocking and as costly as the body allows: call it in a worker thread. With
    ``json_only``, a body that is not JSON raises ``NotJSON`` (see ``read_data``)
    rather than being read as YAML.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Problem(422, kind, f"{ORIGIN}: not UTF-8 text ({exc.reason})") from None
    if not text.strip():
        raise Problem(422, kind, f"{ORIGIN}: empty; send JSON (or YAML)")
    try:
        data = read_data(text, ORIGIN, replace(BODY_LIMITS, max_bytes=limit), json_only=json_only)
    except DocumentRefused as exc:
        status = 413 if exc.limit == "bytes" else 422
        raise Problem(status, "too-large" if status == 413 else kind, str(exc)) from None
    except CatalogError as exc:
        raise Problem(422, kind, str(exc)) from None
    problem = storable(data)
    if problem is not None:
        raise Problem(422, kind, f"{ORIGIN}: {problem}")
    return data


def parse_gateway_post(body: bytes, limit: int, kind: str, prefix: str = "") -> Any:
    """A gateway's JSON post, parsed as ``parse`` does (a worker thread's call); a body
    that is not JSON is refused 422 of ``kind`` (never read as YAML: gateways send
    JSON), its detail after ``prefix``."""
    try:
        return parse(body, limit, kind, json_only=True)
    except NotJSON:
        raise Problem(
            422, kind, f"{prefix}request body: not JSON; a gateway posts a JSON object"
        ) from None


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
