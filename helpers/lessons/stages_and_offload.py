"""Notebook 05, stages and offload side by side: the stage and offload rows (the configs the
notebook's lesson cell writes, each run in its own subprocess by helpers.runner.run_matrix and
predicted by helpers.memory) in figures, the claims ZeRO makes checked, ZeRO's fractions with 2 ranks, and
the faster CPU offload variants (the last section). ``python -m helpers matrix`` runs the rows
from a terminal:

    python -m helpers matrix --world-size 2 --shape gpt2-355m --micro-batch 4 --seq-len 512 --grad-ckpt
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass


from helpers import claims, config, memory, runner, show, taught
from helpers import env as kit_env
from helpers.show import Table, GiB

def plot(rows: list[runner.Row], environment: kit_env.Environment):
    """Four figures: GPU memory against the T4's cap, host RAM against a run's share of Colab's, seconds per
    step, loss curves."""


    labels = [r.label for r in rows]
    budget = (environment.ram_budget_bytes if environment.emulation
              else kit_env.EMULATIONS["t4"].ram_budget_bytes)
    figures = []
    if environment.has_gpu:
        figures.append(show.memory_bars(
            labels, [(r.result.peak_gpu_allocated_bytes or 0) / GiB or None for r in rows],
            [r.estimate.total("gpu") / GiB if r.estimate else None for r in rows],
            (environment.gpu_cap_bytes or environment.vram_total_bytes) / GiB, "Peak GPU memory",
            "this GPU's limit" if not environment.emulation
            else f"{environment.gpu_cap_bytes / GiB:.2f} GiB PyTorch has on a T4"))
    figures.append(show.memory_bars(
        labels, [(r.result.peak_host_rss_bytes or 0) / GiB or None for r in rows],
        [r.estimate.total("cpu") / GiB if r.estimate else None for r in rows],
        budget / GiB, "Peak host RAM (RSS of the run's processes)",
        f"a run's share of free Colab: {budget / GiB:.1f} GiB"))
    figures.append(show.step_times(labels, [r.result.median_step_s for r in rows],
                                    "Seconds per step (median, first step left out)"))
    figures.append(show.loss_curves({r.label: r.result.losses for r in rows if r.result.losses},
                                     "Same model, data and seed: the loss per step of every config"))
    return figures


def loss_tolerance(environment: kit_env.Environment) -> tuple[float, float]:
    """(first-step, every-step) relative tolerance for losses against stage 0.

    fp32 on the CPU: ZeRO is exact, so 1e-4 everywhere. fp16 on a GPU: the first forward is the
    same (1e-3), later steps drift apart through dynamic loss scaling (a step skipped by one run and
    not the other) and different optimizer kernels, so 10%. (Without helpers.deepspeed_fixes stage 0's
    FP16 optimizer also trains with an unscaled loss and Adam's count one step ahead.)
    """
    return (1e-4, 1e-4) if environment.precision == "fp32" else (1e-3, 0.10)


#: The rows the checks compare, by what each config asks for (its stage and offload devices, as
#: config.row_choice reads them), not by the label a lesson gives it: a renamed row is checked too.
#: Named as the lesson's ``zero_rows`` names them (config.STAGE_ROWS reads them from it).
KINDS: dict[str, dict] = dict(config.STAGE_ROWS)


def of_kind(rows: list[runner.Row], kind: str, ran: bool = True) -> runner.Row | None:
    """The first row whose config is ``kind`` (a label of :data:`KINDS`); with ``ran``, only a row
    that ran."""
    return next((r for r in rows if r.choice == KINDS[kind]
                 and (not ran or r.result.status == runner.OK)), None)


def losses_match(base: list[float], other: list[float], first_tol: float, all_tol: float) -> bool:
    """Same number of steps, the first loss within ``first_tol`` and every loss within ``all_tol``."""
    return (bool(base) and len(base) == len(other) and claims.within(other[0], base[0], first_tol)
            and claims.every(claims.within(b, a, all_tol) for a, b in zip(base, other)))


def skipped_note(base: runner.RunResult, other: runner.RunResult) -> str:
    """Where two runs skipped different numbers of steps for fp16 overflow, a clause saying so (their
    losses part at the first skip: a skipped step changes no weight); else empty."""
    a, b = base.skipped_steps or 0, other.skipped_steps or 0
    return "" if a == b else (f"; {other.label} skipped {b} step(s) for fp16 overflow, {base.label} {a}: "
                              "lower fp16's initial_scale_power")


def checks(rows: list[runner.Row], environment: kit_env.Environment, nvme_ready: bool,
           gpu_rtol: float = 0.15, model: str = "") -> list[claims.Claim]:
    """The claims notebook 05 asserts, each (claim, held). Each can fail on a bad run: stage 0 must
    run, at least one offload row must run, NVMe must run where libaio is ready, and at least two
    ZeRO rows must have losses to compare with stage 0 (an empty comparison fails). Offloaded rows
    are compared with their plain stage where both were asked for. ``model`` prefixes each claim."""
    if model:
        return [(f"{model}: {sentence}", held)
                for sentence, held in checks(rows, environment, nvme_ready, gpu_rtol)]
    ok = {r.label: r for r in rows if r.result.status == runner.OK}
    base = of_kind(rows, "stage 0")
    offload = [r for r in rows if r.choice.get("offload_optimizer", "none") != "none"]
    out = [("every config ran, or hit a limit, or says why it did not run (no errors)",
            claims.every(runner.explained(r.result) for r in rows)),
           ("stage 0 ran (the baseline every row is compared with)", base is not None),
           ("at least one offload config ran", any(r.label in ok for r in offload))]
    nvme = [r for r in rows if "nvme" in r.choice.values()]
    if nvme_ready and nvme:  # where an NVMe row was asked for
        out.append(("libaio is ready here, so the NVMe row ran", claims.every(r.label in ok for r in nvme)))
    first_tol, all_tol = loss_tolerance(environment)
    compared = [r for r in ok.values() if r is not base]
    for r in compared:
        out.append((f"{r.label}: losses match stage 0 (first within {first_tol:g}, all within {all_tol:g})"
                    + (skipped_note(base.result, r.result) if base else ""),
                    bool(base) and losses_match(base.result.losses, r.result.losses, first_tol, all_tol)))
    out.append((f"at least two ZeRO configs compared with stage 0 ({len(compared)} ran)",
                bool(base) and len(compared) >= 2))
    out.append(claims.loss_falls_claim("stage 0", base.result.losses if base else []))
    if environment.has_gpu:
        for plain, offloaded in (("stage 2", "stage 2 + CPU offload"), ("stage 3", "stage 3 + CPU offload")):
            asked = of_kind(rows, plain, ran=False), of_kind(rows, offloaded, ran=False)
            if None in asked:
                continue
            ran = of_kind(rows, plain), of_kind(rows, offloaded)
            both = None not in ran
            out.append((f"{asked[1].label} uses less GPU memory than {asked[0].label}"
                        + ("" if both else " (one did not run)"),
                        both and ran[1].result.peak_gpu_allocated_bytes
                        < ran[0].result.peak_gpu_allocated_bytes))
        predicted = [KINDS[k] for k in ("stage 0", "stage 2", "stage 3", "stage 2 + CPU offload")]
        for r in rows:
            if r.choice in predicted and r.estimate:
                out.append(memory.gpu_prediction_claim(r.label, r.estimate.total("gpu"),
                                                       r.result.peak_gpu_allocated_bytes, gpu_rtol))
    return out


def summary(rows: list[runner.Row], claims_held: list[claims.Claim]) -> str:
    """Facts that read the same on a CPU and on a T4 (what notebook 05 compares with nbval)."""
    loss_claims = [held for sentence, held in claims_held if "losses match" in sentence]
    return "\n".join([
        "configs: " + ", ".join(r.label for r in rows),
        f"every config ran or explained itself: {claims.every(runner.explained(r.result) for r in rows)}",
        f"losses agree with stage 0: {claims.every(loss_claims)}",
        f"all checks held: {claims.every(held for _, held in claims_held)}",
    ])


# ---- 2 ranks: ZeRO's fractions --------------------------------------------------------------------------

#: The configs run again with 2 ranks, by what they are (:data:`KINDS`), whatever the lesson calls
#: them (NVMe is left out: it partitions like stage 3 + CPU offload, slower).
TWO_RANK_KINDS = [KINDS[kind] for kind in ("stage 0", "stage 1", "stage 2", "stage 3", "stage 2 + CPU offload")]

#: From which stage on each kind is held partitioned at the end of backward. The ZeRO paper's
#: stage 1 keeps whole gradients; DeepSpeed's stage 1 reduce-scatters them at the accumulation
#: boundary and keeps only its partition, so at the end of backward stage 1 already holds half
#: (measured). Stage 2's saving is that it never holds them whole: it reduces bucket by bucket
#: during backward, which lowers the peak, not the end-of-backward figure.
PARTITIONED_FROM = {"optimizer_bytes": 1, "grads_bytes": 1, "params_bytes": 3}


def two_rank_plan(environment: kit_env.Environment) -> tuple[str | None, str]:
    """Where the 2-rank runs go: ("gpu", why) with 2+ GPUs, ("cpu", why) on a machine without a GPU
    (gloo ranks, fp32), (None, what to do) on one GPU (two CPU ranks would not compare with GPU runs)."""
    if environment.gpu_count >= 2:
        return "gpu", (f"{environment.gpu_count} GPUs: one process per GPU (torchrun, NCCL), "
                       f"{environment.precision}, the same model as above")
    if not environment.has_gpu:
        return "cpu", "no GPU: two CPU processes (gloo), fp32, the same tiny model as above"
    return None, ("one GPU: nothing to partition across. For two free GPUs open this notebook on Kaggle "
                  "(Settings > Accelerator > GPU T4 x2) and this section runs by itself.")


def launch_note(shape: str, steps: int, world_size: int = 2) -> str:
    """How the 2-rank runs are launched, and the same for your own script from a notebook cell."""
    return (f"each config runs as:  torchrun --nproc-per-node {world_size} "
            f"-m helpers worker <spec.json>\n"
            f"the same from a terminal:  python -m helpers matrix --world-size {world_size} --shape {shape} "
            f"--steps {steps}\n"
            f"your own script from a cell:  !deepspeed --num_gpus {world_size} train.py --deepspeed configs/zero2.json")


def _rank_bytes(row: runner.Row, kind: str) -> list[int]:
    return [r.get(kind) or 0 for r in row.result.ranks]


def two_rank_table(one: list[runner.Row], two: list[runner.Row], environment: kit_env.Environment) -> Table:
    """What one rank holds with 1 rank and with 2, per config: ZeRO's fractions, measured."""
    solo = {r.label: r for r in one}
    mib, gib = show.mib, show.gib
    rows = []
    for r in two:
        s = solo.get(r.label)
        cells = []
        for kind in PARTITIONED_FROM:
            a = _rank_bytes(s, kind)[:1] if s and s.result.ranks else []
            b = _rank_bytes(r, kind)
            cells.append(f"{mib(a[0]) if a else '-'} -> {' / '.join(mib(x) for x in b) or '-'}")
        if environment.has_gpu:
            peak_one = s.result.peak_gpu_allocated_bytes if s else None
            peaks = [x.get("peak_gpu_allocated_bytes") for x in r.result.ranks]
            cells += [f"{gib(peak_one)} -> {' / '.join(gib(p) for p in peaks) or '-'}",
                      gib(r.estimate.total("gpu")) if r.estimate else "-"]
        status = show.status_cell(r.result.status, r.result.message, runner.OK, 60)
        loss = show.loss_cell(r.result.losses, 4)
        rows.append((r.label, status, *cells, loss))
    head = ["config", "status", "optimizer MiB/rank (1 -> 2 ranks)", "gradients MiB/rank", "parameters MiB/rank"]
    if environment.has_gpu:
        head += ["peak GPU GiB/rank (1 -> 2)", "predicted, 2 ranks"]
    return Table(head + ["loss (2 ranks)"], rows, title="What one rank holds, 1 rank against 2")


def two_rank_checks(one: list[runner.Row], two: list[runner.Row], environment: kit_env.Environment,
                    rtol: float = 0.02) -> list[tuple[str, bool]]:
    """With 2 ranks each rank holds half of what 1 rank holds, for exactly the kinds its stage
    partitions; losses agree with stage 0 (2 ranks) and, at the first step, with 1 rank; on GPUs the
    partitioning stages use less GPU memory per rank than with 1 rank."""
    solo = {r.label: r for r in one if r.result.status == runner.OK}
    out = [(f"all {len(two)} 2-rank runs ok", claims.every(r.result.status == runner.OK for r in two))]
    first_tol, all_tol = loss_tolerance(environment)
    base = of_kind(two, "stage 0")
    for r in two:
        s = solo.get(r.label)
        if r.result.status != runner.OK or not (s and s.result.ranks and len(r.result.ranks) == 2):
            continue
        stage = int(r.choice.get("stage", 0))
        for kind, from_stage in PARTITIONED_FROM.items():
            whole = _rank_bytes(s, kind)[0]
            expect = whole / 2 if stage >= from_stage else whole
            held = claims.every(abs(b - expect) <= rtol * whole for b in _rank_bytes(r, kind))
            out.append((f"{r.label}: {kind.replace('_bytes', '')} {'halved' if stage >= from_stage else 'whole'} "
                        f"on each of 2 ranks", held))
        out.append((f"{r.label}: first loss with 2 ranks equals 1 rank's (within {first_tol:g})",
                     claims.within(r.result.losses[0], s.result.losses[0], first_tol)))
        if base and r is not base:
            out.append((f"{r.label}: 2-rank losses match 2-rank stage 0 (within {all_tol:g})",
                        losses_match(base.result.losses, r.result.losses, first_tol, all_tol)))
        if environment.has_gpu and stage >= 1 and r.choice.get("offload_optimizer", "none") == "none":
            peaks = [x.get("peak_gpu_allocated_bytes") or 0 for x in r.result.ranks]
            out.append((f"{r.label}: less GPU memory per rank with 2 ranks than with 1",
                        0 < max(peaks) < s.result.peak_gpu_allocated_bytes))
    return out


#: Stage 2 against stage 2 + CPU offload as recorded in T4 emulation (an H200 capped as a T4, fp16,
#: free Colab's RAM; GPT-2 355M-shaped, 4 x 512, checkpointing; DeepSpeed 0.19.8, transformers
#: 5.24.0, 2026-12-03): (s/step, peak GPU GiB, peak host RSS GB) each. What a CPU run cannot show.
RECORDED_T4_OFFLOAD = {"stage 2": (0.23, 7.34, 2.51), "stage 2 + CPU offload": (0.60, 2.07, 8.48)}


def offload_line(plain: runner.RunResult, off: runner.RunResult,
                 environment: kit_env.Environment) -> str:
    """What CPU offload of stage 2 did: on a GPU, from these runs; without one it moved nothing
    (the optimizer is in RAM either way), so the line says so and quotes the T4-emulation record."""
    if environment.has_gpu:
        return (f"CPU offload of stage 2 cost {off.median_step_s / plain.median_step_s:.1f}x the "
                f"step time ({plain.median_step_s:.2f} -> {off.median_step_s:.2f} s), took the GPU's "
                f"peak from {show.gib(plain.peak_gpu_allocated_bytes)} to "
                f"{show.gib(off.peak_gpu_allocated_bytes)} GiB and moved the optimizer to RAM (host "
                f"RSS {plain.peak_host_rss_bytes / GiB:.1f} -> {off.peak_host_rss_bytes / GiB:.1f} GiB).")
    (s0, g0, h0), (s1, g1, h1) = (RECORDED_T4_OFFLOAD[k] for k in ("stage 2", "stage 2 + CPU offload"))
    return (f"No GPU here, so CPU offload had nothing to move (its step: {plain.median_step_s:.2f} -> "
            f"{off.median_step_s:.2f} s; no T4 figure). Recorded in T4 emulation at GPT-2 355M: "
            f"{s1 / s0:.1f}x the step time ({s0:.2f} -> {s1:.2f} s), GPU {g0:.2f} -> {g1:.2f} GiB, "
            f"host RAM {h0:.2f} -> {h1:.2f} GB.")


def takeaways(rows: list[runner.Row], environment: kit_env.Environment, other: list[runner.Row] | None = None,
              extra: list[str] | None = None) -> list[str]:
    """Notebook 05's summary: what the stages and offload did on this machine, from this run (with
    ``other``, another model shape's rows beside these: :func:`shape_takeaway`; ``extra`` lines
    before the next step)."""
    ok = {r.label: r.result for r in rows if r.result.status == runner.OK}
    where = "GPU" if environment.has_gpu else "host RAM (no GPU: everything lives in RAM)"
    peak = (lambda r: r.peak_gpu_allocated_bytes) if environment.has_gpu else (lambda r: r.peak_host_rss_bytes)
    ranked = sorted((peak(r) or 0, label) for label, r in ok.items())
    lines = []
    if ranked:
        (low, low_label), (high, high_label) = ranked[0], ranked[-1]
        lines.append(f"Peak {where}: lowest {low_label} at {low / GiB:.2f} GiB, highest {high_label} at "
                     f"{high / GiB:.2f} GiB.")
    plain, offloaded = of_kind(rows, "stage 2"), of_kind(rows, "stage 2 + CPU offload")
    if plain and offloaded:
        lines.append(offload_line(plain.result, offloaded.result, environment))
    nvme = of_kind(rows, "stage 3 + NVMe offload")
    if nvme:
        nvme = nvme.result
        lines.append(f"NVMe offload wrote {nvme.peak_nvme_bytes / GiB:.2f} GiB of files and took "
                     f"{nvme.median_step_s:.2f} s a step.")
    base = of_kind(rows, "stage 0")
    base = base.result if base else None
    if base and base.losses:
        lines.append(f"Every config that ran started at loss {base.losses[0]:.3f}: ZeRO moves bytes, not the math "
                     f"(stage 0 ended at {base.losses[-1]:.3f}).")
    if other is not None:
        lines.append(shape_takeaway(rows, other, environment))
    lines += extra or []
    lines.append("Next: 06 · the biggest model a T4 can train, with ZeRO-3 and NVMe offload tuned to fit.")
    return lines


def shape_takeaway(rows: list[runner.Row], other: list[runner.Row], environment: kit_env.Environment) -> str:
    """One line: two models (say GPT-2 and a Llama-style one of the same size) under the same
    configs, their peaks and step times side by side, from this run."""
    place = "GPU" if environment.has_gpu else "host RAM"
    peak = (lambda r: r.peak_gpu_allocated_bytes) if environment.has_gpu else (lambda r: r.peak_host_rss_bytes)
    mine = {r.label: r for r in rows if r.result.status == runner.OK}
    pairs = [(r.label, mine[r.label].result, r.result) for r in other
             if r.result.status == runner.OK and r.label in mine]
    if not pairs or not rows or not other:
        return "The two model shapes had no config that ran under both."
    a, b = rows[0].spec.shape if rows[0].spec else "first", other[0].spec.shape if other[0].spec else "second"
    cells = "; ".join(f"{label} {(peak(x) or 0) / GiB:.2f} vs {(peak(y) or 0) / GiB:.2f} GiB, "
                      f"{x.median_step_s or 0:.2f} vs {y.median_step_s or 0:.2f} s/step" for label, x, y in pairs)
    return f"Peak {place}, {a} vs {b}: {cells}."


# ---- faster CPU offload: the variants side by side -----------------------------------------------
#: Make CPU offload faster (notebook 05's last section): plain ZeRO-2 CPU offload against
#: DeepSpeed's partial offload, which takes work off the CPU, on the same model, data and seed, each run in its
#: own subprocess through helpers.runner:
#:
#: - **partial offload** (ZeRO-3, ``offload_optimizer.ratio``): only that fraction of the optimizer
#:   states and of Adam's step goes to the CPU; the rest stays on the GPU, where it costs GPU memory.
#:   In DeepSpeed 0.19.8 the GPU's share ignores the learning-rate schedule (it trains at the peak
#:   rate from step 1; measured: losses part from plain's at step 2, 8.59 against 8.23 at GPT-2 124M):
#:   helpers.deepspeed_fixes.fix_partial_offload_schedule, which helpers.runner applies, mends it;
#:
#: ZenFlow is not among these variants: in DeepSpeed 0.19.8 it scrambles every 2-D weight at
#: ``deepspeed.initialize`` (its flatten stores matrices transposed, ``_update_model_bit16_weights``
#: views them untransposed; GPT-2 tiny's first loss 10.8408 -> 10.8330 with the same weights), which
#: the first-loss check caught. helpers.deepspeed_fixes.fix_zenflow_weights mends it, and notebook 09
#: runs ZenFlow beside plain offload. See docs/deepspeed_gaps.md.
#:
#: A variant that fails here (a feature that needs bf16 or a newer GPU, say) is a row with its error,
#: not a crash: the table says what DeepSpeed said.


PLAIN = "ZeRO-2 + CPU offload"
#: The ZeRO-3 variant offloads the optimizer only: its weights stay on the GPU. The matrix's
#: "stage 3 + CPU offload" row offloads the weights too (offload_param), so every layer's weights
#: cross to the GPU in forward and again in backward, and steps slower (355M: 4.36 s there against
#: 1.36 s here in one GPU run, once under one name): two configs, two names.
ZERO3_OPTIMIZER_ONLY = "ZeRO-3 + CPU optimizer offload (weights on the GPU)"
#: The fraction of the optimizer that partial offload leaves on the CPU (the rest is on the GPU).
PARTIAL_RATIO = 0.3

#: (name, config.build choices, keys added under zero_optimization): the variants, plain first.
VARIANTS: list[tuple[str, dict, dict]] = [
    (PLAIN, {"stage": 2, "offload_optimizer": "cpu"}, {}),
    (ZERO3_OPTIMIZER_ONLY, {"stage": 3, "offload_optimizer": "cpu"}, {}),
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
    ds_config: dict | None = None  # the config it ran with


def variant_config(name: str, model: memory.ModelInfo, environment: kit_env.Environment,
                   micro_batch: int, steps: int, base: dict | None = None) -> dict:
    """The engine config of one variant, built as the matrix builds a row: ``base`` (the lesson's
    stage-0 config; None: the one its functions build for ``micro_batch`` in the machine's
    precision) with the variant's ``zero_optimization`` block, over the kit's tuning for the row
    (config.for_row: buckets, sub-groups, pinning), which fills only the keys the lesson leaves
    unset. So plain ZeRO-2 + CPU offload is the matrix's "stage 2 + CPU offload" row, and a
    variant differs from a row only where its name says.

    (At their size's GPT-3 rate, warmed up over the run, GPT-2 124M reached 1e-3 at step 8 and
    its loss jumped from 5.29 back to 11.51 in every variant.)
    ``steps`` is the run's length, which the config does not hold."""
    choice, extra = next((c, e) for n, c, e in VARIANTS if n == name)
    zero = {"stage": choice["stage"]}
    for key in ("offload_optimizer", "offload_param"):
        if key in choice:
            zero[key] = {"device": choice[key]}
    zero = config.overlaid(zero, extra)
    base = base if base is not None else taught.stage0_config(micro_batch, environment.precision)
    return config.tuned_row(taught.row_config(base, zero), model, environment, micro_batch)


def run_variants(shapes: list[str], environment: kit_env.Environment, micro_batch: int, seq_len: int,
                 steps: int, progress: bool = True, base: dict | None = None) -> list[Variant]:
    """Every variant at every size, each in a fresh subprocess (same seed and data), each built on
    ``base``, the lesson's stage-0 config (:func:`variant_config`)."""
    from tqdm.auto import tqdm

    out = []
    todo = [(shape, name) for shape in shapes for name, _, _ in VARIANTS]
    for shape, name in tqdm(todo, desc="offload variants", disable=not progress):
        info = memory.ModelInfo.for_shape(shape)
        ds = variant_config(name, info, environment, micro_batch, steps, base)
        spec = runner.RunSpec(ds_config=ds, shape=shape, seq_len=seq_len, steps=steps, grad_ckpt=True,
                              label=f"{shape} {name}")
        out.append(Variant(shape, name, runner.measure(spec), info.n_params, ds))
    return out


def _plain(variants: list[Variant], shape: str) -> runner.RunResult | None:
    return next((v.result for v in variants if v.shape == shape and v.name == PLAIN
                 and v.result.status == runner.OK), None)


def speedup(variant: Variant, variants: list[Variant]) -> float | None:
    """Plain CPU offload's step time over this variant's, at the same size (None: one did not run)."""
    plain = _plain(variants, variant.shape)
    mine = variant.result.median_step_s if variant.result.status == runner.OK else None
    return plain.median_step_s / mine if plain and plain.median_step_s and mine else None


def offload_table(variants: list[Variant], environment: kit_env.Environment) -> Table:
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
                  "last loss vs plain"], rows, title=f"Faster offload, {environment.measured_on()}",
                 note=runner.fixes_note([v.result for v in variants],
                                        [f"{v.shape} {v.name}" for v in variants]))


