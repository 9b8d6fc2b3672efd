"""Who may do what: one FastAPI dependency per kind of route, turning a bearer token into a
``Caller`` (the services, and who is calling).

- No token where one is needed, or a token that is not configured: 401, with
  ``WWW-Authenticate: Bearer``. A wrong token is refused even on a route that
  is open to reading: a bad credential is a bug or an attack, never ignored.
- A configured token whose role does not allow the call: 403.

One ``async`` dependency per route, reading the header itself, because
dependency resolution is most of what a read costs: FastAPI runs a plain
``def`` dependency in its thread pool, and a graph of small dependencies
(a bearer scheme, the services, the principal, the role) cost more than the
whole route did. The bearer scheme is declared in the OpenAPI document by
``app._openapi`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, cast

from fastapi import Depends, Request

from catalog.secrecy.secrets import redact
from llmgw.api.guards.tokens import Principal, Role
from llmgw.api.rendering.problems import Problem
from llmgw.api.runtime.services import Services

T = TypeVar("T")

ANONYMOUS = Principal("anonymous", Role.READER)
# Merged into a route's OpenAPI operation: it takes a bearer token.
SECURED: dict[str, Any] = {"security": [{"bearer": []}]}


@dataclass(frozen=True, slots=True)
class Caller:
    svc: Services
    who: Principal

    def sees_secrets(self, node: str | None = None) -> bool:
        """Whether plain secret-looking env values are shown to this caller unredacted.

        An operator sees them; so does an agent reading the placements of a node it
        reports (``?node=``): it runs the engines, and a value written in plain text
        before such values were refused must still reach them. Anyone else reads
        ``[redacted]`` (catalog.secrecy.secrets).
        """
        if self.who.role is Role.OPERATOR:
            return True
        return self.who.role is Role.AGENT and node is not None and node in self.who.nodes

    def shown(self, value: T, node: str | None = None) -> T:
        """``value`` (JSON-ready) as this caller may see it."""
        return value if self.sees_secrets(node) else cast(T, redact(value))


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def _principal(request: Request, svc: Services) -> Principal | None:
    header = request.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(
            401,
            "unauthenticated",
            "the Authorization header must be `Bearer <token>`",
            headers={"WWW-Authenticate": 'Bearer error="invalid_request"'},
        )
    principal = svc.book.verify(token.strip())
    if principal is None:
        raise Problem(
            401,
            "unauthenticated",
            "the token is not configured on this server (revoked, or mistyped)",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    request.state.actor = principal.name
    return principal


def _required(principal: Principal | None, what: str) -> Principal:
    if principal is None:
        raise Problem(
            401,
            "unauthenticated",
            f"{what} needs a bearer token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


async def reader(request: Request) -> Caller:
    svc = services(request)
    principal = _principal(request, svc)
    if principal is None and svc.settings.reads_open:
        return Caller(svc, ANONYMOUS)
    who = _required(principal, "reading")
    if not who.may_read(request.url.path):
        raise Problem(403, "forbidden", _read_refusal(who))
    return Caller(svc, who)


def _read_refusal(who: Principal) -> str:
    if who.role is Role.CLIENT:
        return (
            f"token {who.name!r} is a client token: it calls a gateway (`llmgw gateway`, "
            "/v1/chat/completions), not the control plane; use a reader token here"
        )
    return (
        f"token {who.name!r} has the gateway role: it reads the catalog, the placements and "
        "the client tokens only; use a reader token for the rest"
    )


def _allowed(request: Request, doing: str, may: Callable[[Principal], bool], needs: str) -> Caller:
    """The caller, if a token is sent and its role ``may`` do this; 401 or 403 otherwise.

    ``doing`` names the call in the 401 ("reporting a node needs a bearer token"),
    ``needs`` says in the 403 which token would do."""
    svc = services(request)
    who = _required(_principal(request, svc), doing)
    if not may(who):
        raise Problem(
            403, "forbidden", f"token {who.name!r} has the {who.role.value} role; {needs}"
        )
    return Caller(svc, who)


async def gateway(request: Request) -> Caller:
    """A gateway (or an operator, for tooling): the client tokens' hashes."""
    return _allowed(
        request,
        "reading the client tokens",
        lambda who: who.role in (Role.GATEWAY, Role.OPERATOR),
        "the client tokens are read by a gateway token (`llmgw token new NAME --role gateway`)",
    )


async def operator(request: Request) -> Caller:
    return _allowed(
        request,
        "changing the catalog",
        Principal.may_change_catalog,
        "changing the catalog needs an operator token",
    )


async def reporter(request: Request) -> Caller:
    """Any token that may report some node; which node is checked by the route."""
    return _allowed(
        request,
        "reporting a node",
        lambda who: who.role in (Role.AGENT, Role.OPERATOR),
        "reporting a node needs its agent token",
    )


async def signaller(request: Request) -> Caller:
    """A gateway posting its load windows (``POST /v1/signals``), or an operator's tooling."""
    return _allowed(
        request,
        "posting signal windows",
        Principal.may_report_signals,
        "signal windows are posted with a gateway token (or an operator's)",
    )


async def anyone(request: Request) -> Services:
    """For the routes open to all (health, readiness)."""
    return services(request)


Reader = Annotated[Caller, Depends(reader)]
Operator = Annotated[Caller, Depends(operator)]
Reporter = Annotated[Caller, Depends(reporter)]
Gateway = Annotated[Caller, Depends(gateway)]
Signaller = Annotated[Caller, Depends(signaller)]
Anyone = Annotated[Services, Depends(anyone)]
