"""Notebook 07, the engine by hand, then Accelerate: measuring, plotting and checking one DeepSpeed
config fine-tuning a pretrained model three ways (the engine by hand, Accelerate, the Trainer), a
checkpoint resumed, and ZeRO-2 / ZeRO-3 checkpoints turned into ``from_pretrained`` folders.

The training code itself stands in the notebook's visible ``lesson`` cells, which import no kit
module; this module only prepares offline files, compares what those cells recorded, and decides
the notebook's claims with the shared rules of :mod:`helpers.claims`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from helpers import claims, launch
from helpers import env as kit_env
from helpers.show import Table


@dataclass(frozen=True)
class Tolerance:
    """How close two runs of the same config must be, relative to the reference's value."""

    first_step: float  # the first loss: same weights, same batch, so only rounding differs
    every_step: float  # every later loss: rounding differences compound through the updates
    logits: float  # a reloaded model's logits, relative to the largest |logit|


#: fp32 (the CPU): the three paths run the same DeepSpeed optimizer on the same numbers, so only
#: summation order may differ. fp16 and bf16 (GPUs): step 1 is the same forward on the same weights,
#: so rounding alone; later steps may drift through loss scaling and 16-bit rounding. A reloaded model
#: runs in the engine's dtype on the same weights. Measured: every difference was 0.0 on a CPU (fp32,
#: notebook 07's smoke sizes) and on an H200 (GPT-2 124M-shaped, 60 steps, fp16 and bf16), so these
#: leave room for other kernels; at step 1 not so much that the Trainer's miscount of 1/BLOCK (0.4% at
#: BLOCK 256) could hide.
TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(first_step=1e-4, every_step=1e-3, logits=1e-4),
    "fp16": Tolerance(first_step=1e-3, every_step=5e-2, logits=1e-2),
    "bf16": Tolerance(first_step=1e-3, every_step=5e-2, logits=2e-2),
}


def tolerance(precision: str) -> Tolerance:
    """The tolerance of a precision ("fp32", "fp16" or "bf16")."""
    if precision not in TOLERANCES:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(TOLERANCES)}")
    return TOLERANCES[precision]


# ---- comparisons ---------------------------------------------------------------------------------


def largest_difference(losses: Sequence[float], reference: Sequence[float]) -> float | None:
    """The largest step-by-step relative difference of two loss curves (None: nothing to compare)."""
    pairs = list(zip(losses, reference))
    if not pairs:
        return None
    return max(claims.relative_difference(a, b) for a, b in pairs)


def compare(losses: Mapping[str, Sequence[float]], precision: str, reference: str = "engine",
            steps: int | None = None, pretrained: bool = False) -> list[claims.Claim]:
    """The claims that every path trained the same: each recorded its losses (``steps`` of them when
    given), the first losses agree within the first-step tolerance, every later loss within the
    every-step tolerance, and each path's training losses pass :func:`helpers.claims.training_loss_claim`
    (from random weights the loss falls as a trend; from a ``pretrained`` start, where batch noise
    outweighs a few steps' progress, every loss is finite and the held-out loss carries the
    evidence). An empty comparison fails."""
    tol = tolerance(precision)
    ref = list(losses.get(reference, []))
    others = [p for p in losses if p != reference]
    counts = {p: len(v) for p, v in losses.items()}
    expected = steps if steps is not None else len(ref)
    out: list[claims.Claim] = [
        (f"every path recorded its losses ({', '.join(f'{p}: {n}' for p, n in counts.items()) or 'no paths'})",
         claims.every(n > 0 for n in counts.values()) and reference in losses and bool(others)),
        (f"every path ran the same {expected} steps",
         expected > 0 and claims.every(n == expected for n in counts.values())),
    ]
    firsts = ", ".join(f"{p} {v[0]:.6f}" for p, v in losses.items() if len(v)) or "none"
    out.append((f"step 1: every path starts from the {reference}'s loss within {tol.first_step:g} "
                f"(relative, {precision}): {firsts}",
                bool(ref) and claims.every(len(losses[p]) > 0 and claims.within(losses[p][0], ref[0], tol.first_step)
                                           for p in others)))
    for path in others:
        other = list(losses[path])
        worst = largest_difference(other, ref)
        shown = "nothing to compare" if worst is None else f"largest difference {worst:.1e}"
        out.append((f"{path}: every step within {tol.every_step:g} of the {reference}'s loss ({shown})",
                    bool(ref) and len(other) == len(ref)
                    and claims.every(claims.within(a, b, tol.every_step) for a, b in zip(other, ref))))
    out += [claims.training_loss_claim(path, list(values), pretrained) for path, values in losses.items()]
    return out


