"""Names over HTTP on both stores: every path refuses what the grammar refuses, with a 422
naming the field (not a 500, not a row stored whole), and a case twin is a 409."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.server import ApiServer, Tokens, definition, running

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ops(module_db_url: str, module_dir: Path, tokens: Tokens) -> Iterator[httpx.Client]:
    with (
        running(ApiServer(module_dir, module_db_url, tokens=tokens)) as server,
        server.client(tokens.operator) as client,
    ):
        yield client


def _problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, response.text
    body: dict[str, object] = response.json()
    return body


def test_a_300_character_model_name_is_a_422_naming_the_field(ops: httpx.Client) -> None:
    body = _problem(ops.post("/v1/catalog/models", json=definition("m" * 300)), 422)
    assert body["field"] == "name" and "at most 200" in str(body["detail"])
    body = _problem(ops.post("/v1/catalog/models", json=definition("ll\u0430ma")), 422)
    assert "CYRILLIC SMALL LETTER A" in str(body["detail"])


def test_a_case_twin_of_a_declared_alias_is_a_409(ops: httpx.Client) -> None:
    body = _problem(ops.post("/v1/catalog/models", json=definition("BASE")), 409)
    assert "differing only in case" in str(body["detail"])


def test_a_key_with_a_hash_is_a_422(ops: httpx.Client) -> None:
    response = ops.post(
        "/v1/catalog/models", json=definition("keyed"), headers={"Idempotency-Key": "k#2"}
    )
    _problem(response, 422)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("n" * 300, {}),
        ("gpu-7", {"labels": {"zone": "eu\nwest"}}),
        ("gpu-7", {"gpu_class": "A" * 65, "gpus": 1}),
    ],
)
def test_a_node_report_outside_the_grammar_is_a_422_and_nothing_is_stored(
    ops: httpx.Client, name: str, body: dict[str, object]
) -> None:
    detail = _problem(ops.put(f"/v1/nodes/{name}", json=body), 422)["detail"]
    assert "cannot store" not in str(detail)  # refused by the grammar, not by the column
    assert all(n["name"] != name for n in ops.get("/v1/nodes").json())
