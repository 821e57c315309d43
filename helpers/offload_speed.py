"""Make CPU offload faster (notebook 05's last section): plain ZeRO-2 CPU offload against
DeepSpeed's partial offload, which takes work off the CPU, on the same model, data and seed, each run in its
own subprocess through helpers.runner:

- **partial offload** (ZeRO-3, ``offload_optimizer.ratio``): only that fraction of the optimizer
  states and of Adam's step goes to the CPU; the rest stays on the GPU, where it costs GPU memory.
  In DeepSpeed 0.19.8 the GPU's share ignores the learning-rate schedule (it trains at the peak
  rate from step 1; measured: losses part from plain's at step 2, 8.59 against 8.23 at GPT-2 124M):
  helpers.deepspeed_fixes.fix_partial_offload_schedule, which helpers.runner applies, mends it;

ZenFlow is not among the variants: in DeepSpeed 0.19.8 it scrambles every 2-D weight at
``deepspeed.initialize`` (its flatten stores matrices transposed, ``_update_model_bit16_weights``
views them untransposed; GPT-2 tiny's first loss 10.8408 -> 10.8330 with the same weights), which
the first-loss check caught. README: where DeepSpeed falls short.

A variant that fails here (a feature that needs bf16 or a newer GPU, say) is a row with its error,
not a crash: the table says what DeepSpeed said.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from helpers import claims, config, matrix, memory, runner, show
from helpers import env as kit_env
from helpers.show import Table, GiB

PLAIN = "ZeRO-2 + CPU offload"
#: The fraction of the optimizer that partial offload leaves on the CPU (the rest is on the GPU).
PARTIAL_RATIO = 0.3

#: (name, config.build choices, keys added under zero_optimization): the variants, plain first.
VARIANTS: list[tuple[str, dict, dict]] = [
    (PLAIN, {"stage": 2, "offload_optimizer": "cpu"}, {}),
    ("ZeRO-3 + CPU offload", {"stage": 3, "offload_optimizer": "cpu"}, {}),
    (f"ZeRO-3 + partial offload (ratio {PARTIAL_RATIO:g})", {"stage": 3, "offload_optimizer": "cpu"},
     {"offload_optimizer": {"ratio": PARTIAL_RATIO}}),
]


@dataclass
class Variant:
    """One (model size, variant) run."""

    shape: str
    name: str
    result: runner.RunResult
    n_params: int


def variant_config(name: str, model: memory.ModelInfo, environment: kit_env.Environment,
                   micro_batch: int, steps: int) -> dict:
    """The engine config of one variant: config.build's choices, the variant's keys merged under
    ``zero_optimization``, the learning rate and warmup of the model's size."""
    choice, extra = next((c, e) for n, c, e in VARIANTS if n == name)
    ds = config.build(**choice, micro_batch=micro_batch, trainer=False, environment=environment,
                      pin_memory=False, lr=config.learning_rate_for(model.n_params),
                      warmup_steps=max(1, steps), initial_scale_power=config.SHORT_RUN_SCALE_POWER)
    zero = ds["zero_optimization"]
    for key, value in copy.deepcopy(extra).items():
        zero[key] = {**zero.get(key, {}), **value} if isinstance(value, dict) else value
    return ds


def run_variants(shapes: list[str], environment: kit_env.Environment, micro_batch: int, seq_len: int,
                 steps: int, progress: bool = True) -> list[Variant]:
    """Every variant at every size, each in a fresh subprocess (same seed and data)."""
    from tqdm.auto import tqdm

    out = []
    todo = [(shape, name) for shape in shapes for name, _, _ in VARIANTS]
    for shape, name in tqdm(todo, desc="offload variants", disable=not progress):
        info = memory.ModelInfo.for_shape(shape)
        ds = variant_config(name, info, environment, micro_batch, steps)
        spec = runner.RunSpec(ds_config=ds, shape=shape, seq_len=seq_len, micro_batch=micro_batch,
                             steps=steps, grad_ckpt=True, label=f"{shape} {name}")
        out.append(Variant(shape, name, runner.measure(spec), info.n_params))
    return out


def _plain(variants: list[Variant], shape: str) -> runner.RunResult | None:
    return next((v.result for v in variants if v.shape == shape and v.name == PLAIN
                 and v.result.status == runner.OK), None)


