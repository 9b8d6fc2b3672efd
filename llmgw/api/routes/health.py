"""Liveness, readiness and metrics.

``/healthz`` answers while the process serves (restart it if not);
``/readyz`` only when the database answers and its schema is at the head
revision (send it traffic only then); ``/metrics`` is Prometheus' text format.
"""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import Response

from events.database.migrate import current_revision, is_at_head
from llmgw.api.rendering import schemas
from llmgw.api.rendering.problems import ApiJSON, Problem, errors
from llmgw.api.routes.access import SECURED, Anyone, Reader
from llmgw.api.telemetry.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/healthz", response_model=schemas.Health, tags=["health"], summary="Liveness")
def healthz() -> Response:
    return ApiJSON({"status": "ok"})


@router.get(
    "/readyz",
    response_model=schemas.Ready,
    responses=errors(503),
    tags=["health"],
    summary="Readiness: the database answers and its schema is at head",
)
def readyz(svc: Anyone) -> Response:
    try:
        at_head = is_at_head(svc.engine)
        revision = current_revision(svc.engine)
        if not at_head:
            raise Problem(
                503,
                "unavailable",
                f"the database schema is at {revision}, not at this release's head; "
                "run `llmgw db upgrade`",
            )
        position = svc.gate.view().position
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None) or exc
        detail = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        raise Problem(503, "unavailable", f"cannot use the database: {detail}") from None
    return ApiJSON(
        {
            "status": "ready",
            "schema_revision": revision,
            "catalog_position": position,
            # A refused edit of the declared file does not make the server unready: the
            # catalog in force keeps running. It is said here, for probes and people.
            "declared": svc.declared_watch.to_json(),
        }
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **errors(401),
    },
    openapi_extra=SECURED,
    tags=["health"],
    summary="Prometheus metrics (text format)",
)
def metrics(call: Reader) -> Response:
    return Response(call.svc.metrics.render(), media_type=CONTENT_TYPE)
