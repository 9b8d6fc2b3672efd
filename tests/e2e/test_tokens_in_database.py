"""Tokens in the database, across replicas: two real `llmgw serve` on one PostgreSQL, a
real `llmgw gateway`, tokens issued, revoked and imported with the real `llmgw token`.

A token issued on the command line works on both replicas; revoked, each replica and
the gateway refuse it within a second (measured from the revoking command's exit to the
first refused request's start, so a slow answer under load does not count against it),
and every later request is refused; `llmgw history` shows who did it, never the token
or its hash. A watch (`/v1/events/stream`) on one replica sees a write made through the
other at once: the replica watched polls every 5 s here, so only PostgreSQL's
notification can bring it within the test's bound.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from llmgw.api.guards.tokens import issue_token
from llmgw.api.runtime.changes import CHANNEL
from tests.api.server import ApiServer
from tests.e2e.cli import Cli
from tests.e2e.gateways import GatewayProc
from tests.support import definition

pytestmark = pytest.mark.slow

# What the issue asks: a revoked token is refused everywhere within a second.
WITHIN_S = 1.0
# How long a newly issued token may take to be taken (also a second, plus slack for a
# loaded machine: only revocation's bound is asserted exactly).
DEADLINE_S = 30.0


@pytest.fixture
def replicas(tmp_path: Path, pg_url: str) -> Iterator[tuple[ApiServer, ApiServer, Cli, str]]:
    # A bootstrap operator from the environment, as an install before tokens in the
    # database had it; everything else is issued into the database below.
    boot = issue_token("boot", "operator")
    servers = []
    for name in ("a", "b"):
        workdir = tmp_path / name
        workdir.mkdir()
        args = ["--stream-poll", "5s"] if name == "b" else []
        servers.append(
            ApiServer(
                workdir, pg_url, args=args, declared=None, env={"LLMGW_TOKENS": boot.entry.to_env()}
            )
        )
    cli = Cli(tmp_path, pg_url)
    try:
        for s in servers:
            s.start()
        yield servers[0], servers[1], cli, boot.token
    finally:
        for s in servers:
            s.stop()


def issue(cli: Cli, name: str, role: str, *extra: str) -> str:
    done = cli("token", "new", name, "--role", role, "--actor", "alice", *extra)
    assert done.returncode == 0, done.stderr
    token = done.stdout.splitlines()[0]
    assert token.startswith("llmgw_")
    return token


def status(url: str, token: str, path: str = "/v1/catalog") -> int:
    return httpx.get(
        url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ).status_code


def takes(server: ApiServer, token: str) -> None:
    """Until ``server`` takes ``token`` (a new token: within its refresh, on a busy machine)."""
    wait_until(lambda: status(server.url, token) == 200, f"{server.url} takes the token")


def metrics(server: ApiServer, token: str) -> str:
    answer = httpx.get(
        server.url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return answer.text


def wait_until(check: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def refused_after(since: float, url: str, token: str, path: str) -> float:
    """Seconds from ``since`` to the start of the first request refused (401)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        sent = time.monotonic()
        if status(url, token, path) == 401:
            return sent - since
        assert sent < deadline, f"{url} never refused the revoked token"
        time.sleep(0.01)


