"""Debian's chromium, driven by Playwright (its own browser download is never used).

Where /usr/bin/chromium is missing the tests fail in CI (CI=true or
LLMGW_REQUIRE_BROWSER=1): `make test` installs it first (`make chromium`), so a
missing browser is a broken setup, not a reason to pass without looking.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path(os.environ.get("LLMGW_CHROMIUM", "/usr/bin/chromium"))
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(
    os.environ.get("LLMGW_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts")
)


def require_chromium() -> None:
    if CHROMIUM.exists():
        return
    reason = f"{CHROMIUM} is missing: run `make chromium` (apt-get install -y chromium)"
    if os.environ.get("CI") or os.environ.get("LLMGW_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@contextmanager
def chromium() -> Iterator[Browser]:
    require_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()