def offload_checks(variants: list[Variant], environment: kit_env.Environment) -> list[claims.Claim]:
    """Each able to fail: plain CPU offload ran at every size (the baseline); every variant ran or
    shows DeepSpeed's error; at least one other variant ran beside plain somewhere (an empty
    comparison fails); each one that ran trained as plain did (same model, data and seed: the first
    loss equal, every loss within the matrix's tolerance; partial offload needs
    helpers.deepspeed_fixes for that) and ended finite; and every run's loss falls (the kit's rule,
    claims.loss_falls: a jump back up at the end fails it)."""
    shapes = list(dict.fromkeys(v.shape for v in variants))
    first_tol, all_tol = loss_tolerance(environment)
    ran = [v for v in variants if v.name != PLAIN and v.result.status == runner.OK]
    out = [(f"plain CPU offload ran at every size ({', '.join(shapes)})",
            bool(shapes) and claims.every(_plain(variants, s) is not None for s in shapes)),
           ("every variant ran, or its row shows the error DeepSpeed gave",
            claims.every(v.result.status == runner.OK or bool(v.result.message) for v in variants)),
           (f"at least one faster-offload variant ran beside plain ({len(ran)} runs)", bool(ran))]
    for v in ran:
        plain = _plain(variants, v.shape)
        out.append((f"{v.shape} {v.name}: losses match plain's (first within {first_tol:g}, all within "
                    f"{all_tol:g}), last loss finite" + (skipped_note(plain, v.result) if plain else ""),
                    bool(plain) and losses_match(plain.losses, v.result.losses, first_tol, all_tol)
                    and math.isfinite(v.result.losses[-1])))
    # plain included: GPT-2 124M's rows once jumped back to 11.5 at step 8 in every variant alike,
    # which the comparison with plain cannot see
    out += [claims.loss_falls_claim(f"{v.shape} {v.name}", v.result.losses)
            for v in variants if v.result.status == runner.OK]
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