def test_a_database_token_works_on_both_replicas_and_is_refused_everywhere_within_a_second(
    replicas: tuple[ApiServer, ApiServer, Cli, str],
) -> None:
    a, b, cli, boot = replicas
    reader = issue(cli, "carol", "reader", "--reason", "dashboards")
    for server in (a, b):
        takes(server, reader)
    gateway_token = issue(cli, "gw-db", "gateway")
    client = issue(cli, "app-db", "client")
    # Only the event stream can bring a revocation within the second: not the resync.
    settings = a.workdir / "gateway.toml"
    settings.write_text('[gateway]\nresync = "60s"\n')
    gw = GatewayProc(a.workdir, a.url, gateway_token, "--settings", str(settings), admin=reader)
    try:
        gw.start()
        wait_until(lambda: status(gw.url, client, "/v1/models") == 200, "the gateway takes app-db")

        revoked = cli("token", "revoke", "carol", "--actor", "bob", "--reason", "left the team")
        done_at = time.monotonic()
        assert revoked.returncode == 0, revoked.stderr
        lags = [refused_after(done_at, s.url, reader, "/v1/catalog") for s in (a, b)]
        gone = cli("token", "revoke", "app-db", "--actor", "bob")
        done_at = time.monotonic()
        assert gone.returncode == 0, gone.stderr
        lags.append(refused_after(done_at, gw.url, client, "/v1/models"))
        assert all(lag < WITHIN_S for lag in lags), lags
        # Refused for good, everywhere; the others' tokens still work.
        for server in (a, b):
            assert status(server.url, reader) == 401
            assert status(server.url, gateway_token, "/v1/gateway/client-tokens") == 200
            page = metrics(server, boot)
            assert 'llmgw_api_tokens{source="database"} 1.0' in page  # gw-db alone
            assert 'llmgw_api_tokens{source="configured"} 1.0' in page  # the bootstrap
        assert status(gw.url, client, "/v1/models") == 401
    finally:
        gw.stop()

    history = cli("history", "--json")
    assert history.returncode == 0, history.stderr
    entries = json.loads(history.stdout)
    shown = [(e["type"], e["actor"], e["reason"]) for e in entries]
    assert ("token.issued", "alice", "token carol (reader) issued: dashboards") in shown
    assert ("token.revoked", "bob", "token carol (reader) revoked: left the team") in shown
    assert ("token.revoked", "bob", "token app-db (client) revoked") in shown
    # No token and no hash in what readers see: history, the API's log and its stream.
    listed = cli("token", "list", "--all", "--json")
    hashes = [row for row in json.loads(listed.stdout) if row["source"] == "database"]
    assert {r["name"] for r in hashes} == {"carol", "gw-db", "app-db"}
    with httpx.Client(headers={"Authorization": f"Bearer {gateway_token}"}) as http:
        full = [e["sha256"] for e in http.get(a.url + "/v1/gateway/client-tokens").json()]
        events = http.get(a.url + "/v1/events").text
    assert full == []  # app-db is revoked; carol and gw-db are no clients
    for text in (history.stdout, events, cli("history").stdout):
        for secret in (reader, client, gateway_token):
            assert secret not in text
            assert secret[:20] not in text
        for row in hashes:
            assert row["sha256"] not in text  # even the listed 12-digit prefix
    assert cli("verify").returncode == 0


def test_an_auth_file_moves_into_the_database_once_and_a_clash_is_named(
    replicas: tuple[ApiServer, ApiServer, Cli, str], tmp_path: Path
) -> None:
    a, b, cli, _ = replicas
    ops = issue_token("ops-file", "operator")
    agent = issue_token("agent-file", "agent", ["gpu-1"])
    auth = tmp_path / "auth.toml"
    auth.write_text(f"{ops.entry.to_toml()}\n\n{agent.entry.to_toml()}\n")
    # Neither replica reads the file: the tokens work once imported.
    assert status(b.url, ops.token) == 401
    done = cli("token", "import", str(auth), "--actor", "alice")
    assert done.returncode == 0, done.stderr
    assert "imported 2 token(s)" in done.stdout
    for server in (a, b):
        takes(server, ops.token)
    again = cli("token", "import", str(auth))
    assert again.returncode == 0, again.stderr
    assert "already in the database: ops-file, agent-file" in again.stdout
    imported = [
        e for e in json.loads(cli("history", "--json").stdout) if e["type"] == "token.issued"
    ]
    assert len(imported) == 2 and all(e["actor"] == "alice" for e in imported)

    # Another token of an imported name: refused whole, the clash named.
    other = issue_token("ops-file", "operator")
    new = issue_token("newcomer", "reader")
    clash = tmp_path / "clash.toml"
    clash.write_text(f"{other.entry.to_toml()}\n\n{new.entry.to_toml()}\n")
    refused = cli("token", "import", str(clash))
    assert refused.returncode == 1
    assert "nothing imported" in refused.stderr
    assert "a token named 'ops-file' (operator) is already in force" in refused.stderr
    assert status(a.url, new.token) == 401
    # Revoked in the database, a token stays refused though a file still lists it.
    assert cli("token", "revoke", "ops-file").returncode == 0
    back = cli("token", "import", str(auth))
    assert back.returncode == 1 and "ops-file" in back.stderr and "revoked" in back.stderr


