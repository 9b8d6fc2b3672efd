"""The dashboard's usage page in a real headless chromium, against a real `llmgw serve`:
the ledger per client and model with its total, the filters (client, by day), a new
flush drawn as it is recorded (pending: the page looks again every 2 s), and a
malformed usage event named, not summed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from events.core.types import USAGE_RECORDED, NewEvent
from events.database.connection import make_engine
from events.storage.backends import open_log
from tests.api.browser import chromium
from tests.api.server import ApiServer, Tokens, running
from tests.api.test_api_ui import shoot, signed_in

pytestmark = pytest.mark.slow


def _row(client: str, model: str, requests: int, completion: int) -> dict[str, Any]:
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    return {
        "minute": minute.isoformat().replace("+00:00", "Z"),
        "client": client,
        "model": model,
        "served": model,
        "replica": f"{model}/r0",
        "requests": requests,
        "outcomes": {"ok": requests},
        "prompt_tokens": 10 * requests,
        "cached_tokens": 0,
        "completion_tokens": completion,
        "estimated": 0,
    }


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    with running(ApiServer(module_dir, module_sqlite_url, tokens=tokens)) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def _flush(api: ApiServer, tokens: Tokens, flush: str, rows: list[dict[str, Any]]) -> None:
    with api.client(tokens.operator) as c:
        answer = c.post("/v1/usage", json={"flush": flush, "rows": rows})
    assert answer.status_code == 202, answer.text


def test_the_usage_page_shows_the_ledger_filters_it_and_follows_new_flushes(
    browser: Browser, api: ApiServer, tokens: Tokens
) -> None:
    _flush(api, tokens, "one", [_row("app-1", "chat", 3, 30), _row("app-2", "chat", 1, 7)])
    page = signed_in(browser, api, tokens.reader)
    page.click("nav a[data-page=usage]")
    table = page.locator("#usage")
    expect(table.locator("thead th")).to_have_text(
        ["client", "model", "requests", "prompt", "cached", "completion", "total", "outcomes"]
    )
    one = table.locator("tbody tr[data-group='app-1/chat'] td")
    expect(one).to_have_text(["app-1", "chat", "3", "30", "0", "30", "60", "ok 3"])
    expect(table.locator("tbody tr.total td").nth(2)).to_have_text("4")

    # A flush recorded while the page is open is drawn (pending, no event: the page
    # looks again every 2 s).
    _flush(api, tokens, "two", [_row("app-1", "chat", 2, 5)])
    expect(one.nth(2)).to_have_text("5")
    expect(table.locator("tbody tr.total td").nth(5)).to_have_text("42")

    # Filters: one client, by day.
    page.fill("#usage-client", "app-2")
    page.select_option("#usage-by", "day")
    page.click("#usage-form button")
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    expect(table.locator("thead th").first).to_have_text("day")
    expect(table.locator(f"tbody tr[data-group='{day}'] td").nth(1)).to_have_text("1")
    shoot(page, "usage")

    # A malformed usage event (in the hash chain, as written) is named, not summed.
    log = open_log(make_engine(api.db_url))
    bad = {**_row("app-1", "chat", 1, 1), "gateway": "gw", "flush": "f", "requests": -1}
    position = (
        log.append([NewEvent(USAGE_RECORDED, "", json.dumps(bad), 1)], expected_head=None)
        .events[0]
        .position
    )
    page.fill("#usage-client", "")
    page.select_option("#usage-by", "")
    page.click("#usage-form button")
    expect(page.locator("#usage-skipped")).to_contain_text(
        f"1 usage event(s) skipped, not summed: position {position}: usage requests"
    )
    expect(one.nth(2)).to_have_text("5")