def offload_takeaways(variants: list[Variant], environment: kit_env.Environment) -> list[str]:
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
            lines.append(f"{v.shape} {v.name}: {v.result.status}: {show.clip(v.result.message, 160)}")
    return lines


# ---- each row as what it changes from stage 0 -----------------------------------------------------
#: Notebook 05's lesson cell writes, for every row of the matrix, the keys it sets under
#: ``zero_optimization`` on top of a stage-0 config. The matrix runs those configs with the kit's
#: tuning (config.for_row: buckets, sub-groups, NVMe buffers) filling the keys they leave unset; the
#: functions below show the difference from stage 0 of what ran, and check that the lesson's keys
#: are in it with the lesson's values.


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """A nested config as {dotted key: value} (lists and scalars are leaves)."""
    out: dict[str, object] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _without_disabled_precision(config: dict) -> dict:
    """The config less an fp16 or bf16 block that is not enabled (the same as none)."""
    return {k: v for k, v in config.items()
            if not (k in ("fp16", "bf16") and isinstance(v, dict) and not v.get("enabled"))}


def config_differences(a: dict, b: dict) -> list[tuple[str, object, object]]:
    """(dotted key, value in ``a``, value in ``b``) wherever two configs differ; a key one of them
    lacks shows as None there. An fp16 or bf16 block that is off counts as absent."""
    flat_a, flat_b = flatten(_without_disabled_precision(a)), flatten(_without_disabled_precision(b))
    keys = sorted(set(flat_a) | set(flat_b))
    return [(k, flat_a.get(k), flat_b.get(k)) for k in keys if flat_a.get(k) != flat_b.get(k)]


