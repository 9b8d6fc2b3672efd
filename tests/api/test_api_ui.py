"""The /ui dashboard in a real headless chromium, against a real `llmgw serve`."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from events.core.types import USAGE_RECORDED, NewEvent
from events.database.connection import make_engine
from events.storage.backends import open_log
from tests.api.browser import ARTIFACTS, chromium
from tests.api.server import ApiServer, Tokens, definition, running

pytestmark = pytest.mark.slow

NODES = [
    {"name": "node-0", "gpu_class": "T4", "gpus": 2, "memory_gb": 64},
    {"name": "node-1", "gpu_class": "T4", "gpus": 4, "memory_gb": 64},
]


@pytest.fixture(scope="module")
def api(module_sqlite_url: str, module_dir: Path, tokens: Tokens) -> Iterator[ApiServer]:
    server = ApiServer(
        module_dir, module_sqlite_url, tokens=tokens, args=["--with-scheduler", "--interval", "1"]
    )
    with running(server):
        with server.client(tokens.agent) as agent:
            for node in NODES:
                assert agent.put(f"/v1/nodes/{node['name']}", json=node).status_code == 200
        with server.client(tokens.operator) as ops:
            fits = definition("fits-7b", scaling={"min": 1})
            assert ops.post("/v1/catalog/models", json=fits).status_code == 201
            big = definition(
                "too-big-70b",
                profiles=[{"name": "t4x8", "gpu_class": "T4", "tp": 8}],
                scaling={"min": 1},
            )
            assert ops.post("/v1/catalog/models", json=big).status_code == 201
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def signed_in(browser: Browser, api: ApiServer, token: str, page: Page | None = None) -> Page:
    if page is None:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{api.url}/ui")
    expect(page.locator("#login")).to_be_visible()
    page.fill("#token", token)
    page.click("#login button")
    page.wait_for_selector("body[data-ready=true]")
    return page


def shoot(page: Page, name: str) -> Path:
    """Saves a screenshot as a test artifact; checks it is a real PNG of the viewport."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"ui-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert width == 1280 and height >= 400
    return path


def test_without_a_token_the_page_asks_for_one_and_shows_no_data(
    browser: Browser, api: ApiServer
) -> None:
    page = browser.new_page()
    page.goto(f"{api.url}/ui")
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#login-why")).to_contain_text("needs a bearer token")
    assert page.locator("#models tbody tr").count() == 0
    page.close()


def test_the_catalog_page_shows_wanted_placed_and_why_a_replica_is_unplaced(
    browser: Browser, api: ApiServer, tokens: Tokens
) -> None:
    page = signed_in(browser, api, tokens.reader)
    # The scheduler inside the server places fits-7b within a round or two.
    fits = page.locator("#models tbody tr[data-model='fits-7b'] td")
    expect(fits.nth(3)).to_have_text("1", timeout=30_000)
    row = page.locator("#models tbody tr[data-model='too-big-70b'] td")
    expect(row.nth(1)).to_have_text("runtime")
    expect(row.nth(2)).to_have_text("1")  # wanted
    expect(row.nth(5)).to_have_text("1")  # unplaced
    expect(page.locator("#models tbody tr[data-model='base-7b'] td").nth(1)).to_have_text(
        "declared"
    )
    expect(page.locator("#unplaced")).to_contain_text("too-big-70b[0]")
    expect(page.locator("#unplaced")).to_contain_text("free GPUs")
    # Resilience, as `llmgw models` words it (the column read nothing from /v1/fleet).
    expect(page.locator("#models tbody tr[data-model='fits-7b'] td.resilience")).to_have_text(
        "lost with 1 node (1 replica)"
    )
    expect(page.locator("#live")).to_have_text("live")
    shoot(page, "catalog")
    page.close()


def test_nodes_placements_and_history_pages(
    browser: Browser, api: ApiServer, tokens: Tokens
) -> None:
    page = signed_in(browser, api, tokens.reader)
    page.click("nav a[data-page=nodes]")
    nodes = page.locator("#nodes tbody tr")
    expect(nodes).to_have_count(2)
    expect(nodes.first).to_contain_text("node-0")
    expect(nodes.first).to_contain_text("fresh")
    shoot(page, "nodes")

    page.click("nav a[data-page=placements]")
    expect(page.locator("#placements tbody")).to_contain_text("fits-7b", timeout=30_000)
    shoot(page, "placements")

    page.click("nav a[data-page=history]")
    expect(page.locator("#events tbody tr")).to_have_count(2)
    page.fill("#diff-a", "1")
    page.fill("#diff-b", "2")
    page.click("#diff-form button")
    expect(page.locator("#diff-lines")).to_have_text("+ too-big-70b added")
    shoot(page, "history")
    page.close()


def test_a_change_shows_up_live_from_the_event_stream(
    browser: Browser, api: ApiServer, tokens: Tokens
) -> None:
    page = signed_in(browser, api, tokens.reader)
    expect(page.locator("#live")).to_have_text("live")
    with api.client(tokens.operator) as ops:
        added = ops.post("/v1/catalog/models", json=definition("arrived-live"))
        assert added.status_code == 201
    expect(page.locator("#models tbody tr[data-model='arrived-live']")).to_have_count(
        1, timeout=30_000
    )
    page.close()


