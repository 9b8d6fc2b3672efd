"""Liveness, readiness (database reachable, schema at head) and the Prometheus metrics."""

from __future__ import annotations

import re
import time
from pathlib import Path

import psycopg
import pytest

from events.database.connection import make_engine
from events.database.migrate import downgrade
from tests.api.server import ApiServer, Tokens, definition, running
from tests.conftest import PG_ADMIN
from tests.support import insert_raw_event

pytestmark = pytest.mark.slow


def test_metrics_are_prometheus_text_with_the_catalog_and_scheduler_series(
    tmp_path: Path, sqlite_url: str, tokens: Tokens
) -> None:
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens, args=["--catalog-max-age", "0"])
    with running(server), server.client(tokens.operator) as ops:
        assert ops.get("/healthz").json() == {"status": "ok"}
        ready = ops.get("/readyz").json()
        assert ready["status"] == "ready" and ready["schema_revision"]
        assert ops.post("/v1/catalog/models", json=definition("m-1")).status_code == 201
        # A bad row written behind the API's back: replay skips it, and says so.
        engine = make_engine(sqlite_url)
        insert_raw_event(engine, 2, payload="{not json", model="broken")
        engine.dispose()
        assert ops.get("/v1/models").status_code == 200

        response = ops.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = response.text
        for series in [
            'llmgw_catalog_events_appended_total{type="model.added"} 1.0',
            "llmgw_catalog_events_skipped 1.0",
            "llmgw_catalog_position 2.0",
            "llmgw_scheduler_leader 0.0",
            "llmgw_placement_round_duration_seconds_count 0.0",
            "llmgw_placement_replicas_placed_total 0.0",
            "llmgw_placement_replicas_unplaced 0.0",
            'llmgw_http_requests_total{method="POST",route="/v1/catalog/models",status="201"} 1.0',
        ]:
            assert series in text, series
        assert re.search(
            r'^llmgw_http_request_duration_seconds_bucket\{.*route="/v1/models"', text, re.M
        )


def test_readiness_fails_while_the_schema_is_behind_this_release(
    tmp_path: Path, sqlite_url: str, tokens: Tokens
) -> None:
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens)
    with running(server), server.client() as anonymous:
        assert anonymous.get("/readyz").status_code == 200
        engine = make_engine(sqlite_url)
        # To a revision before the last merge: "-1" from a merge point is ambiguous to Alembic.
        downgrade(engine, "0004_scheduler")
        engine.dispose()
        response = anonymous.get("/readyz")
        assert response.status_code == 503
        assert response.headers["content-type"] == "application/problem+json"
        assert "run `llmgw db upgrade`" in response.json()["detail"]
        assert anonymous.get("/healthz").status_code == 200, "alive, only not ready"


@pytest.mark.postgres
def test_an_unreachable_database_is_503_and_the_server_recovers(
    tmp_path: Path, pg_url: str, tokens: Tokens
) -> None:
    database = pg_url.rsplit("/", 1)[1]
    server = ApiServer(tmp_path, pg_url, tokens=tokens)
    with running(server), server.client(tokens.agent) as agent:
        assert agent.put("/v1/nodes/node-0", json={"gpus": 0}).status_code == 200
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )
            for path in ("/readyz", "/v1/nodes"):
                response = agent.get(path)
                assert response.status_code == 503, (path, response.text)
                assert response.json()["type"] == "urn:llmgw:problem:unavailable"
            down = agent.put("/v1/nodes/node-0", json={"gpus": 0})
            assert down.status_code == 503 and down.headers["retry-after"] == "5"
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        # Waiting for the pool to reconnect, however long a busy machine takes.
        deadline = time.monotonic() + 60
        while agent.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert agent.put("/v1/nodes/node-0", json={"gpus": 0}).status_code == 200
