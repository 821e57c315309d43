"""Notebook 04, ZeRO-2 training: the Hugging Face Trainer and DeepSpeed inside a notebook (no
launcher), with a callback that records every step, saving in Hugging Face format, reloading, and
resuming; train.py, the lesson cells under the deepspeed launcher and ``accelerate launch``; and
what each ZeRO stage partitions, drawn for your model (the last section).
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from helpers import claims, config, launch, memory, show
from helpers import env as kit_env
from helpers.show import Table, GiB

#: What the lesson's out-of-memory advice must name: the setting to lower and the one that keeps
#: the batch (notebook 04's train_or_advise).
OOM_ADVICE_NAMES = ("per_device_train_batch_size", "gradient_accumulation_steps")
#: Largest logit difference allowed between the trained model and its reload from disk.
#: How far a reloaded model's logits may stray from the trained one's, relative to the largest
#: |logit| (claims.relative_logit_difference): fp32 on a CPU gave 0.0; half precision rounds.
RELOAD_TOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 2e-2}


def _trainer_callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class MetricsCallback(_trainer_callback_base()):
    """Per optimizer step: loss, learning rate, fp16 loss scale, skipped (overflow) steps, tokens/s,
    GPU memory allocated / reserved / peak, host RSS of this process."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.records: list[dict] = []
        self.trainer = None
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        import psutil
        import torch

        seconds = time.perf_counter() - self._start
        engine = getattr(self.trainer, "deepspeed", None) if self.trainer else None
        scale = getattr(getattr(engine, "optimizer", None), "loss_scale", None)
        record = {"step": state.global_step, "seconds": seconds, "tokens_per_s": self.tokens_per_step / seconds,
                  "loss_scale": float(scale) if isinstance(scale, (int, float)) else None,
                  "skipped_steps": int(getattr(engine, "skipped_steps", 0) or 0),
                  "host_rss_bytes": psutil.Process().memory_info().rss}
        if torch.cuda.is_available():
            record.update(gpu_allocated_bytes=torch.cuda.memory_allocated(), gpu_reserved_bytes=torch.cuda.memory_reserved(),
                          gpu_peak_bytes=torch.cuda.max_memory_allocated())
        self.records.append(record)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs and self.records and self.records[-1]["step"] == state.global_step:
            self.records[-1]["loss"] = float(logs["loss"])
            self.records[-1]["lr"] = float(logs.get("learning_rate", 0.0))


class SimulatedOutOfMemory(_trainer_callback_base()):
    """Raises CUDA's out-of-memory error at the first step: what a micro batch past the GPU does,
    for a machine without GPU memory to run out of (notebook 04's demonstration on a CPU)."""

    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB "
                                          "(simulated: no GPU here)")


@dataclass
class TrainRun:
    """What a training run produced: its status, the callback's records, the trainer (when ok)."""

    status: str  # "ok", "out of GPU memory" or "error"
    message: str = ""
    records: list[dict] = field(default_factory=list)
    trainer: object = None
    seconds: float = 0.0
    micro_batch: int = 0

    def losses(self) -> list[float]:
        return [r["loss"] for r in self.records if "loss" in r]

    def skipped_steps(self) -> int:
        """Optimizer steps skipped for fp16 overflow by the end of the run."""
        return int(self.records[-1].get("skipped_steps", 0)) if self.records else 0

    def losses_by_step(self) -> dict[int, float]:
        """{step: loss} of the steps this run trained (a resumed run starts after its checkpoint)."""
        return {r["step"]: r["loss"] for r in self.records if "loss" in r}


def free_memory(trainer=None) -> None:
    """Drop a trainer's DeepSpeed engine and give cached GPU memory back (a ZeRO-3 engine's too:
    the kit's fix for ``destroy()``, which DeepSpeed 0.19.8 leaves holding it, goes in first, as
    the kit's own: a lesson's check still asks whether the lesson installed it)."""
    import torch

    from helpers import deepspeed_fixes

    deepspeed_fixes.install_for_kit(deepspeed_fixes.fix_engine_destroy_frees_memory)
    if trainer is not None:
        engine = getattr(trainer, "deepspeed", None)
        if engine is not None and hasattr(engine, "destroy"):
            try:
                engine.destroy()
            except Exception:
                pass
        for attr in ("deepspeed", "model_wrapped", "optimizer", "lr_scheduler"):
            if hasattr(trainer, attr):
                setattr(trainer, attr, None)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def watch(trainer, tokens_per_step: int) -> MetricsCallback:
    """Attach the kit's metrics callback to a Trainer the notebook built (before ``train()``)."""
    callback = MetricsCallback(tokens_per_step)
    callback.trainer = trainer
    trainer.add_callback(callback)
    return callback


