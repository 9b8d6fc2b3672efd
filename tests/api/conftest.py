"""Fixtures for the API tests: databases that live as long as a module's server, and tokens."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.server import Tokens
from tests.pg_pool import Pool


@pytest.fixture(scope="session")
def tokens() -> Tokens:
    return Tokens.issue()


@pytest.fixture(scope="module")
def module_sqlite_url(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("api-db") / "llmgw.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def module_pg_url(pg_pool: Pool) -> Iterator[str]:
    with pg_pool.database("llmgw_api") as url:
        yield url


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