def test_a_placement_event_shows_up_live_too(
    browser: Browser, api: ApiServer, tokens: Tokens
) -> None:
    """A cordon writes no catalog event, only a placement event: the page redraws on it."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    # The page's own periodic refresh is switched off, so only the stream can redraw it:
    # the test then proves that without racing a 10 s timer on a busy machine.
    page.add_init_script("window.setInterval = () => 0;")
    page = signed_in(browser, api, tokens.reader, page)
    expect(page.locator("#live")).to_have_text("live")
    page.click("nav a[data-page=nodes]")
    row = page.locator("#nodes tbody tr", has_text="node-1")
    expect(row).not_to_contain_text("cordoned")
    with api.client(tokens.operator) as ops:
        assert ops.post("/v1/nodes/node-1/cordon", json={"reason": "ui"}).status_code == 200
        try:
            # With no periodic refresh, only the stream's placement event can redraw it.
            expect(row).to_contain_text("cordoned", timeout=60_000)
        finally:
            assert ops.post("/v1/nodes/node-1/uncordon", json={}).status_code == 200
    page.close()


def test_a_hostile_reason_is_shown_as_text_not_markup(
    browser: Browser, api: ApiServer, tokens: Tokens
) -> None:
    with api.client(tokens.operator) as ops:
        # A model of its own: xdist may run this test on a worker where no other test of
        # the module has added one (each worker starts its own module-scoped server).
        added = ops.post("/v1/catalog/models", json=definition("hostile-reason-7b"))
        assert added.status_code == 201, added.text
        removed = ops.delete(
            "/v1/catalog/models/hostile-reason-7b",
            params={"reason": "<img src=x onerror=alert(1)>"},
        )
        assert removed.status_code == 200, removed.text
    page = signed_in(browser, api, tokens.reader)
    page.click("nav a[data-page=history]")
    expect(page.locator("#events tbody")).to_contain_text("<img src=x onerror=alert(1)>")
    assert page.locator("#events img").count() == 0
    page.close()


def test_with_reads_open_the_page_reads_without_a_token(
    browser: Browser, module_sqlite_url: str, tmp_path: Path
) -> None:
    server = ApiServer(tmp_path, module_sqlite_url, args=["--open-reads"])
    with running(server):
        page = browser.new_page()
        page.goto(f"{server.url}/ui")
        page.wait_for_selector("body[data-ready=true]")
        expect(page.locator("#login")).to_be_hidden()
        expect(page.locator("#models tbody tr[data-model='base-7b']")).to_have_count(1)
        page.close()


def test_the_page_follows_the_placement_log_from_its_head_not_from_the_start(
    browser: Browser, sqlite_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    """The first stream connection asked for every placement event since position 0,
    which the page had already drawn from /v1/fleet: one redraw per burst of old events
    on every page load. It now starts at the head /v1/fleet reports."""
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens)
    with running(server):
        with server.client(tokens.operator) as ops:
            assert ops.put("/v1/nodes/node-0", json=NODES[0]).status_code == 200
            for _ in range(3):
                assert ops.post("/v1/nodes/node-0/cordon").status_code == 200
                assert ops.post("/v1/nodes/node-0/uncordon").status_code == 200
            head = ops.get("/v1/fleet").json()["placement_head"]
        assert head == 6
        page = browser.new_page()
        streams: list[str] = []
        page.on(
            "request", lambda r: streams.append(r.url) if "/v1/events/stream" in r.url else None
        )
        page.goto(f"{server.url}/ui")
        page.fill("#token", tokens.reader)
        page.click("#login button")
        expect(page.locator("#live")).to_have_text("live", timeout=30_000)
        assert streams, "the page opened no stream"
        assert "placements=true" in streams[0]
        assert f"placements_after={head}" in streams[0], streams[0]
        page.close()


def test_the_history_shows_the_newest_events_on_the_first_load_not_the_oldest(
    browser: Browser, sqlite_url: str, tmp_path: Path, tokens: Tokens
) -> None:
    """The first page load read the catalog's log from position 0: the history showed its
    oldest 100 events until the next refresh. It now counts back from the head."""
    server = ApiServer(tmp_path, sqlite_url, tokens=tokens, declared=None)
    with running(server):
        with server.client(tokens.operator) as ops:
            models = {"models": [definition(f"hist-{i:03d}") for i in range(130)]}
            assert ops.post("/v1/catalog/models", json=models).status_code == 201
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        pages: list[str] = []
        page.on("request", lambda r: pages.append(r.url) if "/v1/events?" in r.url else None)
        page.goto(f"{server.url}/ui#history")
        page.fill("#token", tokens.reader)
        page.click("#login button")
        page.wait_for_selector("body[data-ready=true]")
        assert pages and "newest=100" in pages[0], pages
        rows = page.locator("#events tbody tr")
        expect(rows).to_have_count(100)
        expect(rows.first.locator("td").first).to_have_text("130")
        expect(rows.last.locator("td").first).to_have_text("31")

        # 150 usage events since (the ledger's, one a minute per key with traffic): the
        # page still shows the catalog's newest changes, the usage events when asked.
        row = {"gateways": ["gw-1-w0"], "flushes": 1, "minute": "2026-12-07T04:05:00Z",
               "client": "app-1", "model": "m", "served": None, "replica": None,
               "requests": 1, "outcomes": {"ok": 1}, "prompt_tokens": 0,
               "cached_tokens": 0, "completion_tokens": 0, "estimated": 0}  # fmt: skip
        engine = make_engine(sqlite_url)
        usage = NewEvent(USAGE_RECORDED, "", json.dumps(row), 2)
        open_log(engine).append([usage] * 150, expected_head=None)
        engine.dispose()
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        expect(rows.first.locator("td").first).to_have_text("130")
        expect(rows.first.locator("td").nth(2)).to_have_text("model.added")
        page.check("#history-usage")
        expect(rows.first.locator("td").first).to_have_text("280")
        expect(rows.first.locator("td").nth(2)).to_have_text(USAGE_RECORDED)
        expect(rows).to_have_count(100)
        page.close()
