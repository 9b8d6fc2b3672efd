"""The token table and its events, on real SQLite and PostgreSQL databases migrated by
Alembic: issue, revoke and import with their events in one transaction; replay reads the
events as no change to the catalog and skips a malformed one by name; the server's book
skips a malformed row by name and keeps the rest; a hash revoked in the database beats an
auth file that still lists it; `verify` covers the token events like any other."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine, text
from structlog.testing import capture_logs

from catalog import Catalog
from events.core.chain import verify_chain
from events.core.types import TOKEN_ISSUED, TOKEN_REVOKED, NewEvent
from events.read.replay import replay
from events.storage.backends import open_log
from events.storage.chain_rows import read_chain, read_seal
from events.write.tokens import (
    TokenClash,
    TokenRecord,
    import_tokens,
    issue,
    read_tokens,
    revision,
    revoke,
)
from gateway.follower import _is_token_event
from llmgw.api.guards.tokens import Role, TokenConfigError, issue_token
from llmgw.api.runtime.live_tokens import LiveTokens
from llmgw.views import event_json


def record(name: str, role: str = "reader", **scope: Any) -> tuple[str, TokenRecord]:
    issued = issue_token(name, role, scope.get("nodes", ()), scope.get("models", ()))
    e = issued.entry
    return issued.token, TokenRecord(e.name, e.role.value, e.sha256, e.nodes, e.models)


def test_issue_and_revoke_write_the_row_and_its_event_together(engine: Engine) -> None:
    log = open_log(engine)
    _, app = record("app-1", "client", models=["chat"])
    position = issue(log, app, actor="alice", reason="new app")
    (row,) = read_tokens(engine)
    assert (row.record, row.issued_by, row.revision, row.revoked_at) == (
        app,
        "alice",
        position,
        None,
    )
    assert revision(engine) == position
    (event,) = log.read()
    assert (event.type, event.actor, event.reason, event.model) == (
        TOKEN_ISSUED,
        "alice",
        "new app",
        "",
    )
    assert json.loads(event.payload) == {
        "name": "app-1", "role": "client", "nodes": [], "models": ["chat"], "via": "new"
    }  # fmt: skip
    assert app.sha256 not in event.payload

    with pytest.raises(TokenClash, match="a token named 'app-1' \\(client\\) is already in force"):
        issue(log, record("app-1")[1], actor="alice")
    with pytest.raises(TokenClash, match="its hash is already in the database"):
        issue(log, TokenRecord("other", "reader", app.sha256), actor="alice")
    assert log.head() == 1  # a refused issue writes nothing

    done = revoke(log, "app-1", actor="bob", reason="leaked")
    assert done is not None and (done.change.role, done.sha256) == ("client", app.sha256)
    assert revoke(log, "app-1", actor="bob") is None  # nothing in force by that name
    assert read_tokens(engine) == []
    (gone,) = read_tokens(engine, revoked=True)
    assert gone.revoked_by == "bob" and gone.revision == 2 == revision(engine)
    last = list(log.read())[-1]
    assert (last.type, last.actor, json.loads(last.payload)) == (
        TOKEN_REVOKED, "bob", {"name": "app-1", "role": "client"}
    )  # fmt: skip
    # The name may be issued again; the revoked hash never.
    issue(log, record("app-1", "client")[1], actor="alice")
    with pytest.raises(TokenClash, match="revoked"):
        import_tokens(log, [app], actor="alice")


def test_an_import_is_idempotent_and_all_or_nothing(engine: Engine) -> None:
    log = open_log(engine)
    records = [record(n)[1] for n in ("a", "b")]
    first = import_tokens(log, records, actor="alice")
    assert (first.imported, first.already) == (("a", "b"), ())
    again = import_tokens(log, records, actor="alice")
    assert (again.imported, again.already) == ((), ("a", "b"))
    assert log.head() == 2
    clash = [record("c")[1], record("a")[1], record("d")[1], record("d")[1]]
    with pytest.raises(TokenClash) as refused:
        import_tokens(log, clash, actor="alice")
    assert "a token named 'a' (reader) is already in force" in str(refused.value)
    assert "the name 'd' is given twice" in str(refused.value)
    assert {r.record.name for r in read_tokens(engine)} == {"a", "b"} and log.head() == 2
    events = list(log.read())
    assert [json.loads(e.payload)["via"] for e in events] == ["import", "import"]


def test_replay_changes_nothing_for_token_events_and_skips_a_malformed_one_by_name(
    engine: Engine,
) -> None:
    log = open_log(engine)
    issue(log, record("app-1", "client")[1], actor="alice")
    revoke(log, "app-1", actor="bob")
    bad = [
        NewEvent(TOKEN_ISSUED, "", json.dumps({"name": "no such name!", "role": "reader"})),
        NewEvent(TOKEN_REVOKED, "", json.dumps({"name": "x", "role": 7})),
        NewEvent(TOKEN_ISSUED, "", json.dumps({"name": "x", "role": "reader", "models": "a"})),
        NewEvent(TOKEN_ISSUED, "", "[1, 2]"),
        NewEvent(TOKEN_ISSUED, "", json.dumps({"name": "x", "role": "reader"}), schema_version=9),
    ]
    log.append(bad, expected_head=None, actor="mallory")
    result = replay(Catalog.build([]), log.read())
    assert len(result.catalog) == 0 and result.applied == (1, 2)
    reasons = {s.position: s.reason for s in result.skipped}
    assert reasons == {
        3: "payload name is not a token name",
        4: "payload role of token 'x' is not a role",
        5: "payload models of token 'x' is not a list of names",
        6: "payload is not a JSON object",
        7: "schema_version 9 of 'token.issued' is newer than this code reads (1); upgrade "
        "llmgw to read it",
    }
    # The chain covers them: an edited token event is caught by `verify`.
    assert verify_chain(read_chain(engine), read_seal(engine)).ok
    with engine.begin() as conn:
        conn.execute(text("UPDATE events SET actor = 'someone' WHERE position = 2"))
    report = verify_chain(read_chain(engine), read_seal(engine))
    assert not report.ok and report.failed_at == 2


def test_the_book_skips_a_malformed_row_by_name_and_a_revoked_hash_beats_the_file(
    engine: Engine,
) -> None:
    log = open_log(engine)
    good, good_record = record("good")
    in_file = issue_token("filed", "operator")
    issue(log, good_record, actor="alice")
    # The file's token imported, then revoked in the database: the file still lists it.
    import_tokens(log, [TokenRecord("filed", "operator", in_file.entry.sha256)], actor="alice")
    kept = issue_token("kept", "reader")
    tokens = LiveTokens([in_file.entry, kept.entry], engine)
    assert tokens.refresh() is True and tokens.refresh() is False
    assert tokens.book.verify(in_file.token) is not None
    revoke(log, "filed", actor="bob")
    bad, bad_record = record("bad")
    ugly, ugly_record = record("ugly")
    issue(log, bad_record, actor="alice")
    issue(log, ugly_record, actor="alice")
    with engine.begin() as conn:
        conn.execute(text("UPDATE tokens SET role = 'admin' WHERE name = 'bad'"))
        conn.execute(text("UPDATE tokens SET models = '{' WHERE name = 'ugly'"))
    with capture_logs() as logs:
        assert tokens.refresh() is True
        tokens._revision = -1  # made again: a skipped row is named once, not every time
        tokens.refresh()
    skipped = [e for e in logs if e["event"] == "api.token_row_skipped"]
    assert sorted(e["reason"] for e in skipped) == [
        f"tokens row 3: token 'bad' has role 'admin'; use one of "
        f"{', '.join(r.value for r in Role)}",
        "tokens row 4: models is not a JSON list of names",
    ]
    book = tokens.book
    assert book.verify(in_file.token) is None  # revoked in the database, listed in the file
    assert book.verify(bad) is None and book.verify(ugly) is None
    assert book.verify(good) is not None and book.verify(kept.token) is not None


def test_a_gateway_tells_a_token_event_from_a_catalog_event(engine: Engine) -> None:
    log = open_log(engine)
    issue(log, record("app-1", "client")[1], actor="alice")
    (event,) = log.read()
    data = json.dumps(event_json(event)).encode()
    assert _is_token_event(data)
    # A model whose text mentions a token event is still a catalog change.
    sneaky = {"type": "model.added", "payload": {"model": {"name": '"type":"token.issued"'}}}
    assert not _is_token_event(json.dumps(sneaky).encode())
    assert not _is_token_event(b'{"type": "token.revoked"')  # cut short: not read as one


def test_a_row_sqlite_stores_garbage_in_is_skipped_and_named_and_the_rest_read(
    sqlite_url: str,
) -> None:
    # SQLite keeps whatever it is given: a time that is not one, bytes for text, a list
    # nested past any parser's depth. Each such row is named; the others still work.
    from events.database.connection import make_engine

    engine = make_engine(sqlite_url)
    log = open_log(engine)
    tokens = {n: record(n) for n in ("good", "timeless", "bytes", "deep", "big", "gone")}
    for _, rec in tokens.values():
        issue(log, rec, actor="alice")
    revoke(log, "gone", actor="bob")
    with engine.begin() as conn:
        conn.execute(text("UPDATE tokens SET issued_at = 'last tuesday' WHERE name = 'timeless'"))
        conn.execute(text("UPDATE tokens SET role = CAST(x'ff' AS TEXT) WHERE name = 'bytes'"))
        conn.execute(
            text("UPDATE tokens SET nodes = :deep WHERE name = 'deep'"), {"deep": "[" * 100_000}
        )
        conn.execute(
            text("UPDATE tokens SET models = :big WHERE name = 'big'"),
            {"big": json.dumps(["m"] * 300_000)},  # 1.5 MB, past the 1 MiB a list may be
        )
        conn.execute(text("UPDATE tokens SET revoked_at = 'soon' WHERE name = 'gone'"))
    rows = {r.record.name: r for r in read_tokens(engine, revoked=True)}
    assert rows["timeless"].unreadable == "issued_at is not a time"
    assert rows["deep"].unreadable == "nodes is not a JSON list of names"
    assert rows["big"].unreadable == "models is not a JSON list of names"
    assert rows["bytes"].unreadable == "role is not text"
    # A revocation whose time cannot be read still revokes.
    assert rows["gone"].revoked and rows["gone"].unreadable == "revoked_at is not a time"
    live = LiveTokens([], engine)
    with capture_logs() as logs:
        live.refresh()
    named = sorted(e["row"] for e in logs if e["event"] == "api.token_row_skipped")
    assert named == sorted(rows[n].id for n in ("timeless", "bytes", "deep", "big"))
    assert live.book.verify(tokens["good"][0]) is not None
    for name in ("timeless", "bytes", "deep", "big", "gone"):
        assert live.book.verify(tokens[name][0]) is None


def test_a_client_tokens_priority_class_and_share_are_stored_evented_and_served(
    engine: Engine,
) -> None:
    log = open_log(engine)
    issued = issue_token("batchy", "client", priority_class="batch", share=3)
    e = issued.entry
    rec = TokenRecord(
        e.name, e.role.value, e.sha256, e.nodes, e.models, priority_class="batch", share=3
    )
    issue(log, rec, actor="alice")
    (row,) = read_tokens(engine)
    assert (row.record.priority_class, row.record.share) == ("batch", 3)
    (event,) = log.read()
    payload = json.loads(event.payload)
    assert (payload["priority_class"], payload["share"]) == ("batch", 3)
    live = LiveTokens([], engine)
    live.refresh()
    (client,) = live.book.clients()
    assert (client.priority_class, client.share) == ("batch", 3)
    # A token issued before (the defaults) keeps the event it always had.
    issue(log, record("plain", "client")[1], actor="alice")
    assert "priority_class" not in list(log.read())[-1].payload


@pytest.mark.parametrize(
    ("role", "klass", "share", "words"),
    [
        ("client", "urgent", 1, "is not one of critical, standard, batch"),
        ("client", "batch", 0, "share 0 must be a whole number from 1 to 1000"),
        ("client", "batch", 1001, "from 1 to 1000"),
        ("reader", "critical", 1, "cannot have a priority class or share"),
    ],
)
def test_a_priority_class_or_share_that_is_not_one_is_refused_naming_it(
    role: str, klass: str, share: int, words: str
) -> None:
    with pytest.raises(TokenConfigError, match=words):
        issue_token("x", role, priority_class=klass, share=share)
