"""A method a path does not serve is a 405 naming the method it does (Allow), also where
the path of a write route is one the model lookup could take for a name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.server import ApiServer, Tokens, definition, running


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as server:
        yield server


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/v1/catalog/models", "POST"),
        ("GET", "/v1/catalog/models", "POST"),
        ("OPTIONS", "/v1/catalog/models/base-7b", "DELETE, GET, PUT"),
        ("POST", "/v1/catalog/models/base-7b", "DELETE, GET, PUT"),
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


def test_a_model_whose_name_starts_with_models_is_read_at_the_path_put_and_delete_take(
    api: ApiServer, tokens: Tokens
) -> None:
    """``/v1/catalog/{name}`` cannot take ``models`` or ``models/...`` (those are the write
    routes' paths), so such a model could be written and removed but not read under
    /v1/catalog. Every model is read at ``GET /v1/catalog/models/{name}``, by name or alias."""
    names = ["models", "models/llama-3", "models-x"]
    with api.client(tokens.operator) as ops:
        for name in names:
            body = definition(name, aliases=[f"alias-{len(name)}"])
            assert ops.put(f"/v1/catalog/models/{name}", json=body).status_code == 201
        for name in names:
            entry = ops.get(f"/v1/catalog/models/{name}")
            assert entry.status_code == 200, entry.text
            assert entry.json()["name"] == name
            assert entry.json()["name"] in {m["name"] for m in ops.get("/v1/catalog").json()}
            by_alias = ops.get(f"/v1/catalog/models/alias-{len(name)}").json()
            assert by_alias["name"] == name
        # The same entry as the lookup gives, where the lookup can take the name.
        assert (
            ops.get("/v1/catalog/models/models-x").json() == ops.get("/v1/catalog/models-x").json()
        )
        assert ops.get("/v1/catalog/models/base-7b").json()["name"] == "base-7b"
        missing = ops.get("/v1/catalog/models/models/nope")
        assert missing.status_code == 404
        assert "'models/nope' is not in the catalog" in missing.json()["detail"]
        for name in names:
            assert ops.delete(f"/v1/catalog/models/{name}").status_code == 200