def run_of(trainer, callback: MetricsCallback, seconds: float, micro_batch: int) -> TrainRun:
    """The :class:`TrainRun` of a Trainer the notebook trained itself, from the callback's records."""
    return TrainRun("ok", "", callback.records, trainer, seconds, micro_batch)


def logged_losses(trainer) -> dict[int, float]:
    """{step: loss} from a Trainer's own log (``trainer.state.log_history``). After a resume it also
    holds the steps restored from the checkpoint: use the resumed run's own records for those."""
    return {int(e["step"]): float(e["loss"]) for e in trainer.state.log_history if "loss" in e}


def resumed_like(first: dict[int, float], resumed: dict[int, float], checkpoint_step: int,
                 rtol: float) -> tuple[bool, bool]:
    """(the resumed run's first logged step is the one after the checkpoint, every loss it logged
    matches the uninterrupted run's at the same step within ``rtol``)."""
    if not resumed:
        return False, False
    shared = [step for step in resumed if step in first]
    same = claims.every(claims.within(resumed[s], first[s], rtol) for s in shared)
    return min(resumed) == checkpoint_step + 1, same


def logit_difference(model, other, batch) -> float:
    """The largest logit difference between two models on ``batch`` (on ``model``'s device and
    dtype), relative to ``model``'s largest |logit| (claims.relative_logit_difference)."""
    import torch

    param = next(model.parameters())
    other = other.to(device=param.device, dtype=param.dtype)
    model.eval()
    other.eval()
    with torch.no_grad():
        batch = batch.to(param.device)
        a, b = model(input_ids=batch).logits.float(), other(input_ids=batch).logits.float()
    model.train()
    return claims.relative_logit_difference(a, b)


def takeaways(run: TrainRun, environment: kit_env.Environment, logit_diff: float, resumed_at: bool,
              advice: str, config_name: str, held_out: tuple[float, float]) -> list[str]:
    """Notebook 04's summary: what this run showed, each figure from the run itself; ``advice`` is
    what the out-of-memory demonstration returned, ``held_out`` the held-out loss (before, after)."""
    losses = run.losses()
    recs = run.records
    timed = sorted(r["tokens_per_s"] for r in recs[1:]) or [0.0]
    peak_gpu = max((r.get("gpu_peak_bytes", 0) for r in recs), default=0)
    peak_rss = max((r["host_rss_bytes"] for r in recs), default=0)
    cap = kit_env.EMULATIONS["t4"].gpu_cap_bytes / GiB
    where = (f"peak GPU memory {peak_gpu / GiB:.2f} GiB of the {cap:.2f} GiB PyTorch has on a T4" if environment.has_gpu
             else "no GPU here: the CPU trained in fp32")
    simulated = "" if environment.has_gpu else " (simulated: no GPU here)"
    return [
        f"{config_name} through the Trainer: {len(losses)} steps, loss {losses[0]:.2f} -> {losses[-1]:.2f} "
        f"(lowest {min(losses):.2f}), {timed[len(timed) // 2]:,.0f} tokens/s, {environment.precision}; "
        f"held-out loss {held_out[0]:.3f} -> {held_out[1]:.3f}.",
        f"Memory: {where}; host RSS of this kernel {peak_rss / GiB:.2f} GiB of the "
        f"{show.in_gib(kit_env.EMULATIONS['t4'].notebook_ram_bytes, True)} a free Colab leaves it.",
        f"trainer.save_model + from_pretrained gave the same logits (largest difference {logit_diff:.1e}).",
        f"resume_from_checkpoint continued at the next step: {resumed_at}.",
        f"Out of GPU memory{simulated} came back as advice, not a crash: {show.clip(advice, 90)}.",
    ]


