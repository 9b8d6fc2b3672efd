"""Tables for people: what the commands print without --json (the JSON is llmgw.views)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog.forms.text import shown

if TYPE_CHECKING:
    from catalog import Catalog


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns for people. Every cell goes through ``shown``: a stored value with a
    newline would otherwise print as a row of its own (catalog.forms.text)."""
    widths = column_widths(headers, rows)
    lines = [table_row(headers, widths)]
    lines.extend(table_row(row, widths) for row in rows)
    return "\n".join(lines) + "\n"


def column_widths(headers: list[str], rows: list[list[str]]) -> list[int]:
    """The widths ``table`` pads to; a follower pads its later rows to the same."""
    cells = [[shown(cell) for cell in row] for row in rows]
    return [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]


def table_row(row: list[str], widths: list[int]) -> str:
    """One row of a table: its cells through ``shown``, padded (a longer cell just pushes on)."""
    return "  ".join(shown(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def catalog_table(catalog: Catalog) -> str:
    """The models as ``llmgw models`` and ``llmgw show`` print them: one line a model
    (scaling, origin, aliases, placement rules), one a profile; "" for no models."""
    # Every name through `shown`: a catalog restored from old rows may hold
    # names from before the identifier grammar.
    lines: list[str] = []
    for m in catalog.models():
        origin = "declared" if catalog.is_declared(m.name) else "runtime"
        aliases = f" aliases={','.join(map(shown, m.aliases))}" if m.aliases else ""
        rules = m.placement
        placement = "".join(
            (
                f" priority={rules.priority}" if rules.priority else "",
                f" spread_by={shown(rules.spread_by)}" if rules.spread_by else "",
                " spread_required" if rules.spread_required else "",
            )
        )
        scaling = f"(min {m.scaling.min}, max {m.scaling.max})"
        lines.append(f"{shown(m.name)} {scaling} [{origin}]{aliases}{placement}")
        for p in m.profiles:
            lines.append(
                f"  {shown(p.name):<20} {shown(p.engine):<10} {shown(p.gpu_class or '-'):<12} "
                f"tp={p.tp} nodes={p.nodes} priority={p.priority}"
            )
    return "\n".join(lines) + ("\n" if lines else "")
