"""Errors as ``application/problem+json`` (RFC 9457): type, title, status, detail.

The detail is the message the CLI prints after ``error:``, so an operator
reads the same sentence whichever way they made the change. ``type`` is a URN
per kind of problem (stable, for programs to branch on); catalog refusals add
the structured ``model``, ``profile`` and ``field`` of ``CatalogError``.
"""

from __future__ import annotations

import json
import math
import traceback
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from starlette.routing import Match

from catalog import CatalogError
from llmgw.api.rendering.openai import error_body, is_openai

log = structlog.get_logger("llmgw.api")

PROBLEM_JSON = "application/problem+json"

# Titles by kind: short, the same for every occurrence (RFC 9457 section 3.1.3).
TITLES = {
    "invalid-definition": "Invalid model definition",
    "invalid-node-report": "Invalid node report",
    "invalid-request": "Invalid request",
    "refused": "Refused by the catalog",
    "conflict": "Concurrent change",
    "key-reused": "Idempotency key reused",
    "not-found": "Not found",
    "unauthenticated": "Authentication required",
    "forbidden": "Not allowed",
    "too-large": "Request body too large",
    "method-not-allowed": "Method not allowed",
    "unavailable": "Database unavailable",
    "internal": "Internal error",
}


class ProblemDoc(BaseModel):
    """The problem body, for the OpenAPI document."""

    model_config = ConfigDict(extra="allow", title="Problem")

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None


class Problem(Exception):
    """Raised by a route: answered as a problem document with this status."""

    def __init__(
        self,
        status: int,
        kind: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.detail = detail
        self.headers = headers
        self.extra = {k: v for k, v in extra.items() if v is not None}


def refused(exc: CatalogError, kind: str = "refused", status: int = 409) -> Problem:
    """A catalog refusal, with its structured fields."""
    return Problem(status, kind, str(exc), model=exc.model, profile=exc.profile, field=exc.field)


def problem_response(
    request: Request | None,
    status: int,
    kind: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    body: dict[str, Any] = {
        "type": f"urn:llmgw:problem:{kind}",
        "title": TITLES.get(kind, kind),
        "status": status,
        "detail": detail,
    }
    if request is not None:
        if is_openai(request.url.path):
            # OpenAI's clients show only {"error": {"message"}} (see llmgw.api.rendering.openai).
            return JSONResponse(error_body(status, kind, detail), status, headers=headers)
        body["instance"] = request.url.path
    body.update(extra)
    return Response(
        json.dumps(body, ensure_ascii=False, default=str).encode(),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def install(app: FastAPI) -> None:
    """Every error the app can answer becomes a problem document."""

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Problem)
        return problem_response(request, exc.status, exc.kind, exc.detail, exc.headers, **exc.extra)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = {404: "not-found", 405: "method-not-allowed", 401: "unauthenticated"}.get(
            exc.status_code, "invalid-request"
        )
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}; see /openapi.json"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route whose path matched; a path
            # served by several routes (PUT and DELETE on one model) allows them all.
            headers["Allow"] = ", ".join(allowed_methods(request))
        return problem_response(request, exc.status_code, kind, detail, headers)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = [_describe(e) for e in exc.errors()]
        return problem_response(request, 422, "invalid-request", "; ".join(problems))

    async def on_data(request: Request, exc: Exception) -> Response:
        # A value the domain accepts but the database column cannot hold (a name
        # longer than the column, an integer out of range): the request's fault.
        return problem_response(
            request, 422, "invalid-request", f"the database cannot store a value: {_first(exc)}"
        )

    async def on_unavailable(request: Request, exc: Exception) -> Response:
        log.error("api.database_unavailable", path=request.url.path, error=_first(exc))
        return problem_response(
            request,
            503,
            "unavailable",
            f"cannot use the database: {_first(exc)}",
            {"Retry-After": "5"},
        )

    async def on_gone(request: Request, exc: Exception) -> Response:
        # The client went away before sending its whole body: nothing to answer and no
        # fault of the server's, so no traceback at error level. 499 is nginx's word.
        log.info("api.client_gone", method=request.method, path=request.url.path)
        return Response(status_code=499)

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.error(
            "api.error",
            method=request.method,
            path=request.url.path,
            error=repr(exc),
            traceback="".join(traceback.format_exception(exc)),
        )
        return problem_response(request, 500, "internal", "internal error; see the server log")

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(DataError, on_data)
    app.add_exception_handler(ClientDisconnect, on_gone)
    # Unreachable, dropped, or every pooled connection busy for the pool's whole timeout:
    # the client should come back, not report a bug.
    for unavailable in (OperationalError, InterfaceError, PoolTimeout):
        app.add_exception_handler(unavailable, on_unavailable)
    app.add_exception_handler(Exception, on_crash)


def _describe(error: Any) -> str:
    loc = ".".join(str(p) for p in error.get("loc", ()) if p not in ("query", "path", "header"))
    got = error.get("input")
    shown = "" if got is None or isinstance(got, dict) else f" (got {str(got)[:60]!r})"
    return f"{loc or 'request'}: {error.get('msg', 'invalid')}{shown}"


def _first(exc: Exception) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


class ApiJSON(JSONResponse):
    """JSON that never fails to render: a non-finite float stored by another writer
    (the catalog accepts a NaN weight from a YAML file) is sent as null, since JSON
    has no NaN and the alternative is a 500 on every read."""

    def render(self, content: Any) -> bytes:
        return json_text(content, ensure_ascii=False).encode("utf-8")


def json_text(content: Any, *, ensure_ascii: bool = True) -> str:
    """Compact JSON on one line; non-finite floats become null (see ``ApiJSON``)."""
    try:
        return json.dumps(
            content, ensure_ascii=ensure_ascii, allow_nan=False, separators=(",", ":")
        )
    except ValueError:
        return json.dumps(
            _finite(content), ensure_ascii=ensure_ascii, allow_nan=False, separators=(",", ":")
        )


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error responses a route documents (each a problem document; see app.openapi)."""
    descriptions = {
        401: "no token, or a token that is not configured",
        403: "the token's role does not allow this",
        404: "no such model or node",
        405: "the path names a route that does not serve this method (see Allow)",
        409: "refused by a rule of the catalog, a concurrent change, or a reused key",
        413: "the body is larger than the server accepts",
        422: "the request is invalid (the detail says how)",
        503: "the database cannot be reached",
    }
    return {s: {"description": descriptions[s]} for s in statuses}


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on the request's path, sorted: a 405's ``Allow``.

    Asked of the router itself (a route matches fully only for a method it serves), so
    it holds however routes are included or their paths overlap.
    """
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")
