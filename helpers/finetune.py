"""Notebook 06's fine-tune, watched: the learner's own cells load a pretrained model under ZeRO-3,
train it with ZeRO-Infinity's offload, evaluate, save and reload; this module only measures around
them (host RAM of the kernel, GPU memory, time), reads fp16 overflow, and holds the checks.

The fine-tune runs in the notebook's kernel, as it will in the learner's own notebook, so its host
RAM is the kernel's: sampled from before the weights load, through ``deepspeed.initialize`` and
every step, with the kernel's high-water mark (``getrusage``) read at the end where it rose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from helpers import claims, runner
from helpers import env as kit_env
from helpers.show import Table, GB, GiB

#: Reloaded 16-bit weights give the trained model's logits up to this much (fp32 runs: 1e-3).
RELOAD_TOL = {"fp32": 1e-3, "bf16": 0.1, "fp16": 5e-2}
#: More skipped optimizer steps than this share of the run is not fp16's normal start.
MAX_SKIPPED_SHARE = 0.5


@dataclass
class FinetuneRun:
    """What the watch saw: losses and step times from the learner's loop, memory from the kit."""

    losses: list[float]
    step_seconds: list[float]
    skipped_steps: int
    tokens_per_step: int
    wall_s: float
    peak_host_rss_bytes: int
    peak_gpu_allocated_bytes: int | None
    offload: str = ""  # where the engine put the optimizer's states, as DeepSpeed reports it
    trace: list[dict] = field(default_factory=list)

    @property
    def median_step_s(self) -> float:
        ordered = sorted(self.step_seconds)
        return ordered[len(ordered) // 2] if ordered else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.median_step_s if self.step_seconds else math.nan


class Watch:
    """Started before the model loads: the kernel's RSS is sampled from then on (and its
    high-water mark read at the end), GPU peak memory counted from zero."""

    def __init__(self) -> None:
        import torch

        self._trace = runner.PhaseTrace(interval_s=0.1)
        self._trace.enter("fine-tune")
        self._cuda = torch.cuda.is_available()
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()

    def stop(self, wall_s: float, losses: list[float], step_seconds: list[float], skipped_steps: int,
             tokens_per_step: int, engine=None) -> FinetuneRun:
        """The run as measured; ``losses`` and ``step_seconds`` come from the learner's loop, the
        offload device from ``engine`` (DeepSpeed's own reading of the config)."""
        import torch

        phases = self._trace.stop()  # its peak takes the kernel's high-water mark where it rose
        peak = max(p["peak_bytes"] for p in phases)
        gpu = torch.cuda.max_memory_allocated() if self._cuda else None
        return FinetuneRun(list(losses), list(step_seconds), int(skipped_steps), tokens_per_step,
                           wall_s, peak, gpu, offload_of(engine), phases)


def offload_of(engine) -> str:
    """The device DeepSpeed offloads the optimizer's states to ("nvme", "cpu", "none"), as the
    engine itself reads its config ("" without an engine)."""
    offload = engine.zero_offload_optimizer() if engine is not None else None
    device = getattr(offload, "device", None)
    return str(getattr(device, "value", device) or ("none" if engine is not None else ""))


def overflow_advice(run: FinetuneRun, precision: str, steps: int) -> str:
    """One line on fp16 overflow: how many optimizer steps were skipped, and what to do if many."""
    if precision != "fp16":
        return f"{precision}: no loss scaling, no step skipped for overflow."
    if run.skipped_steps <= MAX_SKIPPED_SHARE * steps:
        return (f"fp16: {run.skipped_steps} of {steps} optimizer steps skipped for overflow (the loss"
                " scale finding its level; a few at the start are normal).")
    return (f"fp16: {run.skipped_steps} of {steps} optimizer steps were skipped for overflow, so the"
            " model barely trained. Checkpoints trained in bf16 can overflow fp16: lower"
            " fp16.initial_scale_power (12 -> 8), lower LR, or pick a checkpoint trained in fp16;"
            " on a GPU of capability 8.0 or more, train in bf16.")


def run_table(run: FinetuneRun, environment: kit_env.Environment, eval_before: float,
              eval_after: float, offload: str) -> Table:
    """The fine-tune in one table: memory, time, throughput, held-out loss before and after."""
    gpu = "-" if run.peak_gpu_allocated_bytes is None else f"{run.peak_gpu_allocated_bytes / GiB:.2f} GiB"
    hours_per_m = 1e6 / run.tokens_per_s / 3600 if run.tokens_per_s > 0 else math.nan
    rows = [("offload (parameters and optimizer)", offload),
            ("peak GPU memory (allocated)", gpu),
            ("peak host RAM of this kernel", f"{run.peak_host_rss_bytes / GB:.2f} GB "
             f"(budget {environment.ram_budget_bytes / GB:.1f} GB)"),
            ("median seconds per optimizer step", f"{run.median_step_s:.2f}"),
            ("tokens per second", f"{run.tokens_per_s:,.0f}"),
            ("hours per million training tokens", f"{hours_per_m:.2f}"),
            ("steps skipped for fp16 overflow", str(run.skipped_steps)),
            ("held-out loss before / after", f"{eval_before:.4f} / {eval_after:.4f}")]
    return Table(["measured", "value"], rows, title="The fine-tune, as this run measured it")


def checks(run: FinetuneRun, eval_before: float, eval_after: float, logit_diff: float,
           precision: str, environment: kit_env.Environment) -> list[claims.Claim]:
    """The fine-tune's claims, each able to fail: the training loss falls (the shared rule), the
    held-out loss falls, most optimizer steps were taken (not skipped for overflow), the reloaded
    folder gives the trained logits, and host RAM stayed within the budget (GPU memory within the
    cap under T4 emulation)."""
    steps = len(run.losses)
    tol = RELOAD_TOL.get(precision, RELOAD_TOL["fp16"])
    out = [claims.loss_falls_claim("fine-tune", run.losses),
           (f"the held-out loss fell ({eval_before:.4f} -> {eval_after:.4f})",
            math.isfinite(eval_after) and eval_after < eval_before),
           (f"at most {MAX_SKIPPED_SHARE:.0%} of the {steps} optimizer steps skipped for fp16 overflow"
            f" ({run.skipped_steps})", steps > 0 and run.skipped_steps <= MAX_SKIPPED_SHARE * steps),
           (f"the reloaded folder gives the trained model's logits (within {tol:g})",
            math.isfinite(logit_diff) and logit_diff <= tol),
           (f"peak host RAM of the kernel within the {environment.ram_budget_bytes / GB:.1f} GB budget",
            0 < run.peak_host_rss_bytes <= environment.ram_budget_bytes)]
    emulated = environment.emulation
    if environment.has_gpu and emulated is not None:
        out.append((f"peak GPU memory within {emulated.gpu_bytes / GiB:.1f} GiB (T4 emulation)",
                    0 < (run.peak_gpu_allocated_bytes or 0) <= emulated.gpu_bytes))
    return out


def takeaways(run: FinetuneRun, eval_before: float, eval_after: float, logit_diff: float,
              info, offload: str) -> list[str]:
    """The fine-tune's summary lines, each figure from this run."""
    gpu = ("" if run.peak_gpu_allocated_bytes is None
           else f"{run.peak_gpu_allocated_bytes / GiB:.2f} GiB of GPU, ")
    size = (f"{info.n_params / 1e9:.2f}B" if info.n_params >= 1e9 else f"{info.n_params / 1e6:,.1f}M")
    return [f"Fine-tuned {size} parameters (every one, full Adam) with ZeRO-3 and"
            f" {offload} offload: {gpu}{run.peak_host_rss_bytes / GB:.1f} GB of host RAM at the"
            f" kernel's peak, {run.median_step_s:.1f} s per optimizer step"
            f" ({run.tokens_per_s:,.0f} tokens/s).",
            f"Held-out loss {eval_before:.3f} -> {eval_after:.3f}; the saved 16-bit folder reloads"
            f" with logits within {logit_diff:.1e} of the trained model's.",
            f"1,000 such steps would take about {1000 * run.median_step_s / 3600:.1f} hours at this"
            " pace: the disk's bandwidth sets it, and gradient accumulation spreads each step's"
            " NVMe traffic over more tokens."]


def summary(run: FinetuneRun, nvme_ready: bool, claims_held: list[claims.Claim]) -> str:
    """Facts that read the same on a CPU and on a T4 (notebook 06's checked output)."""
    expected = "nvme" if nvme_ready else "cpu"
    return "\n".join([
        "the engine offloaded the optimizer to NVMe where libaio is ready, else to the CPU: "
        f"{run.offload == expected}",
        f"fine-tune checks held: {claims.every(held for _, held in claims_held)}",
    ])
