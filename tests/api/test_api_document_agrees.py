"""Requests ``/openapi.json`` calls valid are not refused, and what the server refuses the
document refuses too (issue 11, item 10), for the requests schemathesis's
``positive_data_acceptance`` check found refused with 422: a ``?reason=`` with a C1
control, a node name outside its grammar, an empty duration, and a model path naming
no valid model. Each is checked twice: against the document's own pattern, and
against a real server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.api.rendering.schemas import http_url_schema, printable_schema, spread_by_schema
from tests.api.server import ApiServer, Tokens, definition, running


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as server:
        yield server


@pytest.fixture(scope="module")
def document(api: ApiServer) -> dict[str, Any]:
    with api.client() as anyone:
        doc: dict[str, Any] = anyone.get("/openapi.json").json()
    return doc


def _parameter(doc: dict[str, Any], path: str, method: str, name: str) -> dict[str, Any]:
    (schema,) = (p["schema"] for p in doc["paths"][path][method]["parameters"] if p["name"] == name)
    return _resolved(doc, schema)


def _resolved(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the components its ``allOf`` refers to merged in (a shared pattern)."""
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema.get("allOf", []):
        merged.update(doc["components"]["schemas"][part["$ref"].rsplit("/", 1)[1]])
    return merged


def _documented(schema: dict[str, Any], value: str) -> bool:
    return re.search(schema["pattern"], value) is not None and len(value) <= schema["maxLength"]


def test_every_reference_of_the_document_resolves(document: dict[str, Any]) -> None:
    # The node report's ReplicaReport lived in the body's own $defs, which schemathesis
    # could not reach, so that part of the body was never generated.
    text = repr(document)
    components = document["components"]["schemas"]
    for ref in set(re.findall(r"#/components/schemas/(\w+)", text)):
        assert ref in components, ref
    assert "$defs" not in text


def test_each_printable_class_is_written_once_and_is_the_servers(
    document: dict[str, Any],
) -> None:
    # Written at every printable field, the ~5 KB classes made the document 217 KB.
    components = document["components"]["schemas"]
    shared = {
        "PrintableText": printable_schema(1)["pattern"],
        "PrintableHttpUrl": http_url_schema(10)["pattern"],
        "SpreadByLabel": spread_by_schema()["pattern"],
    }
    text = json.dumps(document)
    for name, pattern in shared.items():
        assert components[name]["pattern"] == pattern, name
        assert text.count(json.dumps(pattern)) == 1, name
    reason = _parameter(document, "/v1/catalog/models/{name}", "delete", "reason")
    assert reason["pattern"] == shared["PrintableText"]
    assert reason["format"] == "printable" and reason["maxLength"] > 0


@pytest.mark.parametrize(
    ("reason", "valid"),
    [
        ("\x92", False),
        ("a\nb", False),
        ("\u200e", False),
        # Unassigned, private-use and rarer format characters: the document's class
        # let them through and the server refused them (found by schemathesis).
        ("\U0006bcc4", False),
        ("\ue000", False),
        ("\u0600", False),
        ("moved to rack 4 ✓ 😀 \u0301", True),
    ],
)
def test_a_reason_is_refused_exactly_when_the_document_refuses_it(
    api: ApiServer, tokens: Tokens, document: dict[str, Any], reason: str, valid: bool
) -> None:
    schema = _parameter(document, "/v1/catalog/models/{name}", "delete", "reason")
    assert _documented(schema, reason) is valid
    with api.client(tokens.operator) as ops:
        response = ops.delete("/v1/catalog/models/no-such-model", params={"reason": reason})
    # A valid request for a model that is not there is a 404; only an invalid one a 422.
    assert response.status_code == (404 if valid else 422), response.text


def test_an_uncordon_of_a_node_outside_the_grammar_is_documented_as_invalid(
    api: ApiServer, tokens: Tokens, document: dict[str, Any]
) -> None:
    schema = _parameter(document, "/v1/nodes/{name}/uncordon", "post", "name")
    assert not _documented(schema, "\x86")
    assert _documented(schema, "gpu-7.dc1")
    with api.client(tokens.operator) as ops:
        response = ops.post("/v1/nodes/gpu-7.dc1/uncordon", params={"reason": "back"})
    assert response.status_code == 404, response.text  # valid, and not in the inventory


