"""The catalog: the OpenAI-compatible model list, full definitions, and add/apply/remove.

Where a refusal is raised says what it is: ``parse_definitions`` refusing a
body is an invalid definition (422). A command's refusal carries its kind
(``CatalogError.kind``, catalog.errors) and the status follows from it alone:
a model that is not in the catalog (404); a valid definition refused because
of what is already in the catalog (a collision, a declared model, a dependent
fallback), a conflict with concurrent writers or a reused idempotency key (409).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Header, Query, Request, Response
from starlette.convertors import Convertor, register_url_convertor

from catalog import Catalog, CatalogError, Model, RefusalKind, parse_definitions
from catalog.definition.identifiers import KEY_PATTERN, IdentifierError
from catalog.reading.declared import require_models
from events.write.apply import ApplyResult
from events.write.commands import CommandConflict, CommandResult, KeyReused
from llmgw.api.guards.bodies import ORIGIN, parse, receive, text_problem
from llmgw.api.rendering import schemas
from llmgw.api.rendering.problems import ApiJSON, Problem, errors, refused
from llmgw.api.routes.access import SECURED, Operator, Reader
from llmgw.api.runtime.services import Services
from llmgw.views import command_json, event_json, model_entry, openai_entry
from scheduler.daemon.node_service import replica_counts
from scheduler.planner.demands import demands
from scheduler.planner.fleet.placements import Resilience
from scheduler.planner.resilience import resilience


class _Lookup(Convertor[str]):
    """A model's name or alias as ``GET /v1/catalog/{name}`` takes it: any path but the
    write routes' own (``models``, ``models/...``).

    Otherwise the lookup, whose name may hold slashes, also matches the paths of
    ``POST /v1/catalog/models`` and ``PUT|DELETE /v1/catalog/models/{name}``: a GET or
    OPTIONS there was answered as a lookup of a model called "models", or as a 405
    allowing only GET. Every model, those whose name starts so included (``models``,
    ``models/llama-3``), is also read at ``GET /v1/catalog/models/{name}``: the path its
    ``PUT`` and ``DELETE`` take.
    """

    regex = r"(?!models(?:/|$)).+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("lookup", _Lookup())
router = APIRouter()

# Keys are stored as event ids (with ``#2``... for a list): printable, bounded.
KeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=KEY_PATTERN,
        description="The same key again is recorded once and answers the first outcome "
        "(200); with a different change it is refused (409).",
    ),
]
ReasonQuery = Annotated[str, Query(max_length=2000, description="why (recorded in the log)")]


def _definition_body(*, one_only: bool = False) -> dict[str, Any]:
    one = {"$ref": "#/components/schemas/ModelDefinition"}
    if one_only:
        return {
            "requestBody": {
                "required": True,
                "description": "One model definition whose name is the path's (JSON, or "
                "YAML); the shape of a file given to `llmgw apply`. A body naming another "
                "model is refused with 422 (field `name`): PUT it to its own name's path.",
                "content": {"application/json": {"schema": one}},
            }
        }
    many = {
        "type": "object",
        "properties": {"models": {"type": "array", "items": one, "minItems": 1}},
        "required": ["models"],
        "additionalProperties": False,
    }
    return {
        "requestBody": {
            "required": True,
            "description": 'One model definition, or `{"models": [...]}` (all or nothing); '
            "the shape of a file given to `llmgw add` (JSON, or YAML).",
            "content": {"application/json": {"schema": {"anyOf": [one, many]}}},
        }
    }


@router.get(
    "/v1/models",
    response_model=schemas.OpenAIModelList,
    responses=errors(401, 503),
    tags=["catalog"],
    summary="The models clients can request (OpenAI-compatible list)",
    openapi_extra=SECURED,
)
def list_models(call: Reader) -> Response:
    view = call.svc.gate.view()
    catalog, created = view.catalog, call.svc.created.created(view.position)
    return ApiJSON(
        {
            "object": "list",
            "data": [openai_entry(catalog, m, created.get(m.name, 0)) for m in catalog.models()],
        }
    )


@router.get(
    "/v1/models/{model_id:path}",
    response_model=schemas.OpenAIModel,
    responses=errors(401, 404, 503),
    tags=["catalog"],
    summary="One model, by name or alias (OpenAI-compatible: the SDK's models.retrieve)",
    openapi_extra=SECURED,
)
def retrieve_model(model_id: str, call: Reader) -> Response:
    view = call.svc.gate.view()
    model = view.catalog.resolve(model_id)
    if model is None:
        raise Problem(
            404,
            "not-found",
            f"model {model_id!r} is not in the catalog (neither a name nor an alias); "
            "GET /v1/models lists them",
        )
    created = call.svc.created.created(view.position).get(model.name, 0)
    return ApiJSON(openai_entry(view.catalog, model, created))


@router.get(
    "/v1/catalog",
    response_model=list[schemas.CatalogEntry],
    responses=errors(401, 503),
    tags=["catalog"],
    summary="Every model's full definition (as `llmgw models --json`)",
    openapi_extra=SECURED,
)
def get_catalog(call: Reader) -> Response:
    view = call.svc.gate.view()
    counts = replica_counts(view.catalog, call.svc.nodes.replicas())
    figures = _resilience(call, view.catalog)
    return ApiJSON(
        call.shown(
            [
                model_entry(view.catalog, m, counts[m.name], figures.get(m.name))
                for m in view.catalog.models()
            ]
        ),
        headers={"X-Llmgw-Position": str(view.position)},
    )


def _resilience(call: Reader, catalog: Catalog) -> dict[str, Resilience]:
    """Each model's resilience under the placements now, as `llmgw models` computes it."""
    nodes = {n.name: n for n in call.svc.nodes.nodes()}
    placements = call.svc.nodes.state().placements
    return {r.model: r for r in resilience(demands(catalog), placements, nodes)}