def resume_claim(uninterrupted: Sequence[float], resumed: Sequence[float], start: int,
                 precision: str) -> claims.Claim:
    """The engine reloaded from the checkpoint saved before step ``start + 1`` reproduces the
    uninterrupted run's losses from there (within the first-step tolerance: same numbers)."""
    tol = tolerance(precision).first_step
    expected = list(uninterrupted[start:start + len(resumed)])
    shown = ", ".join(f"{a:.6f} vs {b:.6f}" for a, b in zip(resumed, expected)) or "no losses"
    held = (len(resumed) > 0 and len(expected) == len(resumed)
            and claims.every(claims.within(a, b, tol) for a, b in zip(resumed, expected)))
    steps = f"steps {start + 1}-{start + len(resumed)}" if len(resumed) > 1 else f"step {start + 1}"
    return (f"resumed from the checkpoint saved after step {start}: the next losses ({steps}) match the "
            f"uninterrupted run's within {tol:g} ({shown})", held)


def logit_difference(trained, reloaded) -> float:
    """claims.relative_logit_difference: relative to the largest |logit| of ``trained``."""
    return claims.relative_logit_difference(trained, reloaded)


def logits_claim(label: str, difference: float | None, precision: str) -> claims.Claim:
    """The reloaded model gives the trained engine's logits within the precision's tolerance."""
    tol = tolerance(precision).logits
    shown = "not measured" if difference is None else f"{difference:.1e}"
    held = difference is not None and math.isfinite(difference) and difference <= tol
    return f"{label}: the reloaded model gives the trained engine's logits (difference {shown} <= {tol:g})", held


def partition_counts(module) -> tuple[int, int]:
    """(elements in ``module.state_dict()``'s parameters, elements of the whole model).

    Under ZeRO-3 each parameter's ``.data`` is an empty placeholder outside forward and backward
    (its pieces live in ``ds_tensor``; ``ds_numel`` is its full size), so the module's own state
    dict holds almost nothing: what a checkpoint conversion has to put back together.
    """
    local = full = 0
    for param in module.parameters():
        local += param.numel()
        full += int(getattr(param, "ds_numel", param.numel()))
    return local, full


def partition_table(module, rows: int = 4) -> Table:
    """The first few parameters under ZeRO-3: the shape the module shows, the full shape, the
    elements this rank keeps."""
    out, named = [], list(module.named_parameters())
    for name, param in named[:rows]:
        full = tuple(getattr(param, "ds_shape", param.shape))
        kept = getattr(param, "ds_tensor", None)
        out.append((name, tuple(param.shape), full, "-" if kept is None else kept.numel()))
    local, whole = partition_counts(module)
    out.append((f"all {len(named)} parameters", f"{local:,} elements", f"{whole:,} elements", ""))
    return Table(["parameter", "shape in the module", "full shape", "elements on this rank"], out,
                 title="ZeRO-3: the module holds empty placeholders; DeepSpeed holds the pieces")


def zero3_partitioned_claim(local: int, full: int) -> claims.Claim:
    """Under ZeRO-3 (threshold 0) the module's parameters are empty: nothing whole to save."""
    return (f"ZeRO-3 partitioned the weights: the module itself held {local:,} of {full:,} elements",
            full > 0 and local == 0)


