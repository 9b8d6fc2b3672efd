"""The app factory: routes, errors, logs, metrics and the OpenAPI document over one set of
services.

``create_app`` takes what the CLI's composition root already built (the
engine, the declared catalog, the settings), so ``llmgw serve`` and tests wire
it the same way.
"""

from __future__ import annotations

import gc
import inspect
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import structlog
from anyio import to_thread
from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.types import ASGIApp

from catalog import Model
from catalog.definition.identifiers import (
    ALIAS,
    ENGINE,
    GPU_CLASS,
    LABEL_KEY,
    LABEL_VALUE,
    MODEL_NAME,
    NODE_NAME,
    PROFILE_NAME,
    REASON,
    ROUTING_PROFILE,
    SOURCE,
    Grammar,
)
from catalog.definition.model import (
    MAX_MEMORY_GB,
    MAX_PARALLEL,
    MAX_PRIORITY,
    MAX_REPLICAS,
    MAX_SLOTS,
)
from llmgw.api.guards.queries import known_query
from llmgw.api.pages import dashboard, manual, swagger_ui
from llmgw.api.rendering import problems
from llmgw.api.rendering.openai import OPENAI_ERROR, is_openai
from llmgw.api.rendering.problems import PROBLEM_JSON, ApiJSON, ProblemDoc
from llmgw.api.rendering.schemas import (
    DURATION_PATTERN,
    grammar_schema,
    share_patterns,
    spread_by_schema,
)
from llmgw.api.reports.heartbeat_listener import HeartbeatListener, ListenerThread
from llmgw.api.routes import (
    autoscale,
    catalog,
    events,
    fleet,
    gateway,
    health,
    nodes,
    service,
    usage,
)
from llmgw.api.routes.report_fast_path import ReportPath
from llmgw.api.runtime.autoscale_gauges import AutoscaleCollector
from llmgw.api.runtime.changes_watch import watch_changes
from llmgw.api.runtime.fleet_gauges import FleetCollector
from llmgw.api.runtime.scheduler_thread import SchedulerThread
from llmgw.api.runtime.services import Services
from llmgw.api.runtime.usage_rollup import UsageRollup
from llmgw.api.telemetry.request_log import RequestLog

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
        heartbeats = await _heartbeats(services)
        if scheduler is not None:
            scheduler.start()
        watching = watch_changes(services)
        rollup = UsageRollup(services)
        rollup.start()
        # What start-up made (modules, the catalog, the tokens of an auth file: 100,000
        # of them at issue 42's scale) moves out of the collector's reach, as the
        # gateway's does: a full collection then walks only what serving makes, and its
        # pauses, which stop the heartbeat listener's thread too, stay short.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            services.stopping.set()
            await to_thread.run_sync(rollup.stop)  # every pending usage row into the log
            await to_thread.run_sync(watching.stop)
            if heartbeats is not None:
                listener, flusher = heartbeats
                await to_thread.run_sync(listener.stop)
                await to_thread.run_sync(flusher.join)  # the last leases written
            if scheduler is not None:
                await to_thread.run_sync(scheduler.stop)

    app = _Api(
        title=TITLE,
        description=DESCRIPTION,
        version=_version(),
        lifespan=lifespan,
        default_response_class=ApiJSON,
        redoc_url=None,
        docs_url=None,
        dependencies=[Depends(known_query)],
        **_NO_TELEMETRY,
    )
    app.state.services = services
    problems.install(app)
    for area in (catalog, events, nodes, service, fleet, health, gateway, autoscale, usage):
        app.include_router(area.router)
    swagger_ui.install(app, TITLE)
    dashboard.install(app)
    manual.install(app)
    app.report_route = _route(nodes.router, "/v1/nodes/{name}", "PUT")
    if not services.metrics.fleet:
        services.metrics.registry.register(FleetCollector(services))
        services.metrics.registry.register(AutoscaleCollector(services))
        services.metrics.fleet = True

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# FastAPI versions with native OpenTelemetry look at the environment and the global
# providers on every request to see whether it is wanted. This service's telemetry is
# its own (/metrics, api.request); saying so spares a node report several percent.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class _Api(FastAPI):
    """FastAPI, with the request log outermost and the node report's common case
    (llmgw.api.routes.report_fast_path) answered inside it, before FastAPI's own middleware.

    Every request is logged and counted by ``RequestLog`` as before; an error that
    reaches FastAPI's error middleware is answered there and then seen by the log
    with its status, as when the log sat inside it.
    """

    report_route: APIRoute

    def build_middleware_stack(self) -> ASGIApp:
        services: Services = self.state.services
        lean = ReportPath(
            super().build_middleware_stack(),
            services,
            route=self.report_route,
            handlers=self.exception_handlers,
        )
        return RequestLog(lean, metrics=services.metrics)


