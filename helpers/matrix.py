"""The stage and offload matrix of notebook 05: run each config on the same model, data and seed
(each in its own subprocess, through helpers.bench), predict each with helpers.memory, and check
the claims ZeRO makes.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers import bench, config, memory
from helpers import env as kit_env
from helpers.tables import Table

GiB = 2**30


@dataclass
class Row:
    """One config of the matrix: what ran, what came back, what was predicted."""

    label: str
    choice: dict
    spec: bench.RunSpec | None
    result: bench.RunResult
    estimate: memory.Estimate | None


def run_matrix(shape: str, environment: kit_env.Environment, micro_batch: int, seq_len: int, steps: int,
               grad_ckpt: bool = True, nvme_ready: bool = True, labels: list[str] | None = None,
               progress: bool = True) -> list[Row]:
    """Run every row of bench.MATRIX (or ``labels``); NVMe without async_io becomes an explained row."""
    from tqdm.auto import tqdm

    info = memory.ModelInfo.gpt2(shape)
    rows = []
    todo = [(label, choice) for label, choice in bench.MATRIX if labels is None or label in labels]
    for label, choice in tqdm(todo, desc="configs", disable=not progress):
        if "nvme" in choice.values() and not nvme_ready:
            rows.append(Row(label, choice, None, bench.RunResult(
                label, "not here", "NVMe offload needs libaio: apt-get install -y libaio-dev (notebook 02)"), None))
            continue
        ds = config.build(**choice, micro_batch=micro_batch, trainer=False, environment=environment,
                          largest_param_numel=info.largest_param_numel,
                          sub_group_size=min(100_000_000, max(1_000_000, info.n_params // 4)))
        spec = bench.RunSpec(ds_config=ds, shape=shape, seq_len=seq_len, micro_batch=micro_batch, steps=steps,
                             grad_ckpt=grad_ckpt, label=label)
        est = memory.estimate(info, ds, micro_batch=micro_batch, seq_len=seq_len, grad_ckpt=grad_ckpt,
                              on_gpu=environment.has_gpu)
        rows.append(Row(label, choice, spec, bench.measure(spec), est))
    return rows


def table(rows: list[Row], environment: kit_env.Environment) -> Table:
    """Measured and predicted side by side, with the T4-sized limits."""
    gib = lambda b: "-" if b is None else f"{b / GiB:.2f}"
    out = []
    for r in rows:
        res, est = r.result, r.estimate
        out.append((r.label, res.status if res.status == bench.OK else f"{res.status}: {res.message[:70]}",
                    gib(res.peak_gpu_allocated_bytes), gib(est.total("gpu")) if est and environment.has_gpu else "-",
                    gib(res.peak_host_rss_bytes or None), gib(est.total("cpu")) if est else "-",
                    gib(res.peak_nvme_bytes or None),
                    "-" if res.median_step_s is None else f"{res.median_step_s:.2f}",
                    "-" if res.tokens_per_s is None else f"{res.tokens_per_s:,.0f}",
                    f"{res.losses[0]:.4f} -> {res.losses[-1]:.4f}" if res.losses else "-"))
    return Table(["config", "status", "GPU GiB", "GPU predicted", "host RSS GiB", "host predicted", "NVMe GiB",
                  "s/step", "tokens/s", "loss first -> last"], out, title="ZeRO stages and offload, measured")


def plot(rows: list[Row], environment: kit_env.Environment):
    """Three figures: GPU memory against the T4's 15 GiB, host RAM against Colab's 12.7 GB, loss curves."""
    from helpers import plots

    labels = [r.label for r in rows]
    figures = []
    if environment.has_gpu:
        figures.append(plots.memory_bars(
            labels, [(r.result.peak_gpu_allocated_bytes or 0) / GiB or None for r in rows],
            [r.estimate.total("gpu") / GiB if r.estimate else None for r in rows],
            (environment.gpu_cap_bytes or environment.vram_total_bytes) / GiB, "Peak GPU memory",
            "this GPU's limit" if not environment.emulation else "T4: 15 GiB"))
    figures.append(plots.memory_bars(
        labels, [(r.result.peak_host_rss_bytes or 0) / GiB or None for r in rows],
        [r.estimate.total("cpu") / GiB if r.estimate else None for r in rows],
        kit_env.EMULATIONS["t4"].ram_budget_bytes / GiB, "Peak host RAM (RSS of the run's processes)",
        "free Colab: 12.7 GB"))
    figures.append(plots.loss_curves({r.label: r.result.losses for r in rows if r.result.losses},
                                     "Same model, data and seed: the loss per step of every config"))
    return figures


def loss_tolerance(environment: kit_env.Environment) -> tuple[float, float]:
    """(first-step, every-step) relative tolerance for losses against stage 0.

    fp32 on the CPU: ZeRO is exact, so 1e-4 everywhere. fp16 on a GPU: the first forward is the
    same (1e-3), later steps drift apart through dynamic loss scaling and different optimizer
    kernels (stage 0's FP16 optimizer against ZeRO's), so 10%.
    """
    return (1e-4, 1e-4) if environment.precision == "fp32" else (1e-3, 0.10)


def checks(rows: list[Row], environment: kit_env.Environment, gpu_rtol: float = 0.15) -> list[tuple[str, bool]]:
    """The claims notebook 05 asserts, each (claim, held)."""
    ok = {r.label: r for r in rows if r.result.status == bench.OK}
    out = [("every config ran, or says why not", all(r.result.status == bench.OK or r.result.message for r in rows))]
    base = ok.get("stage 0")
    first_tol, all_tol = loss_tolerance(environment)
    if base:
        for label, r in ok.items():
            if label == "stage 0" or not r.result.losses:
                continue
            pairs = list(zip(base.result.losses, r.result.losses))
            first = abs(pairs[0][1] - pairs[0][0]) <= first_tol * abs(pairs[0][0])
            every = all(abs(b - a) <= all_tol * abs(a) for a, b in pairs)
            out.append((f"{label}: losses match stage 0 (first within {first_tol:g}, all within {all_tol:g})",
                        first and every))
        losses = base.result.losses
        out.append(("stage 0's loss falls", len(losses) > 1 and losses[-1] < losses[0]))
    if environment.has_gpu:
        for plain, offloaded in (("stage 2", "stage 2 + CPU offload"), ("stage 3", "stage 3 + CPU offload")):
            if plain in ok and offloaded in ok:
                out.append((f"{offloaded} uses less GPU memory than {plain}",
                            ok[offloaded].result.peak_gpu_allocated_bytes < ok[plain].result.peak_gpu_allocated_bytes))
        for label in ("stage 0", "stage 2", "stage 3", "stage 2 + CPU offload"):
            r = ok.get(label)
            if r and r.estimate:
                measured, predicted = r.result.peak_gpu_allocated_bytes, r.estimate.total("gpu")
                out.append((f"{label}: predicted GPU memory within {gpu_rtol:.0%} of measured "
                            f"({predicted / GiB:.2f} vs {measured / GiB:.2f} GiB)",
                            abs(predicted - measured) <= gpu_rtol * measured))
    return out


# ---- the 2-rank partition check --------------------------------------------------------------------------


def partition_runs(shape: str = "tiny", seq_len: int = 64, micro_batch: int = 2, steps: int = 2,
                   progress: bool = True) -> dict[tuple[int, int], bench.RunResult]:
    """Stages 0-3 with 1 and 2 ranks on the CPU (gloo, fp32): what each rank holds. Keys (stage, ranks)."""
    from tqdm.auto import tqdm

    out = {}
    todo = [(stage, ranks) for stage in range(4) for ranks in (1, 2)]
    for stage, ranks in tqdm(todo, desc="stage x ranks", disable=not progress):
        ds = config.build(stage=stage, micro_batch=micro_batch, world_size=ranks, trainer=False, precision="fp32",
                          pin_memory=False)
        spec = bench.RunSpec(ds_config=ds, shape=shape, seq_len=seq_len, micro_batch=micro_batch, steps=steps,
                             world_size=ranks, force_cpu=True, label=f"stage {stage}, {ranks} rank(s)")
        out[(stage, ranks)] = bench.measure(spec)
    return out


#: From which stage on each kind is held partitioned at the end of backward. The ZeRO paper's
#: stage 1 keeps whole gradients; DeepSpeed's stage 1 reduce-scatters them at the accumulation
#: boundary and keeps only its partition, so at the end of backward stage 1 already holds half
#: (measured). Stage 2's saving is that it never holds them whole: it reduces bucket by bucket
#: during backward, which lowers the peak, not the end-of-backward figure.
PARTITIONED_FROM = {"optimizer_bytes": 1, "grads_bytes": 1, "params_bytes": 3}


def partition_table(runs: dict[tuple[int, int], bench.RunResult]) -> Table:
    rows = []
    for (stage, ranks), r in sorted(runs.items()):
        rank0 = r.ranks[0] if r.ranks else {}
        rows.append((stage, ranks, r.status, *(f"{(rank0.get(k) or 0) / 2**20:.2f}" for k in PARTITIONED_FROM)))
    return Table(["stage", "ranks", "status", "optimizer MiB/rank", "gradients MiB/rank", "parameters MiB/rank"],
                 rows, title="What one rank holds")


def partition_checks(runs: dict[tuple[int, int], bench.RunResult], rtol: float = 0.02) -> list[tuple[str, bool]]:
    """With 2 ranks each rank holds half of what 1 rank holds, for exactly the kinds its stage partitions."""
    out = [("all 8 runs ok", all(r.status == bench.OK for r in runs.values()))]
    for stage in range(4):
        one, two = runs[(stage, 1)], runs[(stage, 2)]
        if not (one.ranks and two.ranks):
            continue
        for kind, from_stage in PARTITIONED_FROM.items():
            solo = one.ranks[0][kind]
            shares = [r[kind] for r in two.ranks]
            expect = solo / 2 if stage >= from_stage else solo
            held = all(abs(s - expect) <= rtol * solo for s in shares)
            verb = "halved" if stage >= from_stage else "whole"
            out.append((f"stage {stage}: {kind.replace('_bytes', '')} {verb} on each of 2 ranks", held))
        out.append((f"stage {stage}: 2-rank losses match 1-rank's first step",
                    abs(one.losses[0] - two.losses[0]) <= 1e-4 * abs(one.losses[0])))
    return out
