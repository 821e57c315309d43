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
               world_size: int = 1, progress: bool = True) -> list[Row]:
    """Run every row of bench.MATRIX (or ``labels``) with ``world_size`` ranks (one per GPU, or CPU
    ranks with gloo where there is no GPU); NVMe without async_io becomes an explained row."""
    from tqdm.auto import tqdm

    info = memory.ModelInfo.gpt2(shape)
    rows = []
    todo = [(label, choice) for label, choice in bench.MATRIX if labels is None or label in labels]
    for label, choice in tqdm(todo, desc="configs", disable=not progress):
        if "nvme" in choice.values() and not nvme_ready:
            rows.append(Row(label, choice, None, bench.RunResult(
                label, bench.NOT_HERE, "NVMe offload needs libaio: apt-get install -y libaio-dev (notebook 02)"), None))
            continue
        ds = config.build(**choice, micro_batch=micro_batch, world_size=world_size, trainer=False,
                          environment=environment, largest_param_numel=info.largest_param_numel,
                          sub_group_size=min(100_000_000, max(1_000_000, info.n_params // 4)))
        spec = bench.RunSpec(ds_config=ds, shape=shape, seq_len=seq_len, micro_batch=micro_batch, steps=steps,
                             grad_ckpt=grad_ckpt, label=label, world_size=world_size)
        est = memory.estimate(info, ds, world_size=world_size, micro_batch=micro_batch, seq_len=seq_len,
                              grad_ckpt=grad_ckpt, on_gpu=environment.has_gpu)
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
    """Four figures: GPU memory against the T4's 15 GiB, host RAM against Colab's 12.7 GB, seconds per
    step, loss curves."""
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
    figures.append(plots.step_times(labels, [r.result.median_step_s for r in rows],
                                    "Seconds per step (median, first step left out)"))
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
    out = [("every config ran, or hit a limit, or says why it did not run (no errors)",
            all(bench.explained(r.result) for r in rows))]
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
                out.append(memory.gpu_prediction_claim(label, r.estimate.total("gpu"),
                                                       r.result.peak_gpu_allocated_bytes, gpu_rtol))
    return out


# ---- 2 ranks: ZeRO's fractions --------------------------------------------------------------------------

#: The configs run again with 2 ranks (NVMe is left out: it partitions like stage 3 + CPU offload, slower).
TWO_RANK_LABELS = ["stage 0", "stage 1", "stage 2", "stage 3", "stage 2 + CPU offload"]

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
    return (f"each config runs as:  python -m torch.distributed.run --nproc-per-node {world_size} "
            f"-m helpers.bench --worker <spec.json>\n"
            f"the same from a terminal:  python -m helpers.bench --matrix --world-size {world_size} --shape {shape} "
            f"--steps {steps}\n"
            f"your own script from a cell:  !deepspeed --num_gpus {world_size} train.py --deepspeed configs/zero2.json")


def _rank_bytes(row: Row, kind: str) -> list[int]:
    return [r.get(kind) or 0 for r in row.result.ranks]


def two_rank_table(one: list[Row], two: list[Row], environment: kit_env.Environment) -> Table:
    """What one rank holds with 1 rank and with 2, per config: ZeRO's fractions, measured."""
    solo = {r.label: r for r in one}
    mib = lambda b: f"{b / 2**20:,.1f}"
    gib = lambda b: "-" if not b else f"{b / GiB:.2f}"
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
        status = r.result.status if r.result.status == bench.OK else f"{r.result.status}: {r.result.message[:60]}"
        loss = f"{r.result.losses[0]:.4f} -> {r.result.losses[-1]:.4f}" if r.result.losses else "-"
        rows.append((r.label, status, *cells, loss))
    head = ["config", "status", "optimizer MiB/rank (1 -> 2 ranks)", "gradients MiB/rank", "parameters MiB/rank"]
    if environment.has_gpu:
        head += ["peak GPU GiB/rank (1 -> 2)", "predicted, 2 ranks"]
    return Table(head + ["loss (2 ranks)"], rows, title="What one rank holds, 1 rank against 2")


def ranks_table(rows: list[Row]) -> Table:
    """Every rank's bytes of optimizer states, gradients and parameters, and its peak GPU memory."""
    out = []
    for r in rows:
        for x in r.result.ranks:
            peak = x.get("peak_gpu_allocated_bytes")
            out.append((r.label, x.get("rank"), *(f"{(x.get(k) or 0) / 2**20:,.1f}" for k in PARTITIONED_FROM),
                        "-" if peak is None else f"{peak / GiB:.2f}"))
    return Table(["config", "rank", "optimizer MiB", "gradients MiB", "parameters MiB", "peak GPU GiB"], out,
                 title="Per rank")


def two_rank_checks(one: list[Row], two: list[Row], environment: kit_env.Environment,
                    rtol: float = 0.02) -> list[tuple[str, bool]]:
    """With 2 ranks each rank holds half of what 1 rank holds, for exactly the kinds its stage
    partitions; losses agree with stage 0 (2 ranks) and, at the first step, with 1 rank; on GPUs the
    partitioning stages use less GPU memory per rank than with 1 rank."""
    solo = {r.label: r for r in one if r.result.status == bench.OK}
    out = [(f"all {len(two)} 2-rank runs ok", bool(two) and all(r.result.status == bench.OK for r in two))]
    first_tol, all_tol = loss_tolerance(environment)
    base = next((r for r in two if r.label == "stage 0" and r.result.status == bench.OK), None)
    for r in two:
        s = solo.get(r.label)
        if r.result.status != bench.OK or not (s and s.result.ranks and len(r.result.ranks) == 2):
            continue
        stage = int(r.choice.get("stage", 0))
        for kind, from_stage in PARTITIONED_FROM.items():
            whole = _rank_bytes(s, kind)[0]
            expect = whole / 2 if stage >= from_stage else whole
            held = all(abs(b - expect) <= rtol * whole for b in _rank_bytes(r, kind))
            out.append((f"{r.label}: {kind.replace('_bytes', '')} {'halved' if stage >= from_stage else 'whole'} "
                        f"on each of 2 ranks", held))
        out.append((f"{r.label}: first loss with 2 ranks equals 1 rank's (within {first_tol:g})",
                     abs(r.result.losses[0] - s.result.losses[0]) <= first_tol * abs(s.result.losses[0])))
        if base and r is not base:
            out.append((f"{r.label}: 2-rank losses match 2-rank stage 0 (within {all_tol:g})",
                        all(abs(b - a) <= all_tol * abs(a) for a, b in zip(base.result.losses, r.result.losses))))
        if environment.has_gpu and stage >= 1 and r.choice.get("offload_optimizer", "none") == "none":
            peaks = [x.get("peak_gpu_allocated_bytes") or 0 for x in r.result.ranks]
            out.append((f"{r.label}: less GPU memory per rank with 2 ranks than with 1",
                        0 < max(peaks) < s.result.peak_gpu_allocated_bytes))
    return out
