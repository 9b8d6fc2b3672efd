"""The HTTP API reference page, from the OpenAPI document the app serves (``/openapi.json``).

The app is built as ``llmgw serve`` builds it (``llmgw.api.app.create_app``) over an
in-memory database that is never queried: the document describes the routes, not data.
Each route: its summary and description, parameters, body, and every status it answers.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

METHODS = ("get", "put", "post", "delete", "patch")


def document() -> dict[str, Any]:
    from catalog import Catalog
    from events.database.connection import make_engine
    from events.database.migrate import ensure_schema
    from llmgw.api.app import create_app
    from llmgw.api.runtime.services import Services
    from llmgw.api.runtime.settings import ApiSettings

    # A migrated database, as a server has: the app reads its tables (the tokens) as it is
    # built, and an empty one only logged warnings into the site's build.
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(f"sqlite:///{Path(tmp) / 'openapi.db'}")
        try:
            ensure_schema(engine)
            services = Services.build(engine, Catalog.build([]), "catalog.yaml", ApiSettings())
            doc: dict[str, Any] = create_app(services).openapi()
            return doc
        finally:
            engine.dispose()


def render(doc: dict[str, Any] | None = None) -> str:
    doc = document() if doc is None else doc
    info = doc.get("info", {})
    lines = [
        "# HTTP API reference",
        "",
        f"Generated from the OpenAPI document of {info.get('title', 'the API')} "
        f"{info.get('version', '')} when this site was built: the same document a running "
        "server serves at `/openapi.json` and shows at `/docs` (Swagger UI, offline). "
        + str(info.get("description", "")),
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                op = item[method]
                tag = (op.get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((method.upper(), path, op))
    lines += ["| route | what it does |", "|---|---|"]
    for operations in by_tag.values():
        for method, path, op in operations:
            lines.append(f"| [`{method} {path}`](#{_anchor(method, path)}) | {_cell(op)} |")
    lines.append("")
    for tag, operations in by_tag.items():
        lines += [f"## {tag.capitalize()}", ""]
        for method, path, op in operations:
            lines += _operation(method, path, op, doc)
    return "\n".join(lines)


def _anchor(method: str, path: str) -> str:
    # MkDocs' slug of the heading "GET /v1/catalog/{name}": lower case, punctuation
    # dropped, spaces to hyphens.
    text = f"{method} {path}".lower()
    kept = "".join(c for c in text if c.isalnum() or c in " -_")
    return "-".join(kept.split())


def _cell(op: dict[str, Any]) -> str:
    return str(op.get("summary", "")).replace("|", "\\|").replace("\n", " ")


def _operation(method: str, path: str, op: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    lines = [f"### {method} {path}", "", str(op.get("summary", "")), ""]
    if op.get("description"):
        lines += [str(op["description"]), ""]
    auth = "a bearer token" if op.get("security") else "no token"
    lines += [f"Authentication: {auth}.", ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | required | type | meaning |", "|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            meaning = _text(p.get("description") or schema.get("description"))
            lines.append(
                f"| `{p['name']}` | {p.get('in', '')} | {'yes' if p.get('required') else 'no'} "
                f"| {_type(schema, doc)} | {meaning} |"
            )
        lines.append("")
    body = op.get("requestBody")
    if body:
        kinds = ", ".join(f"`{k}`" for k in body.get("content", {}))
        lines += [f"Body ({kinds}): {_text(body.get('description'))}", ""]
    lines += ["| status | meaning |", "|---|---|"]
    for status, response in op.get("responses", {}).items():
        kinds = ", ".join(f"`{k}`" for k in response.get("content", {}))
        shape = ""
        for content in response.get("content", {}).values():
            ref = content.get("schema", {}).get("$ref")
            if ref:
                shape = f" (`{ref.rsplit('/', 1)[-1]}`)"
        suffix = f"; {kinds}{shape}" if kinds else ""
        lines.append(f"| {status} | {_text(response.get('description'))}{suffix} |")
    lines.append("")
    return lines


def _type(schema: dict[str, Any], doc: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in schema:
        return " or ".join(_type(s, doc) for s in schema["anyOf"])
    kind = str(schema.get("type", "any"))
    limits = [
        f"{key} {schema[key]}"
        for key in ("minimum", "maximum", "minLength", "maxLength")
        if key in schema
    ]
    return kind + (f" ({', '.join(limits)})" if limits else "")


def _text(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--json"]:
        print(json.dumps(document(), indent=2))
    else:
        print(render())
