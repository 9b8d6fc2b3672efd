"""The documentation site, built for real with ``mkdocs build --strict`` (as ``make docs``
does), served by a real ``llmgw serve`` at ``/manual``; and the 404 that says how to build
it when there is none."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.server import REPO, ApiServer, running

pytestmark = pytest.mark.slow
MKDOCS = str(Path(sys.executable).parent / "mkdocs")


@pytest.fixture(scope="module")
def site(module_dir: Path) -> Iterator[Path]:
    if not Path(MKDOCS).exists():
        pytest.fail("mkdocs is missing: it comes with the dev extra (.[dev], through .[docs])")
    target = module_dir / "site"
    done = subprocess.run(
        [MKDOCS, "build", "--strict", "--site-dir", str(target)],
        check=False,
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    yield target


def test_the_built_manual_is_served_at_manual_with_its_generated_pages(
    site: Path, module_sqlite_url: str, module_dir: Path
) -> None:
    server = ApiServer(module_dir, module_sqlite_url, env={"LLMGW_MANUAL_DIR": str(site)})
    with running(server), server.client() as anyone:  # no token: it holds no data
        home = anyone.get("/manual/")
        assert home.status_code == 200, home.text
        assert "text/html" in home.headers["content-type"]
        assert "llmgw-control" in home.text
        assert anyone.get("/manual", follow_redirects=True).status_code == 200
        # The generated references: from the parser, the OpenAPI document, the registry.
        cli = anyone.get("/manual/reference/cli.html").text
        assert "llmgw nodes drain" in cli and "usage: llmgw" in cli
        http = anyone.get("/manual/reference/http-api.html").text
        assert "/v1/catalog/models/{name}" in http and "/v1/fleet" in http
        assert "llmgw_model_replicas_unplaced" in anyone.get("/manual/reference/metrics.html").text
        assert "placement_outcome" in anyone.get("/manual/reference/events.html").text
        chart = anyone.get("/manual/benchmarks/charts/placement-quality.svg")
        assert chart.status_code == 200 and chart.text.startswith("<svg")
        assert "charts/placement-quality.svg" in anyone.get("/manual/benchmarks/index.html").text
        # Offline: nothing the pages load comes from another host.
        for page in (home.text, cli):
            assert "fonts.googleapis.com" not in page and "cdn.jsdelivr" not in page
        assert anyone.get("/manual/no-such-page.html").status_code == 404


def test_without_a_built_manual_manual_says_how_to_build_one(
    tmp_path: Path, sqlite_url: str
) -> None:
    empty = tmp_path / "nothing-built"
    empty.mkdir()
    server = ApiServer(tmp_path, sqlite_url, env={"LLMGW_MANUAL_DIR": str(empty)})
    with running(server), server.client() as anyone:
        answer = anyone.get("/manual/reference/cli.html")
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/problem+json"
    assert "make docs" in answer.json()["detail"]