def matches_claim(label: str, losses: Sequence[float], reference: Sequence[float], precision: str) -> claims.Claim:
    """Another run of the same weights and data (ZeRO-3 against ZeRO-2) reproduces the reference's
    first ``len(losses)`` losses within the every-step tolerance."""
    tol = tolerance(precision).every_step
    worst = largest_difference(losses, reference)
    shown = "nothing to compare" if worst is None else f"largest difference {worst:.1e}"
    held = (len(losses) > 0 and len(reference) >= len(losses)
            and claims.every(claims.within(a, b, tol) for a, b in zip(losses, reference)))
    return f"{label}: the same losses as the ZeRO-2 engine's first {len(losses)} steps within {tol:g} ({shown})", held


def continuation_claim(prompt: str, before: str, after: str) -> claims.Claim:
    """The reloaded, fine-tuned model still writes: its greedy continuation of the prompt holds
    text (not only blanks or special tokens, which a broken save or a wrecked model gives)."""
    return (f"the reloaded model continues {prompt!r}: {after!r} (before training: {before!r})",
            bool(after and after.strip()))


# ---- the Trainer's token count ------------------------------------------------------------------


def expected_trainer_ratio(model_name: str, block: int) -> float:
    """What the Trainer's loss is, as a fraction of the model's own mean loss, when nobody names the
    loss type: 1 for a model whose class transformers maps to its causal-LM loss (``...ForCausalLM``),
    (block - 1) / block for one it does not (``GPT2LMHeadModel``): the Trainer then counts every
    label of a row, the first one too, which nothing predicts."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_name))
    counted = LOSS_MAPPING.get(getattr(model, "loss_type", None)) is ForCausalLMLoss
    return 1.0 if counted else (block - 1) / block


def trainer_first_loss(model_name: str, dataset, args, trainer=None) -> float | None:
    """The first loss of a one-step Trainer run with the lesson's ``args`` but *without* setting
    ``model.loss_type``: what the Trainer reports for this model out of the box. ``trainer``, the
    lesson's, is freed first (its engine would hold memory twice)."""
    import dataclasses
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, Trainer, default_data_collator

    from helpers.lessons import zero2_training

    if trainer is not None:
        zero2_training.free_memory(trainer)
    one_step = dataclasses.replace(args, max_steps=1, output_dir=tempfile.mkdtemp(prefix="kit07_trainer_"))
    # use_kernels=False, as in the lesson: no Hub kernels fetched on a CUDA GPU (offline that fails)
    model = AutoModelForCausalLM.from_pretrained(model_name, dtype=torch.float32, use_kernels=False)
    probe = Trainer(model=model, args=one_step, train_dataset=dataset, data_collator=default_data_collator)
    probe.train()
    first = next((log["loss"] for log in probe.state.log_history if "loss" in log), None)
    zero2_training.free_memory(probe)
    return first


def trainer_count_claim(first_without: float | None, engine_first: float | None, expected_ratio: float,
                        precision: str) -> claims.Claim:
    """Without ``loss_type`` the Trainer's first loss is ``expected_ratio`` of the engine's: the
    reason the lesson sets it (a ratio of 1 when the model's class already names its loss)."""
    tol = tolerance(precision).first_step
    measured = (first_without / engine_first) if first_without is not None and engine_first else None
    shown = "not measured" if measured is None else f"{measured:.5f}"
    return (f"without model.loss_type the Trainer's first loss is {expected_ratio:.5f} of the engine's "
            f"(measured {shown})", claims.within(measured, expected_ratio, tol))


# ---- pictures and tables -------------------------------------------------------------------------