def summary_table(run: TrainRun, environment: kit_env.Environment) -> Table:
    """Steps, tokens/s, peak GPU against the T4's cap, peak host RSS against what free Colab leaves
    the kernel (12.7 GB less the VM's own use), time."""
    t4 = kit_env.EMULATIONS["t4"]
    recs = run.records
    timed = [r["tokens_per_s"] for r in recs[1:]] or [r["tokens_per_s"] for r in recs]
    peak_gpu = max((r.get("gpu_peak_bytes", 0) for r in recs), default=0)
    peak_rss = max((r["host_rss_bytes"] for r in recs), default=0)
    rows = [("steps", len(recs), ""),
            ("tokens/s (median)", f"{sorted(timed)[len(timed) // 2]:,.0f}" if timed else "-", "first step left out"),
            ("peak GPU memory", f"{peak_gpu / GiB:.2f} GiB" if environment.has_gpu else "-",
             f"of the {t4.gpu_cap_bytes / GiB:.2f} GiB PyTorch has on a T4" if environment.has_gpu else "no GPU"),
            ("peak host RSS of this kernel", f"{peak_rss / GiB:.2f} GiB",
             f"of the {show.in_gib(t4.notebook_ram_bytes, True)} free Colab leaves it"),
            ("skipped (overflow) steps", recs[-1]["skipped_steps"] if recs else 0, "fp16 loss scaling backs off"),
            ("time", f"{run.seconds:.1f} s", "")]
    return Table(["what", "value", "against"], rows, title=f"Training run, {environment.measured_on()}")


def plot(run: TrainRun):
    """The loss curve and, in fp16, the loss-scale curve."""
    import matplotlib.pyplot as plt

    scales = [r.get("loss_scale") for r in run.records]
    has_scale = any(s not in (None, 1.0) for s in scales)
    fig, axes = plt.subplots(1, 2 if has_scale else 1, figsize=(10 if has_scale else 6, 3.4))
    axes = list(axes) if has_scale else [axes]
    axes[0].plot([r["step"] for r in run.records if "loss" in r], run.losses())
    axes[0].set(xlabel="step", ylabel="loss", title="Training loss")
    if has_scale:
        axes[1].semilogy([r["step"] for r in run.records], scales)
        axes[1].set(xlabel="step", ylabel="loss scale", title="fp16 dynamic loss scale")
    fig.tight_layout()
    return fig


def reload_tolerance(precision: str | None) -> float:
    """:data:`RELOAD_TOL` of a precision (fp32 where none is given)."""
    return RELOAD_TOL.get(precision or "fp32", RELOAD_TOL["fp16"])


def reload_claim(logit_diff: float, precision: str | None) -> claims.Claim:
    """The reloaded model gives the trained one's logits, within :func:`reload_tolerance`."""
    tol = reload_tolerance(precision)
    return (f"the reloaded model gives the same logits: relative difference {logit_diff:.1e} <= {tol:g}",
            math.isfinite(logit_diff) and logit_diff <= tol)


def oom_claim(advice: str) -> claims.Claim:
    """Out of GPU memory came back as advice naming the settings to change (a run that trained,
    or advice naming neither, fails)."""
    return ("out of GPU memory was reported with advice",
            advice.startswith("out of GPU memory") and all(n in advice for n in OOM_ADVICE_NAMES))


def checks(run: TrainRun, logit_diff: float, resume: tuple[bool, bool], advice: str,
           environment: kit_env.Environment, held_out: tuple[float, float],
           vocab: int) -> list[claims.Claim]:
    """The claims notebook 04 asserts, each (claim, held); each can fail on a bad run. ``held_out``
    is the held-out loss (before, after) training; ``vocab`` the tokenizer's size."""
    losses = run.losses()
    before, after = held_out
    pretrained = claims.pretrained_start(before, vocab)
    out = [("training ran", run.status == "ok")]
    if pretrained:  # a fresh model (MODEL_NAME = None) has no pretrained start to claim
        out.append(claims.pretrained_claim(before, vocab))
    return out + [
        claims.training_loss_claim("training", losses, pretrained),
        claims.held_out_claim(before, after),
        claims.skipped_claim(run.skipped_steps(), len(losses)),
        reload_claim(logit_diff, environment.precision),
        ("resume continued at the next step", resume[0]),
        ("resume reproduced the losses", resume[1]),
        oom_claim(advice),
    ]


