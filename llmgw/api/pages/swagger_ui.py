"""``/docs`` without a CDN: Swagger UI's own files, from the ``swagger-ui-py`` package.

FastAPI's default page loads Swagger UI from a CDN, so in an air-gapped cluster it
is blank. The package ships Swagger UI 5 (which reads OpenAPI 3.1, the version
FastAPI writes); only its files are used, found without importing the package
(which would import its web-framework adapters for nothing).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

ASSETS_URL = "/docs/assets"


def assets_dir() -> Path:
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is not installed; reinstall llmgw")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def install(app: FastAPI, title: str) -> None:
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title}: API",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon-32x32.png",
        )
