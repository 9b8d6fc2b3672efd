"""MkDocs hooks (``mkdocs.yml``: ``hooks``): the generated pages, made at every build.

``on_files`` adds the CLI, HTTP API and metrics references and the benchmark charts as
files of the build (never written into ``docs/``, never committed); ``on_page_markdown``
fills the two placeholders committed pages hold, ``{{ generated: tables }}`` (the events
schema page) and ``{{ generated: charts }}`` (the benchmarks' index).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # mkdocs loads this file by path, not as docsite.hooks
    sys.path.insert(0, str(ROOT))

from docsite import (  # noqa: E402
    charts,
    cli_reference,
    http_reference,
    metrics_reference,
    tables_reference,
)


def _charts() -> str:
    return charts.markdown(charts.load())


PLACEHOLDERS: dict[str, Callable[[], str]] = {
    "{{ generated: tables }}": tables_reference.render,
    "{{ generated: charts }}": _charts,
}


def on_files(files: Files, config: Any) -> Files:
    pages = {
        "reference/cli.md": cli_reference.render(),
        "reference/http-api.md": http_reference.render(),
        "reference/metrics.md": metrics_reference.render(),
    }
    for chart in charts.load():
        pages[f"benchmarks/charts/{chart['id']}.svg"] = charts.svg(chart)
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    for marker, make in PLACEHOLDERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