def _ran_configs(rows: list[runner.Row]) -> dict[str, dict]:
    return {r.label: r.spec.ds_config for r in rows if r.spec is not None}


def lesson_keys_claims(lesson_rows: dict[str, dict], rows: list[runner.Row]) -> list[claims.Claim]:
    """Each able to fail: the matrix ran every row the lesson writes and no other, and each row
    that ran carries every key the lesson sets under ``zero_optimization``, with the lesson's value
    (the kit's tuning must not have overridden one). A row the lesson adds (say stage 2 with NVMe
    offload) runs and is checked like the others."""
    ran = _ran_configs(rows)
    out = [("the matrix ran the lesson's rows", set(lesson_rows) == {r.label for r in rows})]
    for label, zero in lesson_rows.items():
        if label not in ran:
            continue
        flat = flatten(ran[label].get("zero_optimization", {}))
        wanted = flatten(zero)
        missing = [f"{k}={v!r} (ran {flat.get(k)!r})" for k, v in wanted.items() if flat.get(k) != v]
        out.append((f"{label}: the config that ran sets the lesson's keys"
                    + (f" (not: {', '.join(missing)})" if missing else ""), not missing))
    return out


def changes_table(lesson_rows: dict[str, dict], rows: list[runner.Row]) -> Table:
    """Per row, every key whose value in the config that ran differs from the stage-0 row's: the
    lesson's (what the row is) and the kit's tuning (what it is run with)."""
    ran = _ran_configs(rows)
    stage0 = of_kind([r for r in rows if r.spec is not None], "stage 0", ran=False)
    base = stage0.spec.ds_config if stage0 else {}
    out = []
    for label, cfg in ran.items():
        lesson_keys = set(flatten({"zero_optimization": lesson_rows.get(label, {})}))
        diff = config_differences(base, cfg)
        mine = [f"{k} = {json.dumps(b)}" for k, _, b in diff if k in lesson_keys]
        kit = [f"{k.removeprefix('zero_optimization.')} = {json.dumps(b)}" for k, _, b in diff
               if k not in lesson_keys]
        out.append((label, "; ".join(mine) or "-", "; ".join(kit) or "-"))
    return Table(["row", "the lesson's keys (what the row is)",
                  "the kit's tuning beside them (zero_optimization.*)"], out,
                 title="What each row's config changes from stage 0, as it ran")