@router.get(
    "/v1/catalog/{name:lookup}",
    response_model=schemas.CatalogEntry,
    responses=errors(401, 404, 503),
    tags=["catalog"],
    summary="One model's definition, by name or alias",
    openapi_extra=SECURED,
)
def get_model(name: str, call: Reader) -> Response:
    return _model_entry(name, call)


@router.get(
    "/v1/catalog/models/{name:path}",
    response_model=schemas.CatalogEntry,
    responses=errors(401, 404, 503),
    tags=["catalog"],
    summary="One model's definition, by name or alias, at the path PUT and DELETE take "
    "(any name, also one starting with `models`)",
    openapi_extra=SECURED,
)
def get_catalog_model(name: str, call: Reader) -> Response:
    return _model_entry(name, call)


def _model_entry(name: str, call: Reader) -> Response:
    view = call.svc.gate.view()
    model = view.catalog.resolve(name)
    if model is None:
        raise Problem(
            404, "not-found", f"model {name!r} is not in the catalog (neither a name nor an alias)"
        )
    counts = replica_counts(view.catalog, call.svc.nodes.replicas(model=model.name))
    figure = _resilience(call, view.catalog).get(model.name)
    return ApiJSON(
        call.shown(model_entry(view.catalog, model, counts[model.name], figure)),
        headers={"X-Llmgw-Position": str(view.position)},
    )


@router.post(
    "/v1/catalog/models",
    status_code=201,
    response_model=schemas.CommandOutcome,
    responses={
        200: {"model": schemas.CommandOutcome, "description": "already recorded (same key)"},
        **errors(401, 403, 409, 413, 422, 503),
    },
    openapi_extra={**_definition_body(), **SECURED},
    tags=["catalog"],
    summary="Add one model or a list, all or nothing",
)
async def add_models(
    request: Request, call: Operator, key: KeyHeader = None, reason: ReasonQuery = ""
) -> Response:
    _check_reason(reason)
    body = await receive(request, call.svc.settings.max_body_bytes)
    result = await to_thread.run_sync(_add, call.svc, body, call.who.name, reason, key)
    return _outcome(result)


def _definitions(svc: Services, body: bytes) -> list[Model]:
    data = parse(body, svc.settings.max_body_bytes, "invalid-definition")
    try:
        return require_models(parse_definitions(data, ORIGIN), ORIGIN)
    except CatalogError as exc:
        raise refused(exc, "invalid-definition", 422) from None


def _add(svc: Services, body: bytes, actor: str, reason: str, key: str | None) -> CommandResult:
    """Parse, validate and append, in a worker thread: nothing of it runs on the event loop."""
    models = _definitions(svc, body)
    with _refusals():
        return svc.gate.add(models, actor=actor, reason=reason, key=key)


