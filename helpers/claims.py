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


# ---- fine-tuning a pretrained model ---------------------------------------------------------------

#: A held-out loss below this share of ln(vocabulary) before training means pretrained weights.
PRETRAINED_LOSS_SHARE = 0.6
#: More optimizer steps than this share skipped for fp16 overflow: the model barely trained.
MAX_SKIPPED_SHARE = 0.5


def pretrained_start(eval_before: float, vocab: int | None) -> bool:
    """Whether the held-out loss before training says the weights were trained already: well below
    ln(vocab), the loss of a freshly initialised model (10.4 at a 32k vocabulary; a pretrained
    SmolLM2-135M reads about 2.9 on Python's documentation). False where the vocabulary is unknown."""
    return (bool(vocab) and math.isfinite(eval_before)
            and eval_before < PRETRAINED_LOSS_SHARE * math.log(vocab))


def pretrained_claim(eval_before: float, vocab: int | None) -> Claim:
    """:func:`pretrained_start` as a claim quoting the loss and ln(vocab)."""
    bound = f"{PRETRAINED_LOSS_SHARE} x ln({vocab}) = {PRETRAINED_LOSS_SHARE * math.log(vocab):.2f}" if vocab else "?"
    return (f"the model starts pretrained: held-out loss {eval_before:.3f} below {bound}",
            pretrained_start(eval_before, vocab))


def training_loss_claim(label: str, losses: Sequence[float], pretrained: bool) -> Claim:
    """From a random start, the shared trend rule (:func:`loss_falls`). From a pretrained start at a
    fine-tuning rate, one batch's loss differs from the next by more than a few steps improve it,
    so the trend rule would fail healthy runs: there the training losses must be finite, and the
    held-out loss (the same blocks before and after) carries the evidence that it learned."""
    if not pretrained:
        return loss_falls_claim(label, losses)
    shown = ", ".join(f"{x:.3f}" for x in losses[:8]) + (" ..." if len(losses) > 8 else "")
    return (f"{label} from a pretrained start: at least 3 training losses, every one finite"
            f" ({shown}; the held-out loss says whether it learned)",
            len(losses) >= 3 and all(math.isfinite(x) for x in losses))


def held_out_claim(eval_before: float, eval_after: float) -> Claim:
    """The held-out loss (the same blocks, kept out of training) fell."""
    return (f"the held-out loss fell ({eval_before:.4f} -> {eval_after:.4f})",
            math.isfinite(eval_before) and math.isfinite(eval_after) and eval_after < eval_before)


def overflow_advice(skipped_steps: int, precision: str, steps: int) -> str:
    """One line on fp16 overflow: how many optimizer steps were skipped, and what to do if many
    (checkpoints trained in bf16, as most modern ones are, can overflow fp16 on a T4)."""
    if precision != "fp16":
        return f"{precision}: no loss scaling, no step skipped for overflow."
    if skipped_steps <= MAX_SKIPPED_SHARE * steps:
        return (f"fp16: {skipped_steps} of {steps} optimizer steps skipped for overflow (the loss"
                " scale finding its level; a few at the start are normal).")
    return (f"fp16: {skipped_steps} of {steps} optimizer steps were skipped for overflow, so the"
            " model barely trained. Checkpoints trained in bf16 can overflow fp16: lower"
            " fp16.initial_scale_power (12 -> 8), lower LR, or pick a checkpoint trained in fp16;"
            " on a GPU of capability 8.0 or more, train in bf16.")


def skipped_claim(skipped_steps: int, steps: int) -> Claim:
    """At most :data:`MAX_SKIPPED_SHARE` of the optimizer steps skipped for fp16 overflow."""
    return (f"at most {MAX_SKIPPED_SHARE:.0%} of the {steps} optimizer steps skipped for fp16 overflow"
            f" ({skipped_steps})", steps > 0 and skipped_steps <= MAX_SKIPPED_SHARE * steps)


def relative_logit_difference(trained, reloaded) -> float:
    """The largest |difference| of two logits tensors, relative to the largest |logit| of the first
    (inf when the shapes differ or a value is not finite, so a wrong model cannot pass). Relative:
    a pretrained model's logits reach tens, and half precision rounds them in the third digit."""
    a, b = trained.detach().float().cpu(), reloaded.detach().float().cpu()
    if a.shape != b.shape:
        return math.inf
    scale = float(a.abs().max())
    diff = float((a - b).abs().max())
    if not math.isfinite(diff):
        return math.inf
    return 0.0 if diff == 0 else diff / scale if scale else math.inf


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
