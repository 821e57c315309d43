"""Units and table cells: the one home for GiB, GB and how a byte count, a run's status or a loss
curve is written in a table. Standard library only: every other helper may import this.
"""

from __future__ import annotations

from collections.abc import Sequence

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


def status_cell(status: str, message: str = "", ok: str = "ok", width: int = 80) -> str:
    """``ok``, or ``"<status>: <message>"`` cut to ``width`` characters of message."""
    return status if status == ok or not message else f"{status}: {message[:width]}"


def loss_cell(losses: Sequence[float], digits: int = 3) -> str:
    """``"first -> last"`` of a loss curve; ``"-"`` when nothing was recorded."""
    return f"{losses[0]:.{digits}f} -> {losses[-1]:.{digits}f}" if losses else MISSING
