"""Plots: memory bars against the T4's limits, step times, loss curves. Each returns the figure."""

from __future__ import annotations



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