def speedup(variant: Variant, variants: list[Variant]) -> float | None:
    """Plain CPU offload's step time over this variant's, at the same size (None: one did not run)."""
    plain = _plain(variants, variant.shape)
    mine = variant.result.median_step_s if variant.result.status == runner.OK else None
    return plain.median_step_s / mine if plain and plain.median_step_s and mine else None


def table(variants: list[Variant], environment: kit_env.Environment) -> Table:
    """Every variant: status (with DeepSpeed's error where it failed), step time and speed-up over
    plain CPU offload, peaks, losses and the last loss against plain's."""
    rows = []
    for v in variants:
        r, plain = v.result, _plain(variants, v.shape)
        up = speedup(v, variants)
        gap = (f"{r.losses[-1] - plain.losses[-1]:+.3f}" if plain and plain.losses and r.losses
               and r.status == runner.OK else "-")
        rows.append((v.shape, v.name, show.status_cell(r.status, r.message, runner.OK, 70),
                     show.seconds(r.median_step_s), "-" if up is None else f"{up:.2f}x",
                     show.gib(r.peak_gpu_allocated_bytes), show.gib(r.peak_host_rss_bytes or None),
                     show.loss_cell(r.losses), gap))
    return Table(["model", "variant", "status", "s/step", "speed-up", "GPU GiB", "host RSS GiB", "loss",
                  "last loss vs plain"], rows, title=f"Faster offload, {environment.measured_on()}")


def checks(variants: list[Variant], environment: kit_env.Environment) -> list[claims.Claim]:
    """Each able to fail: plain CPU offload ran at every size (the baseline); every variant ran or
    shows DeepSpeed's error; at least one other variant ran beside plain somewhere (an empty
    comparison fails); each one that ran trained as plain did (same model, data and seed: the first
    loss equal, every loss within the matrix's tolerance; partial offload needs
    helpers.deepspeed_fixes for that) and ended finite."""
    shapes = list(dict.fromkeys(v.shape for v in variants))
    first_tol, all_tol = matrix.loss_tolerance(environment)
    ran = [v for v in variants if v.name != PLAIN and v.result.status == runner.OK]
    out = [(f"plain CPU offload ran at every size ({', '.join(shapes)})",
            bool(shapes) and claims.every(_plain(variants, s) is not None for s in shapes)),
           ("every variant ran, or its row shows the error DeepSpeed gave",
            claims.every(v.result.status == runner.OK or bool(v.result.message) for v in variants)),
           (f"at least one faster-offload variant ran beside plain ({len(ran)} runs)", bool(ran))]
    for v in ran:
        plain = _plain(variants, v.shape)
        out.append((f"{v.shape} {v.name}: losses match plain's (first within {first_tol:g}, all within "
                    f"{all_tol:g}), last loss finite" + (matrix.skipped_note(plain, v.result) if plain else ""),
                    bool(plain) and matrix.losses_match(plain.losses, v.result.losses, first_tol, all_tol)
                    and math.isfinite(v.result.losses[-1])))
    return out


def winners(variants: list[Variant]) -> dict[str, Variant | None]:
    """The fastest variant that ran, per size (None where none ran)."""
    best: dict[str, Variant | None] = {}
    for v in variants:
        best.setdefault(v.shape, None)
        fast = v.result.status == runner.OK and v.result.median_step_s
        if fast and (best[v.shape] is None or v.result.median_step_s < best[v.shape].result.median_step_s):
            best[v.shape] = v
    return best


def takeaways(variants: list[Variant], environment: kit_env.Environment) -> list[str]:
    """The winner per size, with its figures, and each variant that failed with its error."""
    lines = []
    for shape, v in winners(variants).items():
        if v is None:
            lines.append(f"{shape}: no offload variant ran.")
            continue
        up = speedup(v, variants)
        gpu = (f", {v.result.peak_gpu_allocated_bytes / GiB:.2f} GiB GPU"
               if environment.has_gpu and v.result.peak_gpu_allocated_bytes else "")
        lines.append(f"{shape}: fastest was {v.name} at {v.result.median_step_s:.2f} s/step"
                     + (f" ({up:.2f}x plain CPU offload)" if up else "") + gpu
                     + f", {v.result.peak_host_rss_bytes / GiB:.1f} GiB host RSS.")
    for v in variants:
        if v.result.status != runner.OK:
            lines.append(f"{v.shape} {v.name}: {v.result.status}: {v.result.message[:160]}")
    return lines
