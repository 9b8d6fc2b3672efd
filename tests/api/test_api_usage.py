"""POST /v1/usage (a gateway's flush into the ledger) and GET /v1/usage on a real server.

A flush is recorded once however often it is sent (its id is the command key), stamped
with who posted (the token's name and worker, never the body's), and summed by the
read side with the CLI's filters. Who may post and read; hostile bodies and queries are
refused naming the field, and nothing of a refused flush is stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.api.server import ApiServer, Tokens, running

ROW = {
    "minute": "2026-12-07T04:05:00Z",
    "client": "app-1",
    "model": "chat",
    "served": "chat",
    "replica": "chat/r1",
    "requests": 2,
    "outcomes": {"ok": 2},
    "prompt_tokens": 40,
    "cached_tokens": 16,
    "completion_tokens": 9,
    "estimated": 0,
}


@pytest.fixture(scope="module")
def tokens() -> Tokens:
    return Tokens.issue(gateways=["gw-a", "gw-b"])


@pytest.fixture(scope="module")
def api(module_db_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_db_url, tokens=tokens)) as s:
        yield s


def _post(api: ApiServer, token: str, body: Any) -> Any:
    with api.client(token) as c:
        return c.post("/v1/usage", json=body)


def _usage(api: ApiServer, token: str, **params: str) -> dict[str, Any]:
    with api.client(token) as c:
        answer = c.get("/v1/usage", params=params)
    assert answer.status_code == 200, answer.text
    data: dict[str, Any] = answer.json()
    return data


def test_a_flush_is_recorded_once_stamped_with_its_poster_and_summed(
    api: ApiServer, tokens: Tokens
) -> None:
    body = {"gateway": "anything", "worker": 1, "flush": "f-1", "rows": [ROW]}
    first = _post(api, tokens.gateways["gw-a"], body)
    assert first.status_code == 202, first.text
    assert first.json()["gateway"] == "gw-a-w1" and not first.json()["already_recorded"]
    again = _post(api, tokens.gateways["gw-a"], body)
    assert again.status_code == 202 and again.json()["already_recorded"]
    # Stored pending (its minute not yet rolled up): no event per flush in the log.
    assert "positions" not in first.json()
    # Another gateway's flush of the same id is its own; another client, another model.
    other = {**ROW, "client": "app-2", "model": "coder", "served": None, "replica": None,
             "outcomes": {"refused": 2}, "prompt_tokens": 0, "cached_tokens": 0,
             "completion_tokens": 0, "minute": "2026-12-08T00:00:00Z"}  # fmt: skip
    assert _post(api, tokens.gateways["gw-b"], {**body, "rows": [ROW, other]}).status_code == 202

    ledger = _usage(api, tokens.reader)
    pairs = {(g["client"], g["model"]): g for g in ledger["groups"]}
    assert pairs["app-1", "chat"]["completion_tokens"] == 18
    assert pairs["app-1", "chat"]["requests"] == 4
    assert pairs["app-2", "coder"]["outcomes"] == {"refused": 2}
    assert ledger["total"]["total_tokens"] == 2 * (40 + 9)
    assert _usage(api, tokens.operator) == ledger
    by_day = _usage(api, tokens.reader, by="day")["groups"]
    assert [(g["day"], g["requests"]) for g in by_day] == [("2026-12-07", 4), ("2026-12-08", 2)]
    only = _usage(api, tokens.reader, client="app-1", model="chat", since="2026-12-07T04:05:59Z")
    assert only["total"]["requests"] == 4
    later = _usage(api, tokens.reader, since="2026-12-07T04:06:00Z")
    assert later["total"]["requests"] == 2 and later["groups"][0]["client"] == "app-2"


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"flush": "f", "rows": [{**ROW, "cached_tokens": 41}]}, "rows[0]: usage cached_tokens"),
        ({"flush": "f", "rows": [{**ROW, "outcomes": {"ok": 1}}]}, "outcomes do not add up"),
        ({"flush": "f", "rows": [{**ROW, "gateway": "gw-b-w0"}]}, "without gateway or flush"),
        ({"flush": "f", "rows": [{**ROW, "prompt": "secret words"}]}, "unknown fields"),
        ({"flush": "f", "rows": [ROW] * 1001}, "rows: a list of at most 1000"),
        ({"flush": "../x", "rows": [ROW]}, "flush: the flush's id (pattern"),
        ({"flush": "f", "gateway": "a b", "rows": []}, "gateway: a name"),
        ({"flush": "f", "worker": 64, "rows": [ROW]}, "worker: a whole number from 0 to 63"),
        ({"flush": "f", "rows": [ROW], "extra": 1}, "unknown fields"),
        ([ROW], "not a JSON object"),
    ],
)
def test_a_hostile_flush_is_refused_naming_the_field_and_nothing_is_stored(
    api: ApiServer, tokens: Tokens, body: Any, named: str
) -> None:
    before = _usage(api, tokens.reader)
    answer = _post(api, tokens.gateways["gw-a"], body)
    assert answer.status_code == 422, answer.text
    assert named in answer.json()["detail"]
    after = _usage(api, tokens.reader)
    assert after["rows"] == before["rows"] and after["position"] == before["position"]


def test_who_may_post_and_read(api: ApiServer, tokens: Tokens) -> None:
    body = {"flush": "who", "rows": [ROW]}
    assert _post(api, tokens.reader, body).status_code == 403
    assert _post(api, tokens.agent, body).status_code == 403
    with api.client(None) as c:
        assert c.post("/v1/usage", json=body).status_code == 401
    for token in (tokens.agent, tokens.gateways["gw-a"]):
        with api.client(token) as c:
            answer = c.get("/v1/usage")
        assert answer.status_code == 403, answer.text
        assert "operator or reader token" in answer.json()["detail"] or "reader" in answer.text


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"by": "week"}, "by"),
        ({"since": "last tuesday"}, "is not a time"),
        ({"clients": "app-1"}, "unknown query parameter 'clients'"),
        ({"client": "x" * 65}, "client"),
    ],
)
def test_a_bad_query_is_refused_naming_it(
    api: ApiServer, tokens: Tokens, params: dict[str, str], named: str
) -> None:
    with api.client(tokens.reader) as c:
        answer = c.get("/v1/usage", params=params)
    assert answer.status_code == 422, answer.text
    assert named in answer.text
