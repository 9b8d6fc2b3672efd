"""Fixtures for the API tests: databases that live as long as a module's server, and tokens."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.api.server import Tokens
from tests.conftest import PG_ADMIN


@pytest.fixture(scope="session")
def tokens() -> Tokens:
    return Tokens.issue()


@pytest.fixture(scope="module")
def module_sqlite_url(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("api-db") / "llmgw.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def module_pg_url(pg_template: str) -> Iterator[str]:
    name = f"llmgw_api_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def module_db_url(request: pytest.FixtureRequest) -> str:
    """A migrated database for a module's server, on each back end in turn."""
    name = "module_sqlite_url" if request.param == "sqlite" else "module_pg_url"
    return str(request.getfixturevalue(name))


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api")
