"""The app factory: routes, errors, logs, metrics and the OpenAPI document over one set of
services.

``create_app`` takes what the CLI's composition root already built (the
engine, the declared catalog, the settings), so ``llmgw serve`` and tests wire
it the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import structlog
from anyio import to_thread
from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from catalog import Model
from llmgw.api import problems
from llmgw.api.background import SchedulerThread
from llmgw.api.middleware import RequestLog
from llmgw.api.problems import PROBLEM_JSON, ApiJSON, ProblemDoc
from llmgw.api.queries import known_query
from llmgw.api.routes import catalog, events, health, nodes, service
from llmgw.api.services import Services

log = structlog.get_logger("llmgw.api")

TITLE = "llmgw control plane"
DESCRIPTION = (
    "The model catalog and the placement scheduler of an LLM-serving cluster. Errors are "
    "`application/problem+json` (RFC 9457). Authenticate with `Authorization: Bearer <token>` "
    "(`llmgw token new`)."
)
_REF = "#/components/schemas/{model}"
EXAMPLE_MODEL = {
    "name": "qwen2.5-coder-7b",
    "aliases": ["coder"],
    "source": "Qwen/Qwen2.5-Coder-7B-Instruct",
    "profiles": [{"name": "t4-tp2", "gpu_class": "T4", "tp": 2}],
    "scaling": {"min": 1},
    "context_length": 32768,
}


def create_app(services: Services, *, scheduler: SchedulerThread | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Replay (or restore a snapshot) now, so the first request does not pay for it
        # and a log that cannot be read stops the start rather than every request.
        view = await to_thread.run_sync(services.gate.view)
        log.info("api.catalog_ready", position=view.position, models=len(view.catalog))
        if scheduler is not None:
            scheduler.start()
        try:
            yield
        finally:
            services.stopping.set()
            if scheduler is not None:
                await to_thread.run_sync(scheduler.stop)

    app = FastAPI(
        title=TITLE,
        description=DESCRIPTION,
        version=_version(),
        lifespan=lifespan,
        default_response_class=ApiJSON,
        redoc_url=None,
        dependencies=[Depends(known_query)],
    )
    app.state.services = services
    problems.install(app)
    for area in (catalog, events, nodes, service, health):
        app.include_router(area.router)
    app.add_middleware(RequestLog, metrics=services.metrics)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _version() -> str:
    try:
        return version("llmgw-control")
    except PackageNotFoundError:
        return "0"


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the bodies the routes parse themselves and problem errors."""
    doc = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    doc.setdefault("components", {})["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `llmgw token new`; its name is recorded as the actor.",
        }
    }
    components: dict[str, Any] = doc["components"].setdefault("schemas", {})
    components["Problem"] = ProblemDoc.model_json_schema(ref_template=_REF)
    definition = Model.model_json_schema(ref_template=_REF)
    for name, sub in definition.pop("$defs", {}).items():
        components[name] = sub
    # What validate() insists on, so that generated definitions are worth sending.
    properties = definition["properties"]
    definition["required"] = ["name", "source", "profiles"]
    properties["name"]["minLength"] = properties["source"]["minLength"] = 1
    properties["profiles"]["minItems"] = 1
    definition["title"] = "ModelDefinition"
    definition["example"] = EXAMPLE_MODEL
    components["ModelDefinition"] = definition
    profile = components["Profile"]
    profile["required"] = ["name"]
    profile["properties"]["name"]["minLength"] = 1
    # Only an engine that can serve on CPU may leave the GPU class out (catalog.model).
    profile["anyOf"] = [
        {"required": ["gpu_class"], "properties": {"gpu_class": {"minLength": 1}}},
        {"required": ["engine"], "properties": {"engine": {"const": "llamacpp"}}},
    ]
    _durations(components)
    for item in doc.get("paths", {}).values():
        for operation in item.values():
            for status, response in operation.get("responses", {}).items():
                if status.isdigit() and int(status) >= 400:
                    response["content"] = {
                        PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}
                    }
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return doc


def _durations(node: Any) -> None:
    """Durations are written ``90s``, ``20m``, ``1h30m`` or as seconds (catalog.durations),
    not in the ISO 8601 form pydantic documents a timedelta with."""
    if isinstance(node, dict):
        for key, value in list(node.items()):
            if isinstance(value, dict) and value.get("format") == "duration":
                node[key] = {
                    "title": value.get("title", key),
                    "description": "a duration: 90s, 20m, 1h30m, 80ms, or seconds",
                    "anyOf": [{"type": "string"}, {"type": "number", "minimum": 0}],
                }
            else:
                _durations(value)
    elif isinstance(node, list):
        for value in node:
            _durations(value)