def test_an_empty_duration_is_invalid_by_the_document_and_the_server(
    api: ApiServer, tokens: Tokens, document: dict[str, Any]
) -> None:
    slo = document["components"]["schemas"]["SLO"]["properties"]["ttft_p99"]
    (text,) = (branch for branch in slo["anyOf"] if branch["type"] == "string")
    assert re.search(text["pattern"], "") is None
    assert all(re.search(text["pattern"], d) for d in ("90s", "1h30m", "80ms", "2.5", " 20m "))
    with api.client(tokens.operator) as ops:
        refused = ops.post("/v1/catalog/models", json=definition("slo-empty", slo={"ttft_p99": ""}))
        accepted = ops.post(
            "/v1/catalog/models", json=definition("slo-set", slo={"ttft_p99": "1h30m"})
        )
    assert refused.status_code == 422, refused.text
    assert accepted.status_code == 201, accepted.text


def test_a_duration_in_seconds_is_valid_by_the_document_exactly_up_to_what_the_server_holds(
    api: ApiServer, tokens: Tokens, document: dict[str, Any]
) -> None:
    slo = document["components"]["schemas"]["SLO"]["properties"]["ttft_p99"]
    (number,) = (branch for branch in slo["anyOf"] if branch["type"] == "number")
    most = number["maximum"]
    with api.client(tokens.operator) as ops:
        at_most = ops.post(
            "/v1/catalog/models", json=definition("slo-longest", slo={"ttft_p99": most})
        )
        beyond = ops.post(
            "/v1/catalog/models", json=definition("slo-beyond", slo={"ttft_p99": most + 1})
        )
    assert at_most.status_code == 201, at_most.text
    assert beyond.status_code == 422, beyond.text
    assert "too large" in beyond.json()["detail"]


def test_a_model_path_outside_the_name_grammar_is_documented_as_invalid(
    document: dict[str, Any],
) -> None:
    schema = _parameter(document, "/v1/catalog/models/{name}", "put", "name")
    assert _documented(schema, "meta-llama/Llama-3.1-70B-Instruct")
    assert not _documented(schema, "0 ")
    assert not _documented(schema, "llаma")  # a Cyrillic а


def test_a_diff_past_the_head_is_a_documented_404_not_an_invalid_request(
    api: ApiServer, tokens: Tokens, document: dict[str, Any]
) -> None:
    # The document cannot know the head: any position up to its maximum is valid, and
    # one the log has not reached is a catalog that does not exist yet.
    operation = document["paths"]["/v1/diff"]["get"]
    assert "404" in operation["responses"]
    position = _parameter(document, "/v1/diff", "get", "b")
    assert position["maximum"] >= 10**9
    with api.client(tokens.reader) as reader:
        head = int(reader.get("/readyz").json()["catalog_position"])
        past = reader.get("/v1/diff", params={"a": 0, "b": head + 1})
        at_head = reader.get("/v1/diff", params={"a": 0, "b": head})
    assert past.status_code == 404, past.text
    assert f"diff positions 0 to {head}" in past.json()["detail"]
    assert at_head.status_code == 200, at_head.text


def test_a_body_naming_another_model_or_node_than_the_path_is_a_stated_422(
    api: ApiServer, tokens: Tokens, document: dict[str, Any]
) -> None:
    # The one rule of these bodies a JSON Schema cannot state (it compares the body
    # with the path): the document says it in words, and the fuzz test keeps its valid
    # cases within it, so positive_data_acceptance holds the server to everything else.
    put_model = document["paths"]["/v1/catalog/models/{name}"]["put"]
    assert "whose name is the path's" in put_model["requestBody"]["description"]
    put_node = document["paths"]["/v1/nodes/{name}"]["put"]
    node_body = put_node["requestBody"]["content"]["application/json"]["schema"]
    assert "must be the path's" in node_body["description"]
    assert "name" not in node_body["required"]
    with api.client(tokens.operator) as ops:
        model = ops.put("/v1/catalog/models/one-name", json=definition("another-name"))
        node = ops.put("/v1/nodes/gpu-1", json={"name": "gpu-2", "gpus": 0})
        implied = ops.put("/v1/nodes/gpu-3", json={"gpus": 0})
    assert model.status_code == 422, model.text
    assert model.json()["field"] == "name" and model.json()["model"] == "another-name"
    assert "/v1/catalog/models/another-name" in model.json()["detail"]
    assert node.status_code == 422, node.text
    assert "'gpu-2' but the path names 'gpu-1'" in node.json()["detail"]
    assert implied.status_code == 200, implied.text
    assert implied.json()["name"] == "gpu-3"
