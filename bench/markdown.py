"""Markdown tables as the bench writes them, in report.md and in `verdict bench compare`: a section
opening with its table's head, rows of cells, and two runs' rows of one section side by side."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def table(header: str) -> list[str]:
    """A table's header line and its separator, from its column names joined by " | "."""
    return [f"| {header} |", "|---" * (header.count(" | ") + 1) + "|"]


def section(heading: str, header: str, intro: list[str] | None = None) -> list[str]:
    """A report section's opening: its heading, any lines that introduce it, then its table's head."""
    return ["", f"## {heading}", "", *([*intro, ""] if intro else []), *table(header)]


def row(cells: Iterable[object]) -> str:
    """One table line: the cells between pipes."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def rate_text(r: dict | None) -> str:
    """A rate as 'rate (k/n; Wilson CI)' for the tables."""
    if not r or r.get("rate") is None:
        return "n/a"
    ci = r.get("ci95")
    return f"{r['rate']:.3f} ({r['k']}/{r['n']}" + (f"; {ci[0]:.3f}-{ci[1]:.3f}" if ci else "") + ")"


def side_by_side(
    a: dict, b: dict, key: str, title: str, header: str, rows: Callable[[dict], Iterable[list]]
) -> list[str]:
    """Both runs' rows of the section ``key`` in one table, each tagged A or B; nothing when neither
    run has the section. ``header`` names the columns after the run tag, ``rows`` gives a section's
    rows (their cells after the tag)."""
    if not (a.get(key) or b.get(key)):
        return []
    lines = ["", title, "", *table(f"run | {header}")]
    for tag, s in (("A", a), ("B", b)):
        lines += [row([tag, *cells]) for cells in rows(s.get(key) or {})]
    return lines