# ---- train.py: the lesson cells as the script a launcher starts ---------------------------------
#: The export, the commands and the reading of a launched run are helpers.launch's (notebook 07's
#: too). One process trains on the notebook's batches: its losses are the notebook's. Under N ranks
#: the Trainer gives each rank its own share of the blocks (a DistributedSampler) and averages the
#: ranks' losses: another run, which must still train (the kit's falling-loss rule).

#: This notebook, where the kit keeps it (on Colab too: the setup cell clones the repository).
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "04_zero2_training.ipynb"


def write_train_script(folder: str | os.PathLike, values: Mapping[str, object]) -> Path:
    """``folder``/train.py: this notebook's parameters cell, ``values``, its lesson cells as this
    kernel last ran them (a learner's edits included: helpers.launch.as_last_run)."""
    return launch.write_train_script(folder, values, NOTEBOOK)


def launched(launcher: str, returncode: int, log_file: str | os.PathLike,
             seconds: float) -> launch.Launched:
    """What one launch left: its exit code and the Trainer losses in its log. Its CPU ranks'
    all-reduce buffers, which DeepSpeed leaves in RAM, go (helpers.env.remove_ended_shm_buffers)."""
    kit_env.remove_ended_shm_buffers()
    return launch.launched(launcher, returncode, log_file, seconds, "trainer")


def launch_tolerance(precision: str) -> float:
    """Relative tolerance between two runs of one Trainer on the same batches (the resume's)."""
    return 1e-3 if precision == "fp32" else 2e-2


#: One launched process against the notebook's run in fp16 or bf16: the same first loss (same
#: weights, same batch) within this, and the mean of the last third within :data:`LAUNCH_END_RTOL`.
#: Not every step: over 150 half-precision steps two runs of one script part by more than rounding
#: (a skipped step moves the rest), as notebook 07's engine runs allow 5% a step.
LAUNCH_FIRST_RTOL, LAUNCH_END_RTOL = 1e-3, 0.05


