"""The benchmark figures as SVG bar charts, from ``docs/benchmarks/results.json``.

Drawn here rather than pasted as pictures: the numbers are the ones the benchmark pages
report (a test holds each to its page), and a chart is redrawn whenever they change.
Plain SVG with no script and no font download, so the site works offline (``/manual``).
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "results.json"
COLOURS = ("#3f51b5", "#ff9800", "#009688", "#9c27b0")
LABEL_W, BAR_W, VALUE_W = 330, 420, 110
BAR_H, GAP, TOP = 16, 10, 46


def load(path: Path = RESULTS) -> list[dict[str, Any]]:
    charts: list[dict[str, Any]] = json.loads(path.read_text())["charts"]
    return charts


def svg(chart: dict[str, Any]) -> str:
    series: list[str] = chart["series"]
    groups: list[dict[str, Any]] = chart["groups"]
    fmt: str = chart.get("format", "{}")
    floor = float(chart.get("min", 0.0))
    top = max(max(g["values"]) for g in groups)
    span = (top - floor) or 1.0
    rows = sum(len(series) for _ in groups)
    height = TOP + rows * BAR_H + len(groups) * GAP + 30
    width = LABEL_W + BAR_W + VALUE_W
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(chart["title"])}" '
        'font-family="sans-serif" font-size="12">',
        f"<title>{escape(chart['title'])}</title>",
        f'<text x="0" y="16" font-size="14" font-weight="bold">{escape(chart["title"])}</text>',
    ]
    x = 0
    for i, name in enumerate(series):  # the legend
        out.append(
            f'<rect x="{x}" y="26" width="10" height="10" fill="{COLOURS[i % len(COLOURS)]}"/>'
        )
        out.append(f'<text x="{x + 14}" y="35">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    y = TOP
    for group in groups:
        out.append(
            f'<text x="{LABEL_W - 8}" y="{y + BAR_H - 4}" text-anchor="end">'
            f"{escape(group['label'])}</text>"
        )
        for i, value in enumerate(group["values"]):
            length = max(1.0, BAR_W * (value - floor) / span)
            colour = COLOURS[i % len(COLOURS)]
            out.append(
                f'<rect x="{LABEL_W}" y="{y}" width="{length:.1f}" height="{BAR_H - 2}" '
                f'fill="{colour}"/>'
            )
            out.append(
                f'<text x="{LABEL_W + length + 4:.1f}" y="{y + BAR_H - 4}">'
                f"{escape(fmt.format(value))}</text>"
            )
            y += BAR_H
        y += GAP
    axis = f"axis from {fmt.format(floor)}" if floor else "axis from 0"
    out.append(
        f'<text x="{LABEL_W}" y="{height - 8}" fill="#666">{escape(chart["unit"])}; '
        f'{escape(axis)}; measured by <tspan font-family="monospace">'
        f"{escape(chart['command'])}</tspan></text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def markdown(charts: list[dict[str, Any]]) -> str:
    """The figures section of the benchmarks' index: each chart, linked to its page."""
    lines = []
    for chart in charts:
        lines += [
            f"![{chart['title']}](charts/{chart['id']}.svg)",
            "",
            f"From [{chart['page'].removesuffix('.md').replace('-', ' ')}]({chart['page']}); "
            f"measured by `{chart['command']}`.",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    for chart in load():
        print(svg(chart))
