"""One gateway token posing as many gateways cannot scale a model (issue 36): a real
`llmgw serve --with-scheduler` (placement and the autoscaler), a real agent running a sim
engine, a real `llmgw gateway`, and a second gateway token posting the same load under
six invented gateway ids, as the attack did.

Before, the six ids were summed as six gateways (a load of 6 where there is 1) and the
model went from 1 replica to its ``scaling.max`` of 4 in one decision. Now who posted is
the token's name and the worker (``gw-2-w0``): the autoscaler sees one gateway and a load
of 1, and holds the model at 1 decision after decision.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from autoscale.store import rounds_t
from events.database.connection import make_engine
from tests.e2e.agents import Cluster, eventually
from tests.e2e.gateways import GatewayProc, GatewayTokens, gateway_cluster

pytestmark = pytest.mark.slow

# One replica carries 2 (default_capacity) at 0.75 of it: a load of 1 needs 1 replica, a
# load of 6 needs 4; up_step 4 lets one decision go from 1 to 4.
SETTINGS = """
[autoscale]
interval = "1s"
window = "3s"
target = 0.75
up_step = 4
down_step = 1
up_cooldown = "1s"
down_cooldown = "30s"
default_capacity = 2
"""
POSED = {
    "name": "posed",
    "source": "sim/posed",
    "scaling": {"min": 1, "max": 4},
    "slo": {"ttft_p99": "3s", "tpot_p99": "1s"},
    "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
}
ROUNDS = ["--with-scheduler", "--interval", "0.3", "--stream-poll", "0.1"]
FAKES = [f"gw-fake{i}" for i in range(1, 7)]


@pytest.fixture
def running(
    tmp_path: Path, sqlite_url: str
) -> Iterator[tuple[Cluster, GatewayProc, GatewayTokens]]:
    (tmp_path / "llmgw.toml").write_text(SETTINGS)
    with gateway_cluster(tmp_path, sqlite_url, ["n1"], [POSED], ROUNDS) as (c, gw, tokens):
        c.agent("n1", gpus="SIM:4")
        yield c, gw, tokens


def _rounds_after(db_url: str, after: datetime) -> int:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            count = conn.execute(
                select(func.count()).select_from(rounds_t).where(rounds_t.c.at > after)
            ).scalar_one()
            return int(count)
    finally:
        engine.dispose()


def _post_as_many(url: str, token: str, stop: threading.Event) -> None:
    """Every 0.3 s, one window of load 1 under each invented id (the attack)."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
        while not stop.is_set():
            end = datetime.now(UTC)
            window = {
                "model": "posed",
                "start": (end - timedelta(seconds=0.3)).isoformat(),
                "end": end.isoformat(),
                "requests": 5,
                "inflight_mean": 1.0,
                "inflight_max": 1,
                "ttft_p99_s": 0.1,
                "tpot_p99_s": 0.01,
                "replicas": {"posed/0": {"requests": 5, "inflight_mean": 1.0, "inflight_max": 1}},
            }
            for fake in FAKES:
                answer = c.post("/v1/signals", json={"gateway": fake, "windows": [window]})
                assert answer.status_code == 202, answer.text
            stop.wait(0.3)


def test_a_gateway_token_posting_under_invented_ids_does_not_scale_the_model(
    running: tuple[Cluster, GatewayProc, GatewayTokens],
) -> None:
    c, gw, tokens = running
    eventually(lambda: gw.ready("posed", 1), "posed has its one replica (scaling.min)")
    stop = threading.Event()
    poster = threading.Thread(
        target=_post_as_many, args=(c.server.url, tokens.gateway_b, stop), daemon=True
    )
    started = datetime.now(UTC)
    poster.start()
    # Rounds whose whole window (3 s) holds the posted load: each decided on it.
    loaded_from = started + timedelta(seconds=4)
    seen: list[dict[str, Any]] = []

    def rounds_on_the_load() -> bool:
        with c.server.client(c.tokens.reader) as r:
            (found,) = [m for m in r.get("/v1/autoscale").json()["models"] if m["model"] == "posed"]
        seen[:] = [found]
        return _rounds_after(c.server.db_url, loaded_from) >= 3

    try:
        eventually(rounds_on_the_load, "three autoscaler rounds on the posted load", timeout=120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last row: {seen}") from None
    finally:
        stop.set()
        poster.join(30)
    (row,) = seen
    # One gateway (the token gw-2, worker 0; the real gateway's empty windows are gw-1's),
    # a load of 1: no decision changed the count, and one replica is wanted and placed.
    assert row["signals"]["load"] == pytest.approx(1.0, abs=0.35), row
    assert row["wanted"] == 1 and row["last_decision"] is None, row
    placed = [p for p in c.placements() if p["model"] == "posed"]
    assert len(placed) == 1, placed
