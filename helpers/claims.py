"""Claims a notebook asserts, and the rules every notebook shares to decide them.

A claim is a ``(sentence, held)`` pair. The rules here are the one place where "the loss falls",
"every item of a comparison agrees" and "within a relative tolerance" are decided, so that every
notebook means the same by them and a test can feed each rule a bad run. No torch, no DeepSpeed:
this module sits at the bottom of the helpers' layers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from helpers.show import Table

Claim = tuple[str, bool]

#: How much of its drop a falling loss may give back by the last step (see :func:`loss_falls`).
LOSS_GIVE_BACK = 0.5


def every(values: Iterable[bool]) -> bool:
    """True when there is at least one value and all are true: an empty comparison is a failure."""
    values = list(values)
    return bool(values) and all(values)


def relative_difference(value: float, reference: float) -> float:
    """|value - reference| / |reference| (inf when the reference is 0 and the value is not)."""
    if value == reference:
        return 0.0
    return abs(value - reference) / abs(reference) if reference else math.inf


def within(measured: float | None, expected: float | None, rtol: float) -> bool:
    """``measured`` within ``rtol`` (relative) of ``expected``; False when either is missing."""
    if measured is None or expected is None:
        return False
    return relative_difference(measured, expected) <= rtol


def loss_falls(losses: Sequence[float]) -> bool:
    """The loss falls as a trend over the whole run, not only from the first step to the last.

    Every rule must hold: at least 3 steps, every loss finite; the mean of the last third below the
    mean of the first third; after the first third, no step above the first (Adam's first steps may
    spike: a healthy GPT-2 run in notebook 04 did); and the last step keeps at least half of the
    drop (``last <= lowest + LOSS_GIVE_BACK * (first - lowest)``). A run that jumps back up at its
    last step (GPT-2 XL once went 11.17, 7.26, 7.24, 7.20, 9.31) fails the last rule.
    """
    losses = list(losses)
    if len(losses) < 3 or not all(math.isfinite(x) for x in losses):
        return False
    third = len(losses) // 3
    first, lowest, last = losses[0], min(losses), losses[-1]
    return (sum(losses[-third:]) / third < sum(losses[:third]) / third
            and max(losses[third:]) <= first
            and last <= lowest + LOSS_GIVE_BACK * (first - lowest))


def loss_falls_claim(label: str, losses: Sequence[float]) -> Claim:
    """The :func:`loss_falls` rule as a claim whose sentence quotes the run's own losses."""
    if not losses:
        return f"{label}: the loss falls (no losses recorded)", False
    shown = ", ".join(f"{x:.3f}" for x in losses) if len(losses) <= 6 else (
        f"{losses[0]:.3f} ... {min(losses):.3f} (lowest) ... {losses[-1]:.3f}")
    return f"{label}: the loss falls over the run ({shown})", loss_falls(losses)


def failed(claims: Sequence[Claim]) -> list[str]:
    """The sentences of the claims that did not hold."""
    return [sentence for sentence, held in claims if not held]


def assert_all(claims: Sequence[Claim]) -> Table:
    """Raise AssertionError naming every claim that did not hold (and an empty list: nothing was
    checked); otherwise return the claims as a table. Notebooks end their checks with this."""
    if not claims:
        raise AssertionError("no claims to check: an empty check list proves nothing")
    bad = failed(claims)
    if bad:
        raise AssertionError("these checks failed: " + "; ".join(bad))
    return Table(["claim", "held"], claims, title="Checks")
