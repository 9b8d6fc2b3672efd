"""Property-based fuzzing of the API from its own OpenAPI document (schemathesis).

Every operation but the event stream (which never ends; test_api_stream covers
it) gets a bounded number of generated requests, valid and invalid, with an
operator's token. No input may cause a server error or an answer the document
does not describe, and nothing invalid may reach the log: after each write,
replaying the whole log from scratch skips nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import BaseSchema, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from catalog import load_declared
from events.backends import open_log
from events.db import make_engine
from events.replay import replay
from tests.api.server import ApiServer, Tokens, running

pytestmark = pytest.mark.slow

EXAMPLES = 12  # per operation and generation mode: the whole module stays well under a minute
# The writes get more: the more that is accepted, the more the replay check below proves.
MORE = {("POST", "/v1/catalog/models"): 60, ("PUT", "/v1/nodes/{name}"): 30}

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def fuzzed(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as server:
        yield server


@pytest.fixture(scope="module")
def api_schema(fuzzed: ApiServer, tokens: Tokens) -> BaseSchema:
    # The operator's token through the document's own security scheme: generated
    # requests carry it, and invalid ones are invalid for some other reason.
    config = schemathesis.Config.from_dict(
        {"auth": {"openapi": {"bearer": {"bearer": tokens.operator}}}}
    )
    return schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json", config=config)


# Each operation is its own test (and xdist spreads them); the guard below keeps the
# list equal to what the document describes, so a new route cannot go unfuzzed.
OPERATIONS = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("GET", "/v1/fleet"),
    ("GET", "/v1/diff"),
    ("GET", "/v1/catalog"),
    ("GET", "/v1/catalog/{name}"),
    ("POST", "/v1/catalog/models"),
    ("PUT", "/v1/catalog/models/{name}"),
    ("DELETE", "/v1/catalog/models/{name}"),
    ("GET", "/v1/events"),
    ("PUT", "/v1/nodes/{name}"),
    ("GET", "/v1/nodes"),
    ("GET", "/v1/placements"),
    ("POST", "/v1/nodes/{name}/cordon"),
    ("POST", "/v1/nodes/{name}/drain"),
    ("POST", "/v1/nodes/{name}/uncordon"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
]
NOT_FUZZED = {("GET", "/v1/events/stream")}  # never ends; see test_api_stream
# Invalid input is generated only where there is input: a path, query or body.
TAKE_INPUT = {op for op in OPERATIONS if "{" in op[1] or op[0] != "GET"} | {
    ("GET", "/v1/events"),
    ("GET", "/v1/placements"),
    ("GET", "/v1/diff"),
}
CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or (method, path) in TAKE_INPUT
]


def test_every_operation_of_the_document_is_fuzzed(api_schema: BaseSchema) -> None:
    described = {
        (op.method.upper(), op.path)
        for op in (result.ok() for result in api_schema.get_all_operations())  # type: ignore[union-attr]
    }
    assert described == set(OPERATIONS) | NOT_FUZZED


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_no_input_makes_the_api_fail_or_write_an_invalid_model(
    method: str,
    path: str,
    mode: GenerationMode,
    api_schema: BaseSchema,
    fuzzed: ApiServer,
) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MORE.get((method, path), EXAMPLES),
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case) -> None:  # type: ignore[type-arg]
        response = case.call()
        case.validate_response(response, checks=CHECKS)
        if method in ("POST", "DELETE", "PUT") and response.status_code < 300:
            assert_log_replays_cleanly(fuzzed)

    fuzz()


def assert_log_replays_cleanly(server: ApiServer) -> None:
    engine = make_engine(server.db_url)
    try:
        declared = load_declared(Path(server.env["LLMGW_CONFIG"]))
        result = replay(declared, open_log(engine).read())
    finally:
        engine.dispose()
    assert result.skipped == (), [s.to_json() for s in result.skipped]