def _mean_of_last_third(losses: Sequence[float]) -> float:
    third = max(1, len(losses) // 3)
    return sum(losses[-third:]) / third


def launch_claims(runs: Sequence[launch.Launched], first_losses: dict[int, float], precision: str,
                  processes: int, pretrained: bool = False) -> list[claims.Claim]:
    """Each able to fail: both launchers ran and exited 0 with ``len(first_losses)`` losses; one
    process: in fp32 the notebook's losses step by step within :func:`launch_tolerance`, in fp16
    or bf16 its first loss within :data:`LAUNCH_FIRST_RTOL` and the mean of its last third within
    :data:`LAUNCH_END_RTOL`, with a loss that falls; more ranks: a loss that falls by the kit's
    rule. From a ``pretrained`` start "falls" is :func:`helpers.claims.training_loss_claim`'s
    (finite losses: batch noise outweighs a few steps' gain there)."""
    reference = [first_losses[step] for step in sorted(first_losses)]
    tol = launch_tolerance(precision)

    def matches(label: str, losses: list[float]) -> claims.Claim:
        trains = claims.training_loss_claim(label, losses, pretrained)
        if processes > 1:
            return (f"{label} on {processes} ranks (each its own share of the blocks): "
                    + trains[0], trains[1])
        if not losses or not reference:
            return f"{label}: no losses to compare with the notebook's", False
        if precision == "fp32":
            pairs = list(zip(losses, reference))
            worst = max(claims.relative_difference(a, b) for a, b in pairs)
            return (f"{label}: the notebook's Trainer losses within {tol:g} (largest difference "
                    f"{worst:.1e})", claims.every(claims.within(a, b, tol) for a, b in pairs))
        end, end_ref = _mean_of_last_third(losses), _mean_of_last_third(reference)
        return (f"{label}: the notebook's first loss within {LAUNCH_FIRST_RTOL:g} ({losses[0]:.4f} "
                f"vs {reference[0]:.4f}) and its last third within {LAUNCH_END_RTOL:.0%} "
                f"({end:.4f} vs {end_ref:.4f}), a falling loss",
                claims.within(losses[0], reference[0], LAUNCH_FIRST_RTOL)
                and claims.within(end, end_ref, LAUNCH_END_RTOL) and trains[1])

    return launch.launch_claims(runs, len(reference), matches)


def launch_table(runs: Sequence[launch.Launched]) -> Table:
    """One row per launcher: exit code, time, the Trainer's first and last loss."""
    return launch.launch_table(runs, "Trainer")


# ---- what each ZeRO stage partitions, drawn for your model ---------------------------------------
#: What ZeRO partitions, drawn before anything trains: for one model and N ranks, the bytes each
#: GPU holds of parameters, gradients and optimizer states under stages 0-3, and what offload moves
#: to host RAM or NVMe. The numbers come from the kit's own estimator (helpers.memory.estimate),
#: model states only (activations are the same for every stage and are left out here).


STATE_KINDS = ("params", "grads", "optimizer")


def model_states(model: memory.ModelInfo, world_size: int) -> dict[str, dict[str, dict[str, int]]]:
    """{config: {place: {kind: bytes}}} for parameters, gradients and optimizer states per rank."""
    out = {}
    for label, choice in config.STAGE_ROWS:
        ds = config.for_row(choice, model, None, 1, world_size, precision="fp16", pin_memory=False,
                               nvme_path="/tmp/zero_kit_offload")
        est = memory.estimate(model, ds, world_size=world_size, micro_batch=1, seq_len=1, grad_ckpt=True,
                              zero_init=choice["stage"] == 3)
        out[label] = {place: {k: est.parts.get(place, {}).get(k, 0) for k in STATE_KINDS}
                      for place in ("gpu", "cpu", "nvme")}
    return out


def states_table(model: memory.ModelInfo, world_size: int) -> Table:
    """Bytes per parameter each rank keeps on its GPU, and what goes to host RAM and NVMe."""
    rows = []
    for label, places in model_states(model, world_size).items():
        per = lambda place: sum(places[place].values()) / model.n_params
        rows.append((label, *(f"{places['gpu'][k] / model.n_params:.1f}" for k in STATE_KINDS), f"{per('gpu'):.1f}",
                     f"{per('gpu') * model.n_params / GiB:.2f}", f"{per('cpu'):.1f}", f"{per('nvme'):.1f}"))
    return Table(["config", "params B/param", "grads B/param", "optimizer B/param", "GPU B/param",
                  "GPU GiB per rank", "host B/param", "NVMe B/param"], rows,
                 title=f"Model states of {model.name or 'this model'} ({model.n_params / 1e6:,.0f}M parameters) "
                       f"per rank, {world_size} ranks, mixed precision")


def states_figure(model: memory.ModelInfo, world_size: int):
    """Stacked bars: per rank on the GPU (parameters, gradients, optimizer states), and off it."""
    import matplotlib.pyplot as plt

    states = model_states(model, world_size)
    labels = list(states)
    fig, (gpu_ax, off_ax) = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
    colours = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green"}
    for ax, places, title in ((gpu_ax, ("gpu",), f"on each GPU ({world_size} ranks)"),
                              (off_ax, ("cpu", "nvme"), "moved off the GPU (host RAM + NVMe)")):
        left = [0.0] * len(labels)
        for kind in STATE_KINDS:
            widths = [sum(states[c][p][kind] for p in places) / GiB for c in labels]
            ax.barh(labels, widths, left=left, color=colours[kind], label=kind)
            left = [a + b for a, b in zip(left, widths)]
        for i, total in enumerate(left):
            ax.text(total, i, f" {total:.2f} GiB ({total * GiB / model.n_params:.1f} B/param)", va="center",
                    fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("GiB")
        ax.set_xlim(0, max(max(left) * 1.6, 0.01))
    gpu_ax.invert_yaxis()
    gpu_ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"What ZeRO partitions: {model.name or 'the model'}, {model.n_params / 1e6:,.0f}M parameters, "
                 "fp16 weights + fp32 Adam (16 bytes per parameter in all)")
    fig.tight_layout()
    return fig