# ---- two ZeRO-3 + CPU offload runs, named apart ----------------------------------------------------


def zero3_offload_note(rows: list[runner.Row], variants: list[Variant], shape: str) -> str:
    """The matrix's "stage 3 + CPU offload" and the faster-offload section's ZeRO-3 variant at the
    same size: their step times and every key in which their configs differ."""
    row = next((r for r in rows if r.choice == KINDS["stage 3 + CPU offload"] and r.spec), None)
    variant = next((v for v in variants if v.shape == shape and v.name == ZERO3_OPTIMIZER_ONLY), None)
    if row is None or variant is None or variant.ds_config is None:
        return f"{shape}: the matrix's stage 3 + CPU offload row or the ZeRO-3 variant did not run here."
    steps = len(variant.result.losses)
    diff = config_differences(row.spec.ds_config, variant.ds_config)
    said = "; ".join(f"{k}: {json.dumps(a)} in the matrix, {json.dumps(b)} here" for k, a, b in diff)
    return (f"{shape}: the matrix's 'stage 3 + CPU offload' ({show.seconds(row.result.median_step_s)} "
            f"s/step, median of {len(row.result.losses)} steps) and '{ZERO3_OPTIMIZER_ONLY}' "
            f"({show.seconds(variant.result.median_step_s)} s/step, median of {steps} steps) differ "
            f"in {said or 'nothing'}.")
