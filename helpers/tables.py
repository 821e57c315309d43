"""Small tables that render as HTML in Jupyter and as aligned text everywhere else, and a helper's
source shown beside a call to it."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


class Table:
    """Rows of cells with a header; ``_repr_html_`` for notebooks, ``str`` for terminals and logs."""

    def __init__(self, header: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> None:
        self.header = [str(h) for h in header]
        self.rows = [[_cell(c) for c in row] for row in rows]
        self.title = title
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(f"table row {row!r} has {len(row)} cells, the header has {len(self.header)}")

    def __str__(self) -> str:
        widths = [max(len(r[i]) for r in [self.header, *self.rows]) for i in range(len(self.header))]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
        out = [self.title] if self.title else []
        out += [line(self.header), line(["-" * w for w in widths])]
        out += [line(r) for r in self.rows]
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in r) + "</tr>"
            for r in self.rows
        )
        caption = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


class Source:
    """A helper's source code, shown beside a call to it ("show, then reuse"): the full text in
    plain output, a collapsible block in a notebook."""

    def __init__(self, obj: Any) -> None:
        import inspect

        self.name = f"{obj.__module__}.{obj.__qualname__}"
        self.code = inspect.getsource(obj)

    def __str__(self) -> str:
        return f"# {self.name}\n{self.code}"

    def _repr_html_(self) -> str:
        return (f"<details><summary>the code behind <code>{html.escape(self.name)}</code> (click to open)"
                f"</summary><pre style='font-size:11px'>{html.escape(self.code)}</pre></details>")
