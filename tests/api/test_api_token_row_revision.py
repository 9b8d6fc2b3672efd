"""A tokens row whose ``revision`` is not a number (SQLite keeps any value in any column:
written with sqlite3 by hand, or a bad restore) is skipped and named as other bad rows
are, and takes nothing else down: ``max(revision)`` is answered with the text (text sorts
above numbers), and before, ``int('x')`` raised: ``llmgw serve`` did not start, and a
running one stopped taking the table's changes, so a token revoked after the row was
written stayed valid (found by a hostile review).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests import forkserver
from tests.api.server import ApiServer


def _cli(env: dict[str, str], *args: str) -> str:
    # Forked, as the suite's commands are (tests/forkserver.py): the same command and output.
    done = forkserver.run(args, cwd=os.getcwd(), env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _bad_row(db: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(
            "insert into tokens(name, role, sha256, nodes, models, issued_at, issued_by, revision)"
            " values ('odd', 'reader', ?, '[]', '[]', '2026-12-07 02:00:00', 'root', 'x')",
            ("e" * 64,),
        )


def test_a_revoked_token_stays_valid_after_a_bad_revision_row(
    tmp_path: Path, sqlite_url: str
) -> None:
    env = {**os.environ, "LLMGW_DATABASE_URL": sqlite_url}
    for name in ("LLMGW_TOKENS", "LLMGW_AUTH_FILE", "LLMGW_CONFIG"):
        env.pop(name, None)
    victim = _cli(env, "token", "new", "--role", "reader", "victim").splitlines()[0]
    _cli(env, "token", "new", "--role", "operator", "ops")
    server = ApiServer(tmp_path, sqlite_url, declared=None)
    server.start()
    try:
        auth = {"Authorization": f"Bearer {victim}"}
        assert httpx.get(f"{server.url}/v1/models", headers=auth).status_code == 200
        _bad_row(sqlite_url.removeprefix("sqlite:///"))
        _cli(env, "token", "revoke", "victim")
        # Within a second on a quiet machine; the bound here is CI's, not the promise.
        deadline = time.monotonic() + 30
        while httpx.get(f"{server.url}/v1/models", headers=auth).status_code != 401:
            assert time.monotonic() < deadline, "a revoked token still works after 30 s"
            time.sleep(0.1)
    finally:
        server.stop()


def test_serve_starts_over_a_bad_revision_row(tmp_path: Path, sqlite_url: str) -> None:
    env = {**os.environ, "LLMGW_DATABASE_URL": sqlite_url}
    for name in ("LLMGW_TOKENS", "LLMGW_AUTH_FILE", "LLMGW_CONFIG"):
        env.pop(name, None)
    _cli(env, "token", "new", "--role", "operator", "ops")
    _bad_row(sqlite_url.removeprefix("sqlite:///"))
    server = ApiServer(tmp_path, sqlite_url, declared=None)
    try:
        server.start()
    except AssertionError as exc:
        pytest.fail(f"serve did not start over one bad tokens row: {str(exc)[-300:]}")
    finally:
        server.stop()
