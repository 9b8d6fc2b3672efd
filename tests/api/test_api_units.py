"""The API's pure parts (tokens, settings, body checks) and the error mappings that a real
server cannot easily be driven into (a command that lost every race, a crash)."""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from catalog import Catalog
from events.database.connection import make_engine
from events.write.commands import CommandConflict
from llmgw.api.app import create_app
from llmgw.api.guards.bodies import storable
from llmgw.api.guards.tokens import Role, TokenBook, TokenConfigError, issue_token, parse_env_tokens
from llmgw.api.runtime.services import Services
from llmgw.api.runtime.settings import ApiSettings, SettingsError


def request(app: FastAPI, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to the app in this process (no lifespan: these routes need none)."""

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(send())


def test_an_issued_token_is_configured_by_its_hash_only_and_verifies() -> None:
    issued = issue_token("gpu-7-agent", "agent", ["gpu-7"])
    assert issued.token.startswith("llmgw_") and len(issued.token) > 40
    assert issued.token not in issued.entry.to_toml() + issued.entry.to_env()
    book = TokenBook([issued.entry, issue_token("ops", "operator").entry])
    who = book.verify(issued.token)
    assert who is not None and (who.name, who.role) == ("gpu-7-agent", Role.AGENT)
    assert who.may_report("gpu-7") and not who.may_report("gpu-8")
    assert not who.may_change_catalog()
    assert book.verify(issued.token[:-1]) is None and book.verify("") is None


def test_the_printed_toml_and_env_entries_load_back_as_the_same_entry(tmp_path: Path) -> None:
    entry = issue_token("agent-a", "agent", ["n1", "node01.dc1"]).entry
    (tmp_path / "auth.toml").write_text("reads_open = true\n" + entry.to_toml() + "\n")
    loaded = ApiSettings.load(tmp_path / "auth.toml", env={})
    assert loaded.tokens == (entry,) and loaded.reads_open is True
    simple = issue_token("agent-b", "agent", ["n1", "n2"]).entry
    assert parse_env_tokens(simple.to_env()) == [simple]
    both = ApiSettings.load(
        tmp_path / "auth.toml", env={"LLMGW_TOKENS": simple.to_env(), "LLMGW_OPEN_READS": "0"}
    )
    assert both.tokens == (entry, simple) and both.reads_open is True  # the file says so
    assert tomllib.loads(entry.to_toml())["tokens"][0]["nodes"] == ["n1", "node01.dc1"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('[[tokens]]\nname = "x"\nrole = "admin"\nsha256 = "' + "0" * 64 + '"', "role 'admin'"),
        ('[[tokens]]\nname = "x"\nrole = "agent"\nsha256 = "' + "0" * 64 + '"', "names no node"),
        ('[[tokens]]\nname = "x"\nrole = "reader"\nsha256 = "abc"', "64 lowercase hex"),
        ('[[tokens]]\nname = "a b"\nrole = "reader"\nsha256 = "' + "0" * 64 + '"', "name 'a b'"),
        (  # a node no report can name (catalog.definition.identifiers): the token is unusable
            '[[tokens]]\nname = "x"\nrole = "agent"\nnodes = ["odd \\"name\\""]\nsha256 = "'
            + "0" * 64
            + '"',
            "node 'odd \"name\"' is not ASCII letters",
        ),
        ('[[tokens]]\nname = "x"\nrole = "reader"\ntoken = "t"', "unknown key(s) 'token'"),
        ("reads_open = 1", "reads_open must be true or false"),
        ("colour = 1", "unknown key(s) 'colour'"),
        ("[[tokens]", "not valid TOML"),
        (
            '[[tokens]]\nname = "a"\nrole = "reader"\nsha256 = "' + "0" * 64 + '"\n'
            '[[tokens]]\nname = "b"\nrole = "reader"\nsha256 = "' + "0" * 64 + '"',
            "the same hash",
        ),
    ],
)
def test_an_unusable_auth_file_is_refused_naming_the_entry(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "auth.toml"
    path.write_text(text + "\n")
    with pytest.raises(SettingsError) as refused:
        ApiSettings.load(path, env={})
    assert problem in str(refused.value)


def test_token_names_and_roles_are_checked_when_issued() -> None:
    with pytest.raises(TokenConfigError, match="only agent tokens are"):
        issue_token("ops", "operator", ["n1"])
    with pytest.raises(TokenConfigError, match="role 'root'"):
        issue_token("ops", "root")


def test_what_cannot_be_stored_and_read_back_is_named() -> None:
    assert storable({"a": [1, 2.5, "x", {"b": None}]}) is None
    assert storable({"a": {"b": float("nan")}}) == "a.b is nan; JSON has no such number"
    assert storable({"labels": {"k": "v\x00"}}) == (
        "labels.k contains a NUL character, which cannot be stored"
    )
    assert "unpaired surrogate" in str(storable(["\ud800"]))


@pytest.fixture
def app_services(sqlite_url: str) -> Services:
    return Services.build(make_engine(sqlite_url), Catalog.build([]), "catalog.yaml", ApiSettings())


def test_a_command_that_lost_every_race_is_a_409_conflict(
    app_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = issue_token("ops", "operator")
    svc = Services.build(
        app_services.engine, Catalog.build([]), "c", ApiSettings(tokens=(issued.entry,))
    )

    def lose(*_: Any, **__: Any) -> None:
        raise CommandConflict("model.added of m gave up after 8 attempts: run it again.")

    monkeypatch.setattr(svc.gate, "add", lose)
    response = request(
        create_app(svc),
        "POST",
        "/v1/catalog/models",
        json={"name": "m", "source": "s", "profiles": [{"name": "p", "gpu_class": "T4"}]},
        headers={"Authorization": f"Bearer {issued.token}"},
    )
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == "urn:llmgw:problem:conflict"
    assert "gave up after 8 attempts" in response.json()["detail"]


def test_a_crash_is_a_500_problem_that_says_nothing_of_the_internals(
    app_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash() -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(app_services.gate, "view", crash)
    response = request(create_app(app_services), "GET", "/readyz")
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "urn:llmgw:problem:internal" and "secret" not in response.text


def _report_services(app_services: Services) -> tuple[Services, str]:
    issued = issue_token("agent-a", "agent", ["node-0"])
    svc = Services.build(
        app_services.engine, Catalog.build([]), "c", ApiSettings(tokens=(issued.entry,))
    )
    return svc, issued.token


def test_an_unexpected_failure_on_the_lean_report_path_is_a_500_problem(
    app_services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node report's common case is answered before FastAPI (llmgw.api.routes.report_fast_path),
    outside its error middleware: a failure while it looked at the request reached the
    server as an exception, whose answer is a plain-text 500. It is the app's problem
    document now, as on every other route."""
    svc, token = _report_services(app_services)

    def crash(_: str) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(svc.book, "verify", crash)
    body = b'{"gpu_class": "T4", "gpus": 4}'
    lean = request(
        create_app(svc),
        "PUT",
        "/v1/nodes/node-0",
        content=body,  # with a Content-Length: the lean path's case
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    route = request(
        create_app(svc),
        "PUT",
        "/v1/nodes/node-0",
        content=chunks(),  # chunked: FastAPI's route
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    for response in (lean, route):
        assert response.status_code == 500
        assert response.headers["content-type"] == "application/problem+json", response.text
        assert response.json()["type"] == "urn:llmgw:problem:internal"
        assert "secret" not in response.text
    assert lean.json() == route.json()


def test_a_body_that_fails_to_arrive_on_the_lean_report_path_is_a_500_problem(
    app_services: Services,
) -> None:
    """The server's ``receive`` failing mid-body (a broken transport), seen at the ASGI
    boundary: the lean path reads the body itself, so the failure is its own to answer."""
    svc, token = _report_services(app_services)
    app = create_app(svc)
    sent: list[MutableMapping[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": "/v1/nodes/node-0",
        "raw_path": b"/v1/nodes/node-0",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"api"),
            (b"authorization", f"Bearer {token}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"30"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }

    async def receive() -> dict[str, Any]:
        raise RuntimeError("the transport broke")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 500
    assert (b"content-type", b"application/problem+json") in start["headers"]
    assert b"urn:llmgw:problem:internal" in b"".join(m.get("body", b"") for m in sent[1:])