def table(losses: Mapping[str, Sequence[float]], reference: str = "engine") -> Table:
    """Per path: steps, first and last loss, the largest relative difference to the reference."""
    ref = list(losses.get(reference, []))
    rows = []
    for path, values in losses.items():
        values = list(values)
        worst = None if path == reference else largest_difference(values, ref)
        rows.append((path, len(values), f"{values[0]:.6f}" if values else "-",
                     f"{values[-1]:.6f}" if values else "-",
                     "(reference)" if path == reference else "-" if worst is None else f"{worst:.1e}"))
    return Table(["path", "steps", "first loss", "last loss", f"largest difference to {reference}"], rows,
                 title="One config, three ways")


def plot(losses: Mapping[str, Sequence[float]], precision: str, reference: str = "engine"):
    """Left: the loss curves of every path on one axis. Right: each path's relative difference to
    the reference per step, with the every-step tolerance as a line."""
    import matplotlib.pyplot as plt

    tol = tolerance(precision)
    styles = [dict(linestyle="-", marker="o", linewidth=3, alpha=0.5, color="C0"),
              dict(linestyle="--", marker="x", color="C1"), dict(linestyle=":", marker="+", markersize=10, color="C2")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    ref = list(losses.get(reference, []))
    worst = 0.0
    for i, (path, values) in enumerate(losses.items()):
        steps = range(1, len(values) + 1)
        left.plot(steps, list(values), label=path, **styles[i % len(styles)])
        if path != reference:
            distance = [claims.relative_difference(a, b) for a, b in zip(values, ref)]
            worst = max([worst, *[d for d in distance if math.isfinite(d)]])
            right.plot(range(1, len(distance) + 1), distance, label=path, **styles[i % len(styles)])
    left.set(xlabel="step", ylabel="loss", title="Training loss, same config three ways")
    left.legend(fontsize=8)
    right.axhline(tol.every_step, color="red", linestyle="--", linewidth=1,
                  label=f"tolerance {tol.every_step:g} ({precision})")
    right.set(xlabel="step", ylabel=f"|loss - {reference}| / {reference}", title=f"Distance to the {reference}")
    right.set_ylim(0, max(3 * tol.every_step, 1.2 * worst))
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def takeaways(losses: Mapping[str, Sequence[float]], precision: str, stage: int, save_at: int,
              resumed_ok: bool, zero2_diff: float, zero3_counts: tuple[int, int], zero3_diff: float,
              trainer_ratio: float | None, expected_ratio: float,
              held_out: tuple[float, float] | None = None,
              samples: tuple[str, str, str] | None = None) -> list[str]:
    """Five to seven sentences quoting this run's own figures: ``held_out`` is the held-out loss
    (before, after), ``samples`` the prompt and its continuations (before, after)."""
    ref = list(losses.get("engine", []))
    worst = max((largest_difference(v, ref) or 0.0) for p, v in losses.items() if p != "engine") if ref else math.nan
    firsts = ", ".join(f"{p} {v[0]:.4f}" for p, v in losses.items() if v)
    lasts = ", ".join(f"{p} {v[-1]:.4f}" for p, v in losses.items() if v)
    local, full = zero3_counts
    learned = []
    if held_out is not None:
        before, after = held_out
        learned.append(f"Fine-tuning moved the held-out loss (the same blocks, never trained on) from "
                       f"{before:.4f} to {after:.4f} ({'lower' if after < before else 'NOT lower'}).")
    if samples is not None:
        prompt, said_before, said_after = samples
        learned.append(f"{prompt!r} continued before training: {said_before!r}; after, from the "
                       f"reloaded folder: {said_after!r}.")
    return [*learned,
        f"One file, ds_config.json (ZeRO stage {stage}, {precision}), trained the same weights on the same "
        f"batches three ways: first losses {firsts}; last {lasts}; the paths were never more than "
        f"{worst:.1e} apart (relative).",
        "By hand you own the loop (engine.backward, engine.step) and the launcher's variables; Accelerate "
        "keeps a plain PyTorch loop and takes the optimizer and scheduler from the config through DummyOptim "
        "and DummyScheduler; the Trainer owns the loop and refuses a config whose numbers disagree with its "
        "arguments.",
        f"engine.save_checkpoint / load_checkpoint carry the optimizer and scheduler: a fresh engine resumed "
        f"at step {save_at + 1} with the same losses ({'yes' if resumed_ok else 'NO'}).",
        f"Under ZeRO-3 the module held {local:,} of {full:,} weights; DeepSpeed's zero_to_fp32 rebuilt "
        f"them into a from_pretrained folder (logit difference {zero3_diff:.1e}; {zero2_diff:.1e} for ZeRO-2).",
        trainer_sentence(trainer_ratio, expected_ratio),
    ]


def trainer_sentence(ratio: float | None, expected: float) -> str:
    """What the one-step Trainer run without ``model.loss_type`` showed (``ratio``: its first loss
    over the engine's), beside what the model's class predicts (``expected``), in a sentence."""
    if ratio is None:
        return "The Trainer's loss without model.loss_type was not measured."
    if expected == 1.0:
        return (f"Without model.loss_type the Trainer's first loss was {ratio:.5f} of the engine's: this "
                "model's class already names its causal-LM loss, so the line changes nothing here.")
    return (f"Without model.loss_type = \"ForCausalLM\" the Trainer's first loss read {100 * (1 - ratio):.2f}% "
            f"low (ratio {ratio:.5f}, predicted {expected:.5f}): for a class transformers does not map to "
            "its causal-LM loss, such as GPT-2's GPT2LMHeadModel, it counts every label of a row, the "
            "first one too.")


# ---- train.py: the lesson cells as the script a launcher starts -------------------------------------
#: The export, the launchers' commands and the reading of a launched run are helpers.launch's
#: (notebook 04 uses them too); the claims compare each launched run's engine losses with the
#: notebook's own.

#: This notebook, where the kit keeps it (on Colab too: the setup cell clones the repository).
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "07_engine_and_accelerate.ipynb"


def write_train_script(folder: str | os.PathLike, values: Mapping[str, object]) -> Path:
    """``folder``/train.py: this notebook's parameters cell, ``values``, its lesson cells as this
    kernel last ran them (a learner's edits included: helpers.launch.as_last_run)."""
    return launch.write_train_script(folder, values, NOTEBOOK)


def release_kernel_memory() -> tuple[int, int]:
    """Before the launches: the kernel's freed models and engines handed back to the operating
    system (garbage, cached GPU blocks, glibc's free heap; :func:`helpers.lessons.biggest_model.
    release_kernel_memory`), so that the launched ranks, each loading the model again, have the
    memory. Returns this kernel's RSS (bytes) before and after."""
    from helpers.lessons import biggest_model

    return biggest_model.release_kernel_memory()


def launched(launcher: str, returncode: int, log_file: str | os.PathLike,
             seconds: float) -> launch.Launched:
    """What one launch left: its exit code and the engine losses in its log. Its CPU ranks'
    all-reduce buffers, which DeepSpeed leaves in RAM, go (helpers.env.remove_ended_shm_buffers)."""
    kit_env.remove_ended_shm_buffers()
    return launch.launched(launcher, returncode, log_file, seconds, "engine")


def launch_claims(runs: Sequence[launch.Launched], engine_losses: Sequence[float],
                  precision: str) -> list[claims.Claim]:
    """Each able to fail: both launchers ran, each exited 0 and its engine printed the notebook's
    engine losses (the same script on the same data: within this precision's tolerances)."""
    return launch.launch_claims(
        runs, len(engine_losses),
        lambda label, losses: matches_claim(label, losses, engine_losses, precision))


def launch_table(runs: Sequence[launch.Launched]) -> Table:
    """One row per launcher: exit code, time, the engine's first and last loss."""
    return launch.launch_table(runs, "engine")
