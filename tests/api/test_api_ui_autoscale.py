"""The dashboard's autoscaling page in a real headless chromium, against a real `llmgw serve`:
per model ready vs wanted vs min..max, the load against capacity, the TTFT p99 chart
with the SLO line (drawn red when the last p99 is over it)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.api.browser import chromium
from tests.api.server import ApiServer, Tokens, running
from tests.api.test_api_ui import shoot, signed_in

pytestmark = pytest.mark.slow

DECLARED = {
    "models": [
        {
            "name": "chat",
            "source": "sim/chat",
            "scaling": {"min": 1, "max": 4},
            "slo": {"ttft_p99": "1s"},
            "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
        },
        {
            "name": "calm",
            "source": "sim/calm",
            "scaling": {"min": 0, "max": 2},
            "slo": {"ttft_p99": "2s"},
            "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "SIM"}],
        },
    ]
}


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens, declared=DECLARED)) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def _post(api: ApiServer, tokens: Tokens, ttft: float) -> None:
    now = datetime.now(UTC)
    window = {
        "start": (now - timedelta(seconds=5)).isoformat(),
        "end": now.isoformat(),
        "requests": 40,
        "inflight_mean": 3.5,
    }
    body = {
        "gateway": "gw-1",
        "windows": [
            {**window, "model": "chat", "ttft_p99_s": ttft},
            {**window, "model": "calm", "ttft_p99_s": 0.3, "inflight_mean": 0.2},
        ],
    }
    with api.client(tokens.operator) as c:
        assert c.post("/v1/signals", json=body).status_code == 202


def test_the_autoscaling_page_shows_each_model_against_its_slo(
    browser: Browser, api: ApiServer, tokens: Tokens
) -> None:
    _post(api, tokens, 2.5)
    page = signed_in(browser, api, tokens.reader)
    page.click("nav a[data-page=autoscale]")
    chat = page.locator("#autoscale tr[data-model=chat]")
    expect(chat).to_be_visible()
    expect(chat.locator("td").nth(1)).to_have_text("0 / 1")
    expect(chat.locator("td").nth(2)).to_have_text("1..4")
    expect(chat.locator("td").nth(4)).to_contain_text("3.50 / 4 per replica")
    # Over the SLO: the chart has its SLO line and is drawn as a breach.
    expect(chat.locator("svg.chart.breach line.slo")).to_have_count(1)
    calm = page.locator("#autoscale tr[data-model=calm]")
    expect(calm.locator("svg.chart line.slo")).to_have_count(1)
    expect(calm.locator("svg.chart.breach")).to_have_count(0)
    expect(page.locator("#autoscale-policy")).to_contain_text("window 1m")
    shoot(page, "autoscale")


def test_the_catalog_page_shows_each_models_traffic_beside_its_replicas(
    browser: Browser, api: ApiServer, tokens: Tokens
) -> None:
    _post(api, tokens, 2.5)
    with api.client(tokens.reader) as c:
        rows = {r["model"]: r for r in c.get("/v1/autoscale").json()["models"]}
    assert rows["chat"]["traffic"]["requests_per_s"] > 0
    assert rows["chat"]["traffic"]["inflight"] == 3.5
    page = signed_in(browser, api, tokens.reader)
    chat = page.locator("#models tbody tr[data-model=chat]")
    expect(chat.locator("td").nth(4)).to_have_text("0")  # ready, beside the traffic
    expect(chat.locator("td.traffic.rate")).to_have_text(re.compile(r"^\d+\.\d\d$"))
    expect(chat.locator("td.traffic.inflight")).to_have_text("3.50 (max 0)")
    # TTFT p99 over the SLO: shown against it, and marked.
    expect(chat.locator("td.traffic.ttft")).to_have_text("2.500s / 1s")
    expect(chat.locator("td.traffic.ttft.breach")).to_have_count(1)
    expect(chat.locator("td.traffic.tpot")).to_have_text("- / none")
    calm = page.locator("#models tbody tr[data-model=calm]")
    expect(calm.locator("td.traffic.ttft")).to_have_text("0.300s / 2s")
    expect(calm.locator("td.traffic.breach")).to_have_count(0)
    expect(page.locator("#traffic-window")).to_have_text("(1m)")
    shoot(page, "catalog-traffic")
