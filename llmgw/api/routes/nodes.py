"""Nodes and placements: an agent's report (also its heartbeat), the inventory, and what
runs where.

An agent reports with a token issued for its node names; the name in the path
fills the report's ``name`` or must equal it, so a report cannot be sent for
one node and recorded for another.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from catalog.definition.identifiers import FABRIC, GPU_CLASS, LABEL_KEY, LABEL_VALUE, NODE_NAME
from llmgw.api.guards.bodies import receive, text_problem
from llmgw.api.rendering import schemas
from llmgw.api.rendering.problems import ApiJSON, Problem, errors
from llmgw.api.rendering.schemas import grammar_schema, http_url_schema, printable_schema
from llmgw.api.reports.node_reports import Recorded, read_report, unstorable
from llmgw.api.routes.access import SECURED, Reader, Reporter
from llmgw.api.routes.autoscale import measured_capacities
from llmgw.api.runtime.services import Services
from llmgw.views import node_json, replica_json
from scheduler.lifecycle.replica_reports import MAX_CONTEXT_DETAIL, MAX_ENDPOINT, MAX_MESSAGE
from scheduler.planner.fleet.inventory import NodeReport

router = APIRouter()


def _report_body() -> dict[str, Any]:
    schema = NodeReport.model_json_schema(ref_template="#/components/schemas/{model}")
    schema["required"] = [r for r in schema.get("required", []) if r != "name"]
    schema["description"] = (
        "An agent's report of its node; `name` may be left out, and if given must be the "
        "path's (otherwise 422). `gpus_reserved` is at most `gpus`, and a replica is "
        "reported once (otherwise 422)."
    )
    _report_grammars(schema)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


def _report_grammars(schema: dict[str, Any]) -> None:
    """What ``NodeReport`` checks (the identifier grammar, printable text, a GPU class
    exactly when there are cards), so the document calls valid what the server takes."""
    report = schema["properties"]
    report["name"] = {**report["name"], **grammar_schema(NODE_NAME)}
    # "" means absent (agents written against the Go control plane send it).
    for name, grammar in (("gpu_class", GPU_CLASS), ("fabric", FABRIC)):
        report[name] = {
            "title": report[name]["title"],
            "anyOf": [grammar_schema(grammar, empty=True), {"type": "null"}],
        }
    report["labels"]["propertyNames"] = grammar_schema(LABEL_KEY)
    report["labels"]["additionalProperties"] = grammar_schema(LABEL_VALUE)
    no_class = {"anyOf": [{"type": "null"}, {"const": ""}]}
    schema["anyOf"] = [
        {"properties": {"gpus": {"const": 0}, "gpu_class": no_class}},
        {
            "required": ["gpus", "gpu_class"],
            "properties": {"gpus": {"minimum": 1}, "gpu_class": {"type": "string", "minLength": 1}},
        },
    ]
    replica = schema["$defs"]["ReplicaReport"]["properties"]
    replica["model"] = {**replica["model"], **printable_schema(255)}
    replica["profile"] = {**replica["profile"], **printable_schema(255)}
    replica["message"] = {**replica["message"], **printable_schema(MAX_MESSAGE)}
    detail = replica["context_detail"]
    replica["context_detail"] = {**detail, **printable_schema(MAX_CONTEXT_DETAIL)}
    # An http:// or https:// URL such as http://10.0.0.7:8000
    # (scheduler.lifecycle.replica_reports._url).
    url = http_url_schema(MAX_ENDPOINT)
    replica["endpoint"] = {"title": replica["endpoint"]["title"], "anyOf": [url, {"type": "null"}]}


@router.put(
    "/v1/nodes/{name}",
    response_model=schemas.ReportAnswer,
    responses=errors(401, 403, 413, 422, 503),
    openapi_extra={**_report_body(), **SECURED},
    tags=["nodes"],
    summary="An agent's report of its node (also its heartbeat)",
)
async def report_node(name: str, request: Request, call: Reporter) -> Response:
    svc, who = call.svc, call.who
    problem = text_problem(name, "the node name")
    if problem:
        raise Problem(422, "invalid-node-report", problem)
    if not who.may_report(name):
        allowed = ", ".join(sorted(who.nodes)) or "none"
        raise Problem(
            403,
            "forbidden",
            f"token {who.name!r} may report node(s) {allowed}, not {name!r}; "
            "each agent reports with the token issued for its own nodes",
        )
    body = await receive(request, svc.settings.max_body_bytes)
    recorded = await to_thread.run_sync(_parse_and_record, svc, name, body, who.name)
    return ApiJSON(report_answer(svc, recorded))


def report_answer(svc: Services, recorded: Recorded) -> dict[str, Any]:
    """The node as recorded, the report's id and where to send heartbeats naming it, and
    its placement generation (``llmgw.api.reports.placement_generations``)."""
    node, cordon, hosted, report_id = recorded
    answer = node_json(node, datetime.now(UTC), svc.settings.policy, cordon, hosted)
    port = svc.leases.port
    if port is not None:
        answer["report_id"] = report_id
        answer["heartbeat_port"] = port
    answer["placements_generation"] = svc.leases.generations.of(node.name)
    return answer


def _parse_and_record(svc: Services, name: str, body: bytes, actor: str) -> Recorded:
    """Parse, validate and store, in a worker thread: nothing of it runs on the event loop."""
    return _record(svc, read_report(name, body, svc.settings.max_body_bytes), actor)


def _record(svc: Services, report: NodeReport, actor: str) -> Recorded:
    # Committed with the reports other agents sent meanwhile (llmgw.api.reports.node_reports);
    # answered only once committed, as a report sent alone would be.
    try:
        recorded = svc.reports.submit((report, actor))
    except OverflowError as exc:
        raise unstorable(exc) from None
    svc.metrics.node_reports.inc()
    return recorded


@router.get(
    "/v1/nodes",
    response_model=list[schemas.NodeState],
    responses=errors(401, 503),
    openapi_extra=SECURED,
    tags=["nodes"],
    summary="The inventory as reported, with each node's freshness",
)
def list_nodes(call: Reader) -> Response:
    now, svc = datetime.now(UTC), call.svc
    cordons, hosted = svc.nodes.service()
    return ApiJSON(
        [
            node_json(n, now, svc.settings.policy, cordons.get(n.name), hosted.get(n.name, 0))
            for n in svc.nodes.nodes()
        ]
    )


@router.get(
    "/v1/placements",
    response_model=list[schemas.PlacementEntry],
    responses=errors(401, 503),
    openapi_extra=SECURED,
    tags=["nodes"],
    summary="Where every replica runs and its state; with ?node=, what that node's agent "
    "should run",
)
def list_placements(
    call: Reader,
    node: Annotated[str | None, Query(description="only replicas on this node")] = None,
    model: Annotated[
        str | None, Query(description="only replicas of this model (a name or alias)")
    ] = None,
) -> Response:
    svc = call.svc
    catalog = svc.gate.view().catalog
    if model is not None:
        model = catalog.canonical(model) or model
    replicas = svc.nodes.replicas(node=node, model=model)
    measured = measured_capacities(svc)
    book = svc.nodes.versions
    return ApiJSON(
        call.shown(
            [
                replica_json(p, catalog, status, book.engine_view(p, catalog), measured)
                for p, status in replicas
            ],
            node=node,
        )
    )