def test_a_watch_on_one_replica_sees_a_write_through_the_other_at_once(
    replicas: tuple[ApiServer, ApiServer, Cli, str],
) -> None:
    a, b, _, operator = replicas
    headers = {"Authorization": f"Bearer {operator}"}
    with (
        httpx.Client(headers=headers, timeout=30) as http,
        http.stream("GET", b.url + "/v1/events/stream", params={"after": "0"}) as stream,
    ):
        lines = stream.iter_lines()
        assert next(lines).startswith("retry:")  # the stream is open: B follows the log
        lags = []
        for i in range(3):
            written = time.monotonic()
            made = http.post(a.url + "/v1/catalog/models", json=definition(f"watched-{i}"))
            assert made.status_code == 201, made.text
            for line in lines:
                if line.startswith("data:") and f"watched-{i}" in line:
                    lags.append(time.monotonic() - written)
                    break
    # B looks every 5 s by itself: only the notification brings these within a second.
    assert max(lags) < WITHIN_S, lags


def test_on_sqlite_a_revoked_token_is_refused_within_a_second_too(
    tmp_path: Path, sqlite_url: str
) -> None:
    # No notification on SQLite: the server's own look at the table (every 0.5 s) holds it.
    cli = Cli(tmp_path, sqlite_url)
    reader = issue(cli, "carol", "reader")
    server = ApiServer(tmp_path, sqlite_url, declared=None)
    try:
        server.start()
        assert status(server.url, reader) == 200  # issued before the start: taken at once
        revoked = cli("token", "revoke", "carol")
        done_at = time.monotonic()
        assert revoked.returncode == 0, revoked.stderr
        assert refused_after(done_at, server.url, reader, "/v1/catalog") < WITHIN_S
        assert status(server.url, reader) == 401
    finally:
        server.stop()


def test_a_replica_that_loses_its_listening_connection_polls_then_listens_again(
    replicas: tuple[ApiServer, ApiServer, Cli, str], pg_url: str
) -> None:
    a, b, _, operator = replicas
    database = pg_url.rsplit("/", 1)[1]
    admin = "postgresql://postgres@127.0.0.1:5432/postgres"

    def listeners() -> list[int]:
        with psycopg.connect(admin, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query = %s",
                (database, f"LISTEN {CHANNEL}"),
            ).fetchall()
        return [int(r[0]) for r in rows]

    wait_until(lambda: len(listeners()) == 2, "both replicas listen")
    assert "llmgw_api_change_notifications 1.0" in metrics(b, operator)
    with psycopg.connect(admin, autocommit=True) as conn:
        for pid in listeners():
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_until(lambda: bool(b.logs("api.listen_failed")), "b names the lost connection")
    wait_until(lambda: bool(b.logs("api.listen_back")), "b listens again")
    wait_until(lambda: len(listeners()) == 2, "both replicas listen again")
    wait_until(lambda: "llmgw_api_change_notifications 1.0" in metrics(b, operator), "b says so")
    headers = {"Authorization": f"Bearer {operator}"}
    with (
        httpx.Client(headers=headers, timeout=30) as http,
        http.stream("GET", b.url + "/v1/events/stream", params={"after": "0"}) as stream,
    ):
        lines = stream.iter_lines()
        assert next(lines).startswith("retry:")
        written = time.monotonic()
        assert http.post(a.url + "/v1/catalog/models", json=definition("after")).status_code == 201
        for line in lines:
            if line.startswith("data:") and '"after"' in line:
                break
    # Notified again: not B's 5 s poll.
    assert time.monotonic() - written < WITHIN_S
