"""The documentation's own rules: a short front door, figures drawn from the numbers the
pages report, generated references that cover what they generate from.

The strict build itself (every link and anchor) is ``make docs``, and
``tests/api/test_api_manual.py`` (which ``make test`` runs) builds the site so and serves it.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from docsite import charts, cli_reference, http_reference

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


def test_the_readme_is_a_front_door_with_both_commands_the_flow_and_a_map() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    assert "make demo" in text and "make test" in text
    assert (
        "events.read.replay" in text and "scheduler.planner.plan" in text
    )  # the picture of the flow
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


def test_the_benchmarks_index_at_the_root_points_at_pages_that_exist() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(links) >= 8
    for link in links:
        assert (ROOT / link).is_file(), link


def test_every_page_under_docs_is_in_the_nav() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def listed(items: list[object]) -> set[str]:
        found: set[str] = set()
        for item in items:
            if isinstance(item, str):
                found.add(item)
            elif isinstance(item, dict):
                for value in item.values():
                    found |= listed(value) if isinstance(value, list) else {value}
        return found

    in_nav = listed(config["nav"])
    generated = {"reference/cli.md", "reference/http-api.md", "reference/metrics.md"}
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages | generated == in_nav, (in_nav - pages - generated, pages - in_nav)


def _shown(value: float, fmt: str) -> set[str]:
    """The ways a page may write ``value``: as the chart formats it, or as given."""
    plain = f"{value:,}" if isinstance(value, int) else f"{value:,}".rstrip("0").rstrip(".")
    return {fmt.format(value), plain, f"{value}"}


def test_every_charted_figure_is_one_its_page_reports() -> None:
    for chart in charts.load():
        page = (DOCS / "benchmarks" / chart["page"]).read_text()
        for group in chart["groups"]:
            for value in group["values"]:
                forms = _shown(value, chart.get("format", "{}"))
                assert any(form in page for form in forms), (chart["id"], group["label"], value)
        svg = charts.svg(chart)
        assert svg.startswith("<svg") and "<script" not in svg
        assert chart["title"] in svg


def test_the_cli_reference_has_every_command_and_the_http_reference_every_route() -> None:
    from llmgw.cli import build_parser
    from llmgw.cli.shared.help_text import subcommands

    cli = cli_reference.render()
    for path in subcommands(build_parser()):
        assert f"## llmgw {path}\n" in cli
    doc = http_reference.document()
    http = http_reference.render(doc)
    for path, item in doc["paths"].items():
        for method in http_reference.METHODS:
            if method in item:
                assert f"### {method.upper()} {path}\n" in http
