"""A method a path does not serve is a 405 naming the method it does (Allow), also where
the path of a write route is one the model lookup could take for a name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.server import ApiServer, Tokens, running


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as server:
        yield server


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/v1/catalog/models", "POST"),
        ("GET", "/v1/catalog/models", "POST"),
        ("OPTIONS", "/v1/catalog/models/base-7b", "DELETE, PUT"),
        ("GET", "/v1/catalog/models/base-7b", "DELETE, PUT"),
        ("POST", "/v1/catalog/models/base-7b", "DELETE, PUT"),
        ("OPTIONS", "/v1/nodes/node-0", "PUT"),
        ("GET", "/v1/nodes/node-0", "PUT"),
    ],
)
def test_a_method_the_route_does_not_serve_is_a_405_naming_the_one_it_does(
    api: ApiServer, tokens: Tokens, method: str, path: str, allow: str
) -> None:
    with api.client(tokens.operator) as ops:
        response = ops.request(method, path)

    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allow
    assert response.json()["type"] == "urn:llmgw:problem:method-not-allowed"


def test_the_model_lookup_still_serves_every_other_name(api: ApiServer, tokens: Tokens) -> None:
    with api.client(tokens.reader) as reader:
        assert reader.get("/v1/catalog/base-7b").json()["name"] == "base-7b"
        assert reader.get("/v1/catalog/base").json()["name"] == "base-7b"