# A refusal's kind -> its status and problem type, when the exception names no better type.
_BY_KIND: dict[RefusalKind, tuple[int, str]] = {
    "not_found": (404, "not-found"),
    "conflict": (409, "refused"),
    "invalid": (422, "invalid-definition"),
}


@contextmanager
def _refusals() -> Iterator[None]:
    """A command's refusals as the API answers them (the same words the CLI prints),
    by the kind each carries: nothing is read again to classify one."""
    try:
        yield
    except KeyReused as exc:
        raise refused(exc, "key-reused") from None
    except IdentifierError as exc:  # an actor, reason or key outside the grammar
        raise refused(exc, "invalid-request", 422) from None
    except CatalogError as exc:
        status, kind = _BY_KIND[exc.kind]
        raise refused(exc, kind, status) from None
    except CommandConflict as exc:
        raise Problem(409, "conflict", str(exc)) from None


@router.put(
    "/v1/catalog/models/{name:path}",
    response_model=schemas.ApplyOutcome,
    responses={
        201: {"model": schemas.ApplyOutcome, "description": "added (the model was absent)"},
        # 404: a path no route takes (a name with a newline is no name: the grammar).
        **errors(401, 403, 404, 409, 413, 422, 503),
    },
    openapi_extra={**_definition_body(one_only=True), **SECURED},
    tags=["catalog"],
    summary="Add a model, or replace a runtime model's definition in one event",
)
async def apply_model(
    name: str, request: Request, call: Operator, key: KeyHeader = None, reason: ReasonQuery = ""
) -> Response:
    _check_reason(reason)
    body = await receive(request, call.svc.settings.max_body_bytes)
    apply = partial(_apply, call.svc, name, body, actor=call.who.name, reason=reason, key=key)
    result = await to_thread.run_sync(apply)
    answer = {**result.to_json(), "events": [event_json(e) for e in result.events]}
    created = result.outcome == "added" and not result.already_recorded
    return ApiJSON(answer, status_code=201 if created else 200)


def _one_definition(svc: Services, name: str, body: bytes) -> Model:
    models = _definitions(svc, body)
    if len(models) != 1:
        raise Problem(
            422,
            "invalid-definition",
            f"{ORIGIN}: PUT takes one model definition, and this body holds {len(models)}; "
            "send one (or add a list with POST /v1/catalog/models)",
        )
    if models[0].name != name:
        raise Problem(
            422,
            "invalid-definition",
            f"{ORIGIN}: the path names model {name!r} but the body defines "
            f"{models[0].name!r}; PUT a definition to its own name's path "
            f"(/v1/catalog/models/{models[0].name})",
            model=models[0].name,
            field="name",
        )
    return models[0]


def _apply(
    svc: Services, name: str, body: bytes, *, actor: str, reason: str, key: str | None
) -> ApplyResult:
    """Parse, validate and append, in a worker thread: nothing of it runs on the event loop."""
    model = _one_definition(svc, name, body)
    with _refusals():
        return svc.gate.apply(model, actor=actor, reason=reason, key=key)


@router.delete(
    "/v1/catalog/models/{name:path}",
    response_model=schemas.CommandOutcome,
    responses=errors(401, 403, 404, 409, 422, 503),
    openapi_extra=SECURED,
    tags=["catalog"],
    summary="Remove a model added at runtime",
)
async def remove_model(
    name: str, call: Operator, key: KeyHeader = None, reason: ReasonQuery = ""
) -> Response:
    _check_reason(reason)
    result = await to_thread.run_sync(_remove, call.svc, name, call.who.name, reason, key)
    return _outcome(result, created=False)


def _remove(svc: Services, name: str, actor: str, reason: str, key: str | None) -> CommandResult:
    with _refusals():
        return svc.gate.remove(name, actor=actor, reason=reason, key=key)


def _check_reason(reason: str) -> None:
    problem = text_problem(reason, "reason")
    if problem:
        raise Problem(422, "invalid-request", problem)


def _outcome(result: CommandResult, *, created: bool = True) -> Response:
    return ApiJSON(
        command_json(result),
        status_code=201 if created and not result.already_recorded else 200,
    )
