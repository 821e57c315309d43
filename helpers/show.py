"""How the kit shows things: units (GiB, GB) and table cells, tables that render as HTML in Jupyter
and as aligned text elsewhere (and a helper's source shown beside a call to it), and figures
(memory bars against the T4's limits, step times, loss curves; each returns the figure).
Standard library only at import (matplotlib inside the plotting functions): every other helper may
import this.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

GiB = 2**30
MiB = 2**20
GB = 10**9
MISSING = "-"


def gib(nbytes: float | None, digits: int = 2) -> str:
    """Bytes as GiB (``"7.34"``); ``"-"`` when there is no figure (None). Zero is a figure: ``"0.00"``."""
    return MISSING if nbytes is None else f"{nbytes / GiB:.{digits}f}"


def mib(nbytes: float | None, digits: int = 1) -> str:
    """Bytes as MiB with thousands separators (``"2,030.3"``); ``"-"`` for None."""
    return MISSING if nbytes is None else f"{nbytes / MiB:,.{digits}f}"


def seconds(value: float | None, digits: int = 2) -> str:
    """Seconds (``"0.27"``); ``"-"`` for None."""
    return MISSING if value is None else f"{value:.{digits}f}"


def clip(text: str, width: int) -> str:
    """``text`` within ``width`` characters, cut at a whole word with " ..." when longer: never
    mid-word ("...or a sm.")."""
    if len(text) <= width:
        return text
    cut = text[:max(width - 4, 1)]
    if text[len(cut)] != " " and " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:(") + " ..."


def status_cell(status: str, message: str = "", ok: str = "ok", width: int = 80) -> str:
    """``ok``, or ``"<status>: <message>"`` with the message :func:`clip`-ped to ``width``."""
    return status if status == ok or not message else f"{status}: {clip(message, width)}"


def loss_cell(losses: Sequence[float], digits: int = 3) -> str:
    """``"first -> last"`` of a loss curve; ``"-"`` when nothing was recorded."""
    return f"{losses[0]:.{digits}f} -> {losses[-1]:.{digits}f}" if losses else MISSING


# ---- tables ------------------------------------------------------------------------------------


class Table:
    """Rows of cells with a header; ``_repr_html_`` for notebooks, ``str`` for terminals and logs."""

    def __init__(self, header: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "",
                 note: str = "") -> None:
        self.header = [str(h) for h in header]
        self.rows = [[_cell(c) for c in row] for row in rows]
        self.title = title
        self.note = note  # a line under the table (what every row shares, where it came from)
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(f"table row {row!r} has {len(row)} cells, the header has {len(self.header)}")

    def __str__(self) -> str:
        widths = [max(len(r[i]) for r in [self.header, *self.rows]) for i in range(len(self.header))]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
        out = [self.title] if self.title else []
        out += [line(self.header), line(["-" * w for w in widths])]
        out += [line(r) for r in self.rows]
        return "\n".join(out + ([self.note] if self.note else []))

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in self.header)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(c)}</td>" for c in r) + "</tr>"
            for r in self.rows
        )
        caption = f"<caption style='text-align:left'><b>{html.escape(self.title)}</b></caption>" if self.title else ""
        note = f"<p>{html.escape(self.note)}</p>" if self.note else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


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


def in_gib(nbytes: float, said_in_gb: bool = False) -> str:
    """Bytes in GiB, the kit's unit on every axis and beside every measurement (``"11.8 GiB"``);
    ``said_in_gb`` adds the GB figure a vendor quotes (Colab's 12.7 GB of RAM) in brackets, so a
    line or a legend never sets a GB figure against GiB ones unconverted."""
    return f"{nbytes / GiB:.1f} GiB" + (f" (= {nbytes / GB:.1f} GB)" if said_in_gb else "")


# ---- figures -----------------------------------------------------------------------------------


def memory_bars(labels: list[str], measured: list[float | None], predicted: list[float | None],
                limit: float | None, title: str, limit_label: str = ""):
    """Measured beside predicted GiB per config, with a horizontal line at the limit."""
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels)), 3.6))
    ax.bar(x - 0.2, [m or 0 for m in measured], 0.4, label="measured")
    ax.bar(x + 0.2, [p or 0 for p in predicted], 0.4, label="predicted", alpha=0.6)
    for i, m in enumerate(measured):
        if m is None:
            ax.text(x[i] - 0.2, 0, "n/a", ha="center", va="bottom", fontsize=8, rotation=90)
    if limit:
        ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=limit_label or f"limit {limit:.1f}")
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GiB")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def step_times(labels: list[str], seconds: list[float | None], title: str = "Seconds per step"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels)), 3.0))
    ax.bar(labels, [s or 0 for s in seconds], color="gray")
    ax.set_ylabel("s/step")
    ax.set_title(title)
    ax.tick_params(axis="x", rotation=30, labelsize=8)
    fig.tight_layout()
    return fig


def loss_curves(curves: dict[str, list[float]], title: str = "Loss per step", ylabel: str = "loss"):
    """One line per config: ZeRO is exact, so the lines should lie on top of each other."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for i, (label, values) in enumerate(curves.items()):
        ax.plot(range(1, len(values) + 1), values, marker="o", markersize=3, linewidth=1.2,
                linestyle="-" if i % 2 == 0 else "--", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
