"""The documentation site at ``/manual``, when it has been built: static files, offline.

``make docs`` builds the MkDocs site (``docs/``) into ``site/`` at the top of the source
tree; a server started from that tree serves it, and ``LLMGW_MANUAL_DIR`` points at a
site built elsewhere (a wheel carries none). Cheap by design: the site is plain files
with relative links (``use_directory_urls: false``), no web fonts and no CDN, so
Starlette's ``StaticFiles`` serves it as it is and it reads the same without network
access. Open to anyone, like ``/docs``: it holds no data. Without a built site,
``/manual`` answers 404 saying how to build one.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from llmgw.api.rendering.problems import Problem

SOURCE_SITE = Path(__file__).resolve().parents[3] / "site"
ENV = "LLMGW_MANUAL_DIR"


def manual_dir() -> Path:
    chosen = os.environ.get(ENV, "").strip()
    return Path(chosen) if chosen else SOURCE_SITE


def install(app: FastAPI) -> None:
    site = manual_dir()
    if (site / "index.html").is_file():
        app.mount("/manual", StaticFiles(directory=site, html=True), name="manual")
        return

    @app.get("/manual", include_in_schema=False)
    @app.get("/manual/{path:path}", include_in_schema=False)
    def missing(path: str = "") -> None:
        raise Problem(
            404,
            "not-found",
            f"the manual is not built where this server looks ({site}): run `make docs` (or "
            f"`make demo`, which builds it too) in the source tree (it builds site/), or set "
            f"{ENV} to a built site, and restart",
        )
