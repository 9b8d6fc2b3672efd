"""The web dashboard at ``/ui``: plain HTML, JavaScript and CSS shipped in the package.

No build step and no CDN, so it works in an air-gapped cluster and from a wheel.
The page itself holds no data; everything it shows comes from the API's read
routes with the token the operator pastes in (kept in the browser's session
storage), so it is readable with any token role and refused without one unless
reads are open, exactly as the API is.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse, RedirectResponse
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parents[2] / "ui" / "static"
# The page loads only from this origin; no inline script, no third party.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def install(app: FastAPI) -> None:
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

    @app.get("/ui", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(
            STATIC / "index.html",
            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
        )

    @app.get("/ui/", include_in_schema=False)
    def slash() -> RedirectResponse:
        return RedirectResponse("/ui")