async def _heartbeats(services: Services) -> tuple[ListenerThread, threading.Thread] | None:
    """The heartbeat listener (on its own thread and event loop, so that nothing sent to
    it can hold up the API's) and the thread writing node leases, if heartbeats are on."""
    settings = services.settings
    if settings.heartbeat_host is None:
        return None
    listener = HeartbeatListener(
        services.leases, lambda: services.book, max_connections=settings.heartbeat_connections
    )
    thread = ListenerThread(listener)
    await to_thread.run_sync(thread.start, settings.heartbeat_host, settings.heartbeat_port)
    return thread, services.leases.start(services.stopping)


def _route(router: APIRouter, path: str, method: str) -> APIRoute:
    for route in router.routes:
        if isinstance(route, APIRoute) and route.path == path and method in (route.methods or ()):
            return route
    raise LookupError(f"no route {method} {path}")


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
    # Only an engine that can serve on CPU may leave the GPU class out (catalog.definition.model).
    profile["anyOf"] = [
        {"required": ["gpu_class"], "properties": {"gpu_class": {"minLength": 1}}},
        {"required": ["engine"], "properties": {"engine": {"const": "llamacpp"}}},
    ]
    for item in doc.get("paths", {}).values():
        for operation in item.values():
            # A body schema built by a route (the node report) brings its own $defs,
            # which its references look for among the components: move them there.
            for media in operation.get("requestBody", {}).get("content", {}).values():
                components.update(media.get("schema", {}).pop("$defs", {}))
    _durations(components)
    _grammars(doc, components)
    components["OpenAIError"] = OPENAI_ERROR
    for path, item in doc.get("paths", {}).items():
        # Under /v1/models errors take OpenAI's shape (llmgw.api.rendering.openai).
        error = (
            {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIError"}}}
            if is_openai(path)
            else {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
        )
        for operation in item.values():
            for status, response in operation.get("responses", {}).items():
                if status.isdigit() and int(status) >= 400:
                    response["content"] = error
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    share_patterns(doc, components)
    return doc


def _grammars(doc: dict[str, Any], components: dict[str, Any]) -> None:
    """Each identifier's grammar (catalog.definition.identifiers) where a request carries
    one, so the document calls valid only what the server accepts."""
    for path, item in doc.get("paths", {}).items():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                grammar = _parameter_grammar(path, parameter)
                if grammar is not None:
                    parameter["schema"] = {**parameter["schema"], **grammar_schema(grammar)}
    model, profile = (
        components["ModelDefinition"]["properties"],
        components["Profile"]["properties"],
    )
    _refine(model, "name", MODEL_NAME)
    _refine(model, "source", SOURCE)
    _refine(model, "routing_profile", ROUTING_PROFILE)
    model["aliases"]["items"] = grammar_schema(ALIAS)
    model["fallbacks"]["items"] = grammar_schema(MODEL_NAME)
    _refine(profile, "name", PROFILE_NAME)
    # Left empty, the engine and GPU class take their defaults
    # (catalog.definition.model_rules.normalize).
    _refine(profile, "engine", ENGINE, empty=True)
    _refine(profile, "gpu_class", GPU_CLASS, empty=True)
    profile["node_selector"]["propertyNames"] = grammar_schema(LABEL_KEY)
    profile["node_selector"]["additionalProperties"] = grammar_schema(LABEL_VALUE)
    # A node label to spread over: printable, no spaces (catalog.definition.model_rules).
    placement = components["PlacementRules"]["properties"]
    placement["spread_by"]["anyOf"] = [spread_by_schema(), {"type": "null"}]
    _bounds(components)
    for name in ("ModelDefinition", "Profile", "PlacementRules", "Capabilities", "SLO"):
        _storable_strings(components[name])


def _bounds(components: dict[str, Any]) -> None:
    """The numbers ``catalog.definition.model_rules`` refuses as typos, where one field
    alone decides."""
    model, profile = components["ModelDefinition"], components["Profile"]["properties"]
    for name in ("tp", "pp", "nodes", "gpus_per_node"):
        profile[name]["maximum"] = MAX_PARALLEL
    profile["min_memory_gb"].update(minimum=0, maximum=MAX_MEMORY_GB)
    profile["slots"].update(minimum=0, maximum=MAX_SLOTS)
    for name in ("min", "max"):
        components["Scaling"]["properties"][name]["maximum"] = MAX_REPLICAS
    # A negative max is below any min (a negative min counts as 0); 0 means "min".
    components["Scaling"]["properties"]["max"]["minimum"] = 0
    rollout = components["Rollout"]
    for name in ("max_surge", "max_unavailable"):
        rollout["properties"][name].update(minimum=0, maximum=MAX_REPLICAS)
    # Neither an extra replica nor a missing one (max_surge defaults to 1, the other to 0).
    rollout["not"] = {
        "required": ["max_surge"],
        "properties": {"max_surge": {"const": 0}, "max_unavailable": {"const": 0}},
    }
    # A count, or "N%" of the wanted replicas (catalog.definition.model_rules._validate_disruption).
    components["Disruption"]["properties"]["max_unavailable"]["anyOf"] = [
        {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS},
        {"type": "string", "pattern": "^(100|[0-9]{1,2})%$"},
        {"type": "null"},
    ]
    components["PlacementRules"]["properties"]["priority"].update(
        minimum=-MAX_PRIORITY, maximum=MAX_PRIORITY
    )
    for name in ("context_length", "max_output"):
        model["properties"][name]["minimum"] = 0
    model["properties"]["aliases"]["uniqueItems"] = True


# Any other text of a definition (an argument, an environment variable) is stored as
# it is, so it only may not hold NUL (llmgw.api.guards.bodies.storable).
_NO_NUL = "^[^\\u0000]*$"


def _storable_strings(schema: Any) -> None:
    if isinstance(schema, dict):
        if schema.get("type") == "string" and not {"pattern", "enum", "const"} & schema.keys():
            schema["pattern"] = _NO_NUL
        if isinstance(schema.get("additionalProperties"), dict):
            schema.setdefault("propertyNames", {"type": "string", "pattern": _NO_NUL})
        for value in schema.values():
            _storable_strings(value)
    elif isinstance(schema, list):
        for value in schema:
            _storable_strings(value)


def _parameter_grammar(path: str, parameter: dict[str, Any]) -> Grammar | None:
    name, where = parameter.get("name"), parameter.get("in")
    if where == "query" and name == "reason":
        return REASON
    if where == "path" and name == "name":
        if path.startswith("/v1/nodes/"):
            return NODE_NAME
        if path.startswith("/v1/catalog/models/"):
            return MODEL_NAME
    return None


def _refine(
    properties: dict[str, Any], name: str, grammar: Grammar, *, empty: bool = False
) -> None:
    properties[name] = {**properties[name], **grammar_schema(grammar, empty=empty or None)}


MAX_DURATION_SECONDS = timedelta.max.days * 86_400 + 86_399


def _durations(node: Any) -> None:
    """Durations are written ``90s``, ``20m``, ``1h30m`` or as seconds (catalog.forms.durations),
    not in the ISO 8601 form pydantic documents a timedelta with."""
    if isinstance(node, dict):
        for key, value in list(node.items()):
            if isinstance(value, dict) and value.get("format") == "duration":
                node[key] = {
                    "title": value.get("title", key),
                    "description": "a duration: 90s, 20m, 1h30m, 80ms, or seconds",
                    "anyOf": [
                        {"type": "string", "pattern": DURATION_PATTERN},
                        # A timedelta holds at most 999,999,999 days (catalog.forms.durations
                        # refuses more as "too large").
                        {"type": "number", "minimum": 0, "maximum": MAX_DURATION_SECONDS},
                    ],
                }
            else:
                _durations(value)
    elif isinstance(node, list):
        for value in node:
            _durations(value)
