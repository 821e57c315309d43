"""Notebook 06, the biggest model on a T4: ZeRO-Infinity for a small machine. A disk-space refusal
before training, a disk bandwidth probe, the model-size ladder (each run through helpers.runner in
its own subprocess, killed past the RAM budget as Colab would kill the kernel), and the fine-tune
of a pretrained model, watched (the last section). The ZeRO-3 + NVMe config sized for a model and
a RAM budget is helpers.config.zero_infinity.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers import claims, config, memory, runner, show
from helpers.show import GiB, Table, GB
from helpers import env as kit_env

#: NVMe bytes per parameter measured for GPT-2 XL with parameters and optimizer on NVMe (26.3 GiB
#: for 1.56B: fp16 weights, fp32 master weights, Adam's moments, gradient swap space), and with
#: the optimizer only (SmolLM2-1.7B-shaped, 25.5 GiB for 1.71B, T4 emulation, 2026-12-02 in docs/gpu_runs.md: 12 bytes of
#: fp32 master weights and moments, 4 of fp32 gradients).
NVME_BYTES_PER_PARAM = 18.2
NVME_OPTIMIZER_BYTES_PER_PARAM = 16.0
DISK_MARGIN = 1.25
NVME, NVME_OPTIMIZER = "ZeRO-3 + NVMe", "ZeRO-3 + NVMe optimizer, weights on GPU"
#: the lever for what the optimizer on NVMe cannot train whole: the input embedding frozen
#: (notebook 06's ``freeze_input_embedding``), the sub-groups as small as the largest trained tensor
NVME_FROZEN = f"{NVME_OPTIMIZER}, embedding frozen"
#: why the lever's rung was not tried at a size (NVME_OPTIMIZER trained it whole)
LEVER_NOT_NEEDED = f"tried only where {NVME_OPTIMIZER} could not train every parameter"
METHODS: list[tuple[str, dict]] = [
    ("stage 0 (no ZeRO)", {"stage": 0}),
    ("ZeRO-2 + CPU offload", {"stage": 2, "offload_optimizer": "cpu"}),
    (NVME, {"stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme"}),
    # the fp16 weights stay on the GPU (2 bytes/param): no weight swap buffers in host RAM, no
    # weight traffic on the disk; the optimizer's states still live on NVMe
    (NVME_OPTIMIZER, {"stage": 3, "offload_optimizer": "nvme"}),
    # tried only at a size where NVME_OPTIMIZER did not train (run_ladder)
    (NVME_FROZEN, {"stage": 3, "offload_optimizer": "nvme", "freeze_embeddings": True}),
]


def is_nvme(method: str) -> bool:
    """Whether a ladder method offloads to NVMe (ZeRO-Infinity: either of the two)."""
    return method.startswith(NVME)  # either, and either with a lever named after it


def weights_on_nvme(rung: "Rung") -> bool:
    """Whether the rung's config put the fp16 weights on NVMe (not kept on the GPU)."""
    zero = (rung.spec.ds_config if rung.spec else {}).get("zero_optimization", {})
    return (zero.get("offload_param") or {}).get("device") == "nvme"


def nvme_bytes_needed(model: memory.ModelInfo, weights_on_nvme: bool = True,
                      frozen_embeddings: bool = False) -> int:
    """Disk the NVMe files will take (measured bytes per parameter), before the safety margin.
    With the embedding frozen its optimizer states and gradients take none (its fp16 weights, on
    NVMe, 2 bytes a parameter, still do)."""
    per_param = NVME_BYTES_PER_PARAM if weights_on_nvme else NVME_OPTIMIZER_BYTES_PER_PARAM
    frozen = memory.embedding_numel(model) if frozen_embeddings else 0
    kept = 2 * frozen if weights_on_nvme else 0
    return int(per_param * (model.n_params - frozen) + kept)


def check_disk(model: memory.ModelInfo, path: str | os.PathLike, margin: float = DISK_MARGIN,
               weights_on_nvme: bool = True, frozen_embeddings: bool = False,
               saved_bytes_per_param: int = 0) -> int:
    """Refuse, before any training, when the disk at ``path`` cannot hold the NVMe files
    (:func:`nvme_bytes_needed`, with ``margin``) and a save's ``saved_bytes_per_param`` for every
    parameter (its exact size: no margin); returns the bytes free."""
    files = nvme_bytes_needed(model, weights_on_nvme, frozen_embeddings)
    saved = saved_bytes_per_param * model.n_params
    need = int(files * margin + saved)
    free = kit_env.disk_free_bytes(Path(path))
    if free < need:
        also = f" and {saved / 1e9:.1f} GB for the saved weights" if saved else ""
        raise kit_env.KitSetupError(
            f"NVMe offload of {model.name or 'this model'} ({model.n_params / 1e9:.2f}B parameters) needs about "
            f"{need / 1e9:.1f} GB at {path} ({files / 1e9:.1f} GB of files + {margin - 1:.0%} margin{also}), "
            f"but only {free / 1e9:.1f} GB are free there: free some space or point nvme_path at a bigger local disk.")
    return free


def disk_bandwidth(path: str | os.PathLike, megabytes: int = 256) -> tuple[float, float]:
    """(write, read) MB/s of the disk at ``path``: a file written with fsync, its cache dropped, read back."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / ".kit_bandwidth_probe"
    block = os.urandom(1 << 20)
    start = time.perf_counter()
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(megabytes):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    write = megabytes / (time.perf_counter() - start)
    fd = os.open(probe, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start = time.perf_counter()
        while os.read(fd, 1 << 20):
            pass
        read = megabytes / (time.perf_counter() - start)
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    runner.report({"probe": "disk", "path": str(folder), "megabytes": megabytes,
                      "write_mb_s": write, "read_mb_s": read})
    return write, read


def predicted_nvme_step_s(model: memory.ModelInfo, write_mb_s: float, read_mb_s: float,
                          weights_on_nvme: bool = True, micro_batches: int = 1,
                          trained: int | None = None) -> float:
    """A lower bound on an optimizer step's time: the optimizer states (12 B per ``trained``
    parameter; None: all) read and written once per step, and with the weights on NVMe the fp16
    parameters (2 B/param) read twice (forward and backward) for each of the step's
    ``micro_batches``."""
    p = model.n_params
    weights = (4 * p / 1e6) / read_mb_s * micro_batches if weights_on_nvme else 0.0
    return (12 * (trained or p) / 1e6) * (1 / read_mb_s + 1 / write_mb_s) + weights


@dataclass
class Rung:
    """One (model size, method) of the ladder."""

    shape: str
    method: str
    result: runner.RunResult
    n_params: int
    ram_limit_bytes: int | None = None  # the run was killed past this (its share of the notebook's RAM)
    spec: runner.RunSpec | None = None  # what ran (None: not tried)


def run_ladder(shapes: list[str], environment: kit_env.Environment, micro_batch: int, seq_len: int, steps: int,
               nvme_path: str | os.PathLike, nvme_ready: bool, ram_limit_bytes: int | None,
               headline: str | None = None, budget_minutes: float | None = None, progress: bool = True) -> list[Rung]:
    """Every size with every method, smallest first. A method stops climbing once a size fails for
    it (except stage 0 at ``headline``, run to show that it does not fit). Past ``headline`` (or
    from the start without one) a method also stops once its next rung, predicted from its last one
    (wall time scaled by parameters), would end past ``budget_minutes`` (0: stop at the headline).
    A method that freezes the embedding is tried only at a size :data:`NVME_OPTIMIZER` (where the
    ladder runs it) could not train whole: it failed there, or at a smaller size (the lever for
    what does not fit whole); past the headline its time is predicted from that method's last."""
    import dataclasses

    from tqdm.auto import tqdm

    if ram_limit_bytes:  # configs sized (pinned buffers, sub-groups) to the RAM each run really has
        environment = dataclasses.replace(
            environment, ram_budget_bytes=min(environment.ram_budget_bytes, ram_limit_bytes))
    rungs, stopped, failed, last = [], set(), set(), {}
    start = time.perf_counter()
    todo = [(shape, method) for shape in shapes for method in METHODS]
    for shape, (method, choice) in tqdm(todo, desc="ladder", disable=not progress):
        info = memory.ModelInfo.for_shape(shape)
        frozen = bool(choice.get("freeze_embeddings"))  # a method may train all but the embedding
        choice = {k: v for k, v in choice.items() if k != "freeze_embeddings"}
        skip = lambda status, why: rungs.append(Rung(shape, method, runner.RunResult(method, status, why),
                                                     info.n_params, ram_limit_bytes))
        if frozen and nvme_ready and not could_not_train_whole(rungs, shape, failed):
            skip(runner.NOT_TRIED, LEVER_NOT_NEEDED)
            continue
        if method in stopped and not (shape == headline and choice["stage"] == 0):
            skip(runner.NOT_TRIED, "a smaller size already failed, or the time budget ran out")
            continue
        past_headline = headline is None or (headline in shapes and shapes.index(shape) > shapes.index(headline))
        ref = method if method in last else (NVME_OPTIMIZER if frozen else None)
        if budget_minutes is not None and past_headline and ref in last:
            n, wall = last[ref]
            predicted = wall * info.n_params / n
            elapsed = time.perf_counter() - start
            if elapsed + predicted > 60 * budget_minutes:
                skip(runner.NOT_TRIED, f"would take about {predicted / 60:.0f} min (the last size took {wall / 60:.1f}), "
                                  f"past the ladder's budget of {budget_minutes:g} min: raise LADDER_MINUTES to climb further")
                stopped.add(method)
                continue
        save_dir = None
        if "nvme" in choice.values():
            if not nvme_ready:
                skip(runner.NOT_HERE, "libaio missing: apt-get install -y libaio-dev")
                continue
            ds = config.zero_infinity(info, environment, micro_batch, Path(nvme_path) / f"{shape}", steps,
                                      offload_param=choice.get("offload_param", "none"),
                                      frozen_embeddings=frozen)
            if saves(shapes, shape, headline):
                save_dir = str(Path(nvme_path) / f"{shape}-saved")
            try:
                check_disk(info, nvme_path, weights_on_nvme=choice.get("offload_param") == "nvme",
                           frozen_embeddings=frozen,
                           saved_bytes_per_param=runner.bytes_per_param(ds) if save_dir else 0)
            except kit_env.KitSetupError as err:
                skip(runner.REFUSED_DISK, str(err))
                stopped.add(method)
                failed.add(method)
                continue
        else:
            ds = config.build(**choice, micro_batch=micro_batch, trainer=False, environment=environment,
                              pin_memory=False, **config.short_run_schedule(info, steps))
        spec = runner.RunSpec(ds_config=ds, shape=shape, seq_len=seq_len, steps=steps,
                             grad_ckpt=True, label=f"{shape} {method}", ram_limit_bytes=ram_limit_bytes,
                             zero_init=choice["stage"] == 3, timeout_s=3600, freeze_embeddings=frozen,
                             save_reload_dir=save_dir)
        result = runner.measure(spec)
        rungs.append(Rung(shape, method, result, info.n_params, ram_limit_bytes, spec))
        if result.status == runner.OK:
            last[method] = (info.n_params, result.wall_s)
        else:
            stopped.add(method)
            failed.add(method)
    return rungs


def saves(shapes: list[str], shape: str, headline: str | None) -> bool:
    """Whether an NVMe rung at ``shape`` saves its weights and reloads them (the run's
    ``save_reload_dir``): at ``headline`` and the sizes past it, the ladder's top."""
    return headline in shapes and shapes.index(shape) >= shapes.index(headline)


def could_not_train_whole(rungs: list[Rung], shape: str, failed: set[str]) -> bool:
    """Whether :data:`NVME_OPTIMIZER` could not train ``shape`` with every parameter: its rung there
    failed, or was not tried because a smaller size had failed (not for the time budget). True
    where the ladder does not run that method at all (tools/gpu_nvme_rung.py runs one)."""
    if not any(m == NVME_OPTIMIZER for m, _ in METHODS):
        return True
    whole = next((r for r in rungs if r.shape == shape and r.method == NVME_OPTIMIZER), None)
    if whole is None or whole.result.status in (runner.OK, runner.NOT_HERE):
        return False
    return whole.result.status != runner.NOT_TRIED or NVME_OPTIMIZER in failed


def ladder_table(rungs: list[Rung], environment: kit_env.Environment | None = None) -> Table:
    """Every rung: status, peaks, step time, loss; the title says where it was measured."""
    rows = [(r.shape, f"{r.n_params / 1e6:,.0f}M", r.method, *runner.result_cells(r.result, 90)) for r in rungs]
    return Table(["model", "parameters", "method", *runner.RESULT_COLUMNS], rows,
                 title="The ladder" + (f", {environment.measured_on()}" if environment else ""),
                 note=runner.fixes_note([r.result for r in rungs],
                                        [f"{r.shape} {r.method}" for r in rungs]))


def largest_per_method(rungs: list[Rung]) -> dict[str, Rung | None]:
    """The largest size that trained under each method (None when none did)."""
    out: dict[str, Rung | None] = {m: None for m, _ in METHODS}
    for r in rungs:
        if r.result.status == runner.OK and (out[r.method] is None or r.n_params > out[r.method].n_params):
            out[r.method] = r
    return out


def largest_table(rungs: list[Rung]) -> Table:
    """The largest size that trained under each method, with its step time and peaks."""
    rows = []
    for method, r in largest_per_method(rungs).items():
        if r is None:
            rows.append((method, "none", "-", "-", "-", "-"))
        else:
            rows.append((method, r.shape, f"{r.n_params / 1e6:,.0f}M", show.seconds(r.result.median_step_s),
                         show.gib(r.result.peak_gpu_allocated_bytes), show.gib(r.result.peak_host_rss_bytes)))
    return Table(["method", "largest trained", "parameters", "s/step", "GPU GiB", "host RSS GiB"], rows,
                 title="The largest model per method")


def largest_title(environment: kit_env.Environment) -> str:
    """The title of :func:`plot_largest`: a T4's envelope only where the runs had one (a GPU capped
    as a T4); elsewhere it says what the bars are."""
    if environment.has_gpu and environment.emulation:
        return "Inside the T4 envelope: a T4's GPU, free Colab's RAM"
    return f"Largest model each method trained, {environment.measured_on()}"


def plot_largest(rungs: list[Rung], environment: kit_env.Environment):
    import matplotlib.pyplot as plt

    best = largest_per_method(rungs)
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    names = list(best)
    ax.barh(names, [(b.n_params / 1e9 if b else 0) for b in best.values()],
            color=["gray", "tab:orange", "tab:green", "tab:blue", "tab:purple"][:len(names)])
    for i, b in enumerate(best.values()):
        ax.text((b.n_params / 1e9 if b else 0), i, f" {b.shape} ({b.result.median_step_s:.1f} s/step)" if b else " none",
                va="center", fontsize=8)
    ax.set_xlabel("largest model trained (billions of parameters)")
    ax.set_title(largest_title(environment), fontsize=9)
    fig.tight_layout()
    return fig


#: The phases of a run's host RSS (helpers.runner.PhaseTrace, recorded by every run), as the table names them.
RSS_PHASES = [("model built", "model built"), ("deepspeed.initialize", "after initialize"),
              ("forward and backward", "forward+backward"), ("optimizer step", "optimizer step"),
              (runner.SAVE_PHASE, "save"), (runner.RELOAD_PHASE, "reload")]
#: What the optimizer step may add to host RSS over forward and backward, at most: the estimator's
#: step temporaries with the optimizer on NVMe (memory.STEP_SUB_GROUP_BYTES per element of the
#: largest optimizer sub-group) with this margin. DeepSpeed's own overflow check would add 3 bytes
#: per parameter on top (GPT-2 XL, +4.35 GiB); helpers.deepspeed_fixes checks in slices.
STEP_RISE_MARGIN = 1.25
STEP_RISE_FLOOR = 256 * 2**20  # small models: allocator noise, not a per-parameter cost


def phase_peaks(result: runner.RunResult) -> dict[str, int]:
    """Peak host RSS per phase of one run (empty when the run recorded none)."""
    return {p["name"]: p["peak_bytes"] for p in result.rss_phases}


def step_rise(result: runner.RunResult) -> int | None:
    """How far the optimizer step's RSS peak rose above forward and backward's (None: not recorded)."""
    peaks = phase_peaks(result)
    if "optimizer step" not in peaks or "forward and backward" not in peaks:
        return None
    return peaks["optimizer step"] - peaks["forward and backward"]


def largest_sub_group(rung: Rung) -> int:
    """Elements in the largest optimizer sub-group of the config a rung ran (DeepSpeed's grouping)."""
    zero = (rung.spec.ds_config if rung.spec else {}).get("zero_optimization", {})
    info = memory.ModelInfo.for_shape(rung.shape)
    if rung.spec and rung.spec.freeze_embeddings:  # the embedding is in no sub-group
        info = memory.without_embedding(info)
    return memory.largest_sub_group_numel(info, int(zero.get("sub_group_size", 1e9)))


def step_rise_limit(rung: Rung) -> int:
    """The most an NVMe rung's optimizer step may add to host RSS: :data:`STEP_RISE_MARGIN` x the
    estimator's step temporaries (or the floor, for small models' allocator noise)."""
    step = memory.STEP_SUB_GROUP_BYTES * largest_sub_group(rung)
    return int(max(STEP_RISE_FLOOR, STEP_RISE_MARGIN * step))


def step_rise_ok(rung: Rung) -> bool:
    """The optimizer step's rise over forward and backward stays within :func:`step_rise_limit`."""
    rise = step_rise(rung.result)
    return rise is not None and rise <= step_rise_limit(rung)


def nvme_table(rungs: list[Rung], write_mb_s: float, read_mb_s: float) -> Table:
    """Every ZeRO-3 + NVMe rung that ran: its step time against the disk's lower bound, where host
    RAM went (peak RSS per phase of the run, GiB; the save and reload at the ladder's top), and how far
    the reloaded save's logits are from the trained model's ("-": no save)."""
    rows = []
    for r in rungs:
        if not is_nvme(r.method) or r.result.status != runner.OK:
            continue
        info = memory.ModelInfo.for_shape(r.shape)
        bound = predicted_nvme_step_s(info, write_mb_s, read_mb_s, weights_on_nvme=weights_on_nvme(r),
                                      trained=r.result.n_trainable or None)
        step = r.result.median_step_s
        peaks = phase_peaks(r.result)
        rows.append((r.shape, f"{r.n_params / 1e6:,.0f}M", r.method.removeprefix("ZeRO-3 + "),
                     show.seconds(step), show.seconds(bound),
                     f"{step / bound:.1f}x" if step and bound else "-",
                     *(show.gib(peaks.get(name)) for name, _ in RSS_PHASES),
                     show.gib(r.result.peak_host_rss_bytes or None),
                     show.MISSING if r.result.reload_logit_diff is None else f"{r.result.reload_logit_diff:.1e}"))
    return Table(["model", "parameters", "NVMe holds", "s/step", "disk bound s", "vs bound",
                  *(f"RSS {label}" for _, label in RSS_PHASES), "peak RSS (parent)",
                  "reload logit diff"], rows,
                 title="ZeRO-3 + NVMe: time against the disk, host RAM (GiB) by phase")


def rung_estimate(rung: Rung, environment: kit_env.Environment) -> memory.Estimate | None:
    """The kit's estimate for what a rung ran, its 16-bit save included (None: not tried)."""
    spec = rung.spec
    if spec is None:
        return None
    return memory.estimate(memory.ModelInfo.for_shape(rung.shape), spec.ds_config,
                           seq_len=spec.seq_len, grad_ckpt=spec.grad_ckpt,
                           on_gpu=environment.has_gpu, zero_init=spec.zero_init,
                           frozen_embeddings=spec.freeze_embeddings,
                           save_shard_bytes=memory.SAVE_SHARD_BYTES if spec.save_reload_dir else 0)


def rung_verdict(rung: Rung, environment: kit_env.Environment) -> str | None:
    """The estimator's verdict for a rung against the limits it ran under: the GPU cap and the
    run's RAM budget (None for a rung not tried)."""
    est = rung_estimate(rung, environment)
    if est is None:
        return None
    limits = {"gpu": environment.vram_total_bytes if environment.has_gpu else None,
              "cpu": rung.ram_limit_bytes or environment.ram_budget_bytes}
    needs = {"gpu": est.total("gpu"), "cpu": est.total("cpu")}
    return memory.worst_verdict([v.word for v in memory.verdicts(needs, limits).values()])


def prediction_table(rungs: list[Rung], environment: kit_env.Environment) -> Table:
    """Each rung tried: predicted and measured GPU and host peaks (GiB), and the verdict the
    estimator gave before the run, against what happened."""
    rows = []
    for r in rungs:
        est = rung_estimate(r, environment)
        if est is None:
            continue
        res = r.result
        err = lambda pred, meas: f"{(pred - meas) / meas:+.0%}" if meas else "-"
        rows.append((r.shape, r.method, rung_verdict(r, environment), res.status,
                     show.gib(est.total("gpu")) if environment.has_gpu else "-",
                     show.gib(res.peak_gpu_allocated_bytes),
                     err(est.total("gpu"), res.peak_gpu_allocated_bytes) if environment.has_gpu else "-",
                     show.gib(est.total("cpu")), show.gib(res.peak_host_rss_bytes or None),
                     err(est.total("cpu"), res.peak_host_rss_bytes) if res.status == runner.OK else "-"))
    return Table(["model", "method", "predicted", "happened", "GPU pred", "GPU meas", "GPU err",
                  "host pred", "host meas", "host err"], rows,
                 title="The estimator before each rung, against the run (GiB)")


def prediction_claims(rungs: list[Rung], environment: kit_env.Environment,
                      gpu_rtol: float = 0.10, host_rtol: float = 0.15) -> list[claims.Claim]:
    """The estimator's claims on this ladder: no rung it called "fits" ran out of GPU memory or
    was killed for RAM; on a GPU, each ZeRO-3 + NVMe rung that ran is within ``gpu_rtol`` on GPU
    memory and ``host_rtol`` on host RAM (on a CPU the tiny rungs are mostly the process's base; the
    GPT-2 reference rung is left out of the tolerance: the table shows its error)."""
    tried = [r for r in rungs if r.spec is not None and runner.explained(r.result)]
    fits = [r for r in tried if rung_verdict(r, environment) == memory.FITS]
    out = [("no rung the estimator called 'fits' ran out of GPU memory or was killed for RAM "
            f"({len(fits)} called 'fits')",
            claims.every(r.result.status not in (runner.OOM, runner.KILLED_RAM) for r in fits))]
    if environment.has_gpu:  # the modern shapes the issue holds it to (GPT-2 124M: a reference)
        ran = [r for r in tried if is_nvme(r.method) and r.result.status == runner.OK
               and not r.shape.startswith("gpt2")]
        for r in ran:
            est = rung_estimate(r, environment)
            out.append((f"{r.shape} {r.method}: predicted within {gpu_rtol:.0%} on the GPU and "
                        f"{host_rtol:.0%} on host RAM",
                        claims.within(est.total("gpu"), r.result.peak_gpu_allocated_bytes, gpu_rtol)
                        and claims.within(est.total("cpu"), r.result.peak_host_rss_bytes, host_rtol)))
    return out


def host_breakdown_table(shapes: list[str], environment: kit_env.Environment, micro_batch: int,
                         seq_len: int, nvme_path: str | os.PathLike) -> Table:
    """Where a ZeRO-Infinity run's host RAM goes on a T4 (a GPU beside the host, whatever this
    machine has), predicted for each shape and the NVMe methods (GiB): the consumers a big
    vocabulary inflates (swap buffers sized to the embedding) beside the ones that grow with every
    parameter (the fp16 gradient partition), and with the embedding frozen where the optimizer on
    NVMe does not fit whole. Computed for a T4 on any machine (fp16 weights and gradients, free
    Colab's RAM): a CPU's fp32 would make every host figure a T4's and a half."""
    t4 = config.t4_profile(environment)
    kinds = [("process", "process"), ("zero.Init build", "model build"), ("grads", "fp16 grads"),
             ("optimizer swap buffers", "optimizer buffers"),
             ("parameter swap buffers", "weight buffers"), ("step temporaries", "step")]
    rows = []
    for shape in shapes:
        info = memory.ModelInfo.for_shape(shape)
        whole_fits = True
        for method, choice in METHODS:
            frozen = bool(choice.get("freeze_embeddings"))
            if not is_nvme(method) or (frozen and whole_fits):
                continue
            ds = config.zero_infinity(info, t4, micro_batch, nvme_path,
                                      offload_param=choice.get("offload_param", "none"),
                                      frozen_embeddings=frozen)
            est = memory.estimate(info, ds, seq_len=seq_len, on_gpu=True, zero_init=True,
                                  frozen_embeddings=frozen)
            if method == NVME_OPTIMIZER:
                whole_fits = est.total("cpu") <= t4.ram_budget_bytes
            cpu = est.parts.get("cpu", {})
            rows.append((shape, f"{info.n_params / 1e6:,.0f}M", f"{info.largest_param_numel / 1e6:,.0f}M",
                         method.removeprefix("ZeRO-3 + "),
                         *(show.gib(cpu.get(k) or None) for k, _ in kinds),
                         show.gib(est.total("cpu")), show.gib(est.total("gpu"))))
    return Table(["model", "parameters", "largest tensor", "NVMe holds",
                  *(label for _, label in kinds), "host total", "GPU"], rows,
                 title="Where host RAM goes under ZeRO-Infinity on a T4, predicted (GiB)")


def throughput_table(rungs: list[Rung], write_mb_s: float, read_mb_s: float,
                     accumulations: tuple[int, ...] = (1, 4, 16)) -> Table:
    """Tokens/s and hours per million training tokens for each NVMe rung that ran, and what
    gradient accumulation would make of them: each optimizer step reads and writes the optimizer
    states once (the disk's bound for that part, from the probe), whatever the number of
    micro-batches, so k micro-batches per step cost ``fixed + k x (measured - fixed)``: a
    pessimistic split, since a real optimizer step runs slower than the disk's bound and every
    second of that is counted as a micro-batch's."""
    rows = []
    for r in rungs:
        if not is_nvme(r.method) or r.result.status != runner.OK or not r.result.median_step_s:
            continue
        info = memory.ModelInfo.for_shape(r.shape)
        fixed = predicted_nvme_step_s(info, write_mb_s, read_mb_s, weights_on_nvme=False,
                                      trained=r.result.n_trainable or None)
        per_micro = max(r.result.median_step_s - fixed, 0.0)
        tokens = r.spec.micro_batch * r.spec.seq_len
        cells = []
        for k in accumulations:
            step = fixed + k * per_micro
            cells += [f"{k * tokens / step:,.0f}", f"{1e6 * step / (k * tokens) / 3600:.1f}"]
        k = accumulations[-1]
        cells.append(f"{1000 * (fixed + k * per_micro) / 3600:.1f}")
        rows.append((r.shape, r.method.removeprefix("ZeRO-3 + "), show.seconds(r.result.median_step_s),
                     show.seconds(fixed), *cells))
    head = [h for k in accumulations for h in (f"tok/s, {k} micro", f"h per M tok, {k} micro")]
    return Table(["model", "NVMe holds", "s/step (1 micro)", "optimizer I/O s", *head,
                  f"h for 1,000 steps of {accumulations[-1]}"], rows,
                 title="Throughput a learner can plan with (from this run's step times and disk probe)")


def starting_loss_ok(result: runner.RunResult, vocab: int, tolerance: float = 1.5) -> bool:
    """The first loss is near ln(vocab), as a freshly initialised model's should be (not ~100)."""
    return bool(result.losses) and abs(result.losses[0] - math.log(vocab)) <= tolerance


def refusal_message(path: str | os.PathLike) -> str:
    """What check_disk says for a model far too big for the disk at ``path`` (notebook 06 shows it)."""
    huge = memory.ModelInfo.from_count(10**13, name="a 10-trillion-parameter model")
    try:
        check_disk(huge, path)
    except kit_env.KitSetupError as err:
        return str(err)
    return "the disk is big enough even for that"


def checks(rungs: list[Rung], environment: kit_env.Environment, headline: str | None,
           nvme_ready: bool) -> list[claims.Claim]:
    """Notebook 06's claims, each able to fail on a bad ladder. The smallest size trains under every
    method. Where libaio is ready, ZeRO-3 + NVMe trains at least one size, each NVMe run starts near
    ln(its vocabulary) and its loss falls (the shared trend rule). With ``headline``: that size trains
    with ZeRO-3 + NVMe for at least 5 steps with a falling loss, its peak host RSS within the RAM
    budget (and on a GPU its peak within the GPU cap, under T4 emulation); on a GPU the same size
    under stage 0 runs out of GPU memory."""
    nvme_ok = [r for r in rungs if is_nvme(r.method) and r.result.status == runner.OK]
    smallest = rungs[0].shape if rungs else None
    first = [r for r in rungs if r.shape == smallest and "nvme" not in r.method.lower()]
    out = [("every rung ran, or hit a limit, or says why it did not run (no errors)",
            claims.every(runner.explained(r.result) for r in rungs)),
           (f"the smallest size ({smallest}) trained under stage 0 and ZeRO-2 + CPU offload",
            claims.every(r.result.status == runner.OK for r in first))]
    if nvme_ready:
        vocab = lambda r: memory.ModelInfo.for_shape(r.shape).vocab
        out += [(f"libaio is ready, so ZeRO-3 + NVMe trained ({len(nvme_ok)} runs)", bool(nvme_ok)),
                ("NVMe runs start from a normal loss (about ln of the vocabulary, not ~100)",
                 claims.every(starting_loss_ok(r.result, vocab(r)) for r in nvme_ok))]
        out += [claims.loss_falls_claim(f"{r.shape} {r.method}", r.result.losses) for r in nvme_ok]
        out.append((f"the optimizer step adds at most {STEP_RISE_MARGIN:g} x "
                    f"{memory.STEP_SUB_GROUP_BYTES} bytes per element of the largest optimizer "
                    "sub-group to host RAM over forward and backward (ZeRO-3 + NVMe; DeepSpeed's own "
                    "overflow check would add 3 bytes per parameter)",
                    claims.every(step_rise_ok(r) for r in nvme_ok)))
    else:
        nvme_rows = [r for r in rungs if is_nvme(r.method)]
        out.append(("libaio is missing, so every ZeRO-3 + NVMe rung is reported as not run here, with"
                    " the command that installs it (no NVMe claim is made)",
                    bool(nvme_rows) and claims.every(r.result.status == runner.NOT_HERE
                                                     and "libaio" in r.result.message
                                                     for r in nvme_rows)))
    if headline and nvme_ready:
        # the headline, every parameter trained, under either whole NVMe method: the lower RAM peak
        tops = sorted((r for r in nvme_ok if r.shape == headline and r.method != NVME_FROZEN),
                      key=lambda r: peak_rss_seen(r.result))
        top = tops[0] if tops else None
        res = top.result if top else None
        budget = (top and top.ram_limit_bytes) or environment.ram_budget_bytes
        out += [(f"{headline} trains with ZeRO-3 + NVMe" + (f" ({top.method})" if top else ""),
                 bool(top)),
                (f"{headline}: at least 5 optimizer steps", bool(res) and res.steps_done >= 5),
                claims.loss_falls_claim(headline, res.losses if res else []),
                (f"{headline}: peak host RSS within the run's {budget / 1e9:.1f} GB RAM budget"
                 " (sampled, and the process's own high-water mark)",
                 bool(res) and 0 < peak_rss_seen(res) <= budget)]
        out.append((f"the NVMe runs from {headline} up save their weights in shards that "
                    "from_pretrained reloads to the trained logits", reloads_ok(saving(rungs))))
    if headline and environment.has_gpu:
        plain = next((r for r in rungs if r.shape == headline and r.method.startswith("stage 0")), None)
        out.append((f"{headline} under stage 0 runs out of GPU memory",
                    bool(plain and plain.result.status == runner.OOM)))
        if nvme_ready:  # held to a T4's allocator on any GPU: on a real T4, or a bigger one
            out.append(t4_gpu_claim(f"{headline}: peak GPU memory",
                                    res.peak_gpu_allocated_bytes if res else None, environment))
    return out


def saving(rungs: list[Rung]) -> list[Rung]:
    """The rungs that were to save and reload and got that far: trained (whatever their save did),
    or stopped while saving or reloading (killed for RAM there)."""
    return [r for r in rungs if r.spec and r.spec.save_reload_dir
            and (r.result.status == runner.OK
                 or r.result.last_phase in (runner.SAVE_PHASE, runner.RELOAD_PHASE))]


def reloads_ok(rungs: list[Rung]) -> bool:
    """Whether ``rungs`` (at least one) each reloaded their save within :data:`RELOAD_TOL` of their
    precision; a run that did not save, or saved and failed, does not hold."""
    return bool(rungs) and claims.every(
        r.result.reload_logit_diff is not None
        and r.result.reload_logit_diff <= RELOAD_TOL[runner.precision_of(r.spec.ds_config)]
        for r in rungs)


def peak_rss_seen(result: runner.RunResult) -> int:
    """A run's host RAM peak: the tree's RSS sampled every 0.1 s (what the kill acts on) or, where
    higher, a rank's own high-water mark (getrusage), which also sees a peak between two samples."""
    marks = [r.get("rss_high_water_bytes") or 0 for r in result.ranks]
    return max([result.peak_host_rss_bytes, *marks])


def summary(rungs: list[Rung], claims_held: list[claims.Claim]) -> str:
    """Facts that read the same on a CPU and on a T4 (what notebook 06 compares with nbval)."""
    return "\n".join([
        "methods: " + ", ".join(m for m, _ in METHODS),
        f"every rung ran or explained itself: {claims.every(runner.explained(r.result) for r in rungs)}",
        f"all checks held: {claims.every(held for _, held in claims_held)}",
    ])


def takeaways(rungs: list[Rung], environment: kit_env.Environment) -> list[str]:
    """Notebook 06's summary: the largest model each method trained here, from this run."""
    lines = []
    for method, r in largest_per_method(rungs).items():
        levers = [x for x in rungs if x.method == method == NVME_FROZEN]
        if r is None and levers and all(x.result.message == LEVER_NOT_NEEDED for x in levers):
            lines.append(f"{method}: not needed here ({NVME_OPTIMIZER} trained every size it tried).")
            continue
        if r is None:
            lines.append(f"{method}: no size trained here.")
            continue
        gpu = f"{r.result.peak_gpu_allocated_bytes / GiB:.2f} GiB GPU, " if environment.has_gpu else ""
        lines.append(f"{method}: up to {r.shape} ({r.n_params / 1e6:,.0f}M parameters), {gpu}"
                     f"{r.result.peak_host_rss_bytes / GiB:.1f} GiB RAM, {r.result.median_step_s:.2f} s a step.")
    nvme = [r for r in rungs if is_nvme(r.method) and r.result.status == runner.OK]
    if nvme and phase_peaks(nvme[-1].result):
        top = nvme[-1]
        peaks, rise = phase_peaks(top.result), step_rise(top.result) or 0
        lines.append(f"Host RAM at {top.shape} under {top.method}: {peaks.get('model built', 0) / GiB:.1f}"
                     f" GiB once built, {peaks.get('deepspeed.initialize', 0) / GiB:.1f} GiB after "
                     f"deepspeed.initialize, the optimizer step {rise / GiB:+.2f} GiB over forward and "
                     f"backward ({rise / largest_sub_group(top):.1f} bytes per element of its "
                     f"largest optimizer sub-group, {largest_sub_group(top) / 1e6:,.1f}M).")
    saved = [r for r in nvme if r.result.reload_logit_diff is not None]
    if saved:
        top = saved[-1]
        kind = runner.precision_of(top.spec.ds_config) if top.spec else "16-bit"
        lines.append(f"Saved at {top.shape}: {top.result.saved_bytes / 1e9:.2f} GB of {kind} shards in "
                     f"{top.result.save_s:.0f} s, host RAM "
                     f"{phase_peaks(top.result).get(runner.SAVE_PHASE, 0) / GiB:.1f} GiB while saving; "
                     f"from_pretrained's reload gives its logits within {top.result.reload_logit_diff:.1e}.")
    lines += [f"The save at {r.shape} under {r.method} failed: {r.result.save_error}"
              for r in rungs if r.result.save_error]
    stopped = [r for r in rungs if r.result.status not in (runner.OK, runner.NOT_TRIED)]
    if stopped:
        first = stopped[0]
        lines.append(f"The first limit hit: {first.shape} under {first.method}: {first.result.status}.")
    lines += [ram_wall_line(r, environment) for r in rungs
              if is_nvme(r.method) and r.result.status == runner.KILLED_RAM]
    lines.append("Next: 07 · the DeepSpeed engine by hand and Accelerate: the same config without the Trainer.")
    return lines


#: the estimator's host consumers, as the wall's line names them
CONSUMER_NAMES = {"grads": "the fp16 gradient partition",
                  "optimizer swap buffers": "the optimizer's swap buffers",
                  "parameter swap buffers": "the weights' swap buffers"}


def ops_needed(offload: str, nvme_ready: bool) -> list[str]:
    """The DeepSpeed ops notebook 06 cannot run without: CPU Adam for any offload; async_io where
    NVMe is used (the fine-tune's ``offload``, or the ladder's NVMe rungs wherever libaio is
    ready)."""
    return ["cpu_adam"] + (["async_io"] if offload == "nvme" or nvme_ready else [])


def ram_wall_line(rung: Rung, environment: kit_env.Environment, top: int = 2) -> str:
    """For a ZeRO-3 + NVMe rung killed for host RAM: what stopped it, as the estimator splits host
    RAM for what it ran (its largest consumers), beside where the kill came."""
    res = rung.result
    limit = rung.ram_limit_bytes or 0
    by = (f"past {limit / GB:.1f}" if 0 < limit < res.peak_host_rss_bytes
          else "by the system's out-of-memory killer")
    head = (f"{rung.shape} under {rung.method}: killed for host RAM at "
            f"{res.peak_host_rss_bytes / GB:.1f} GB ({by})"
            + (f", in {res.last_phase}" if res.last_phase else ""))
    est = rung_estimate(rung, environment)
    parts = sorted((est.parts.get("cpu", {}) if est else {}).items(), key=lambda kv: -kv[1])[:top]
    if not parts:
        return head + "."
    named = " and ".join(f"{CONSUMER_NAMES.get(name, name)} {size / GiB:.2f} GiB"
                         for name, size in parts)
    return (f"{head}. The estimator's {est.total('cpu') / GiB:.2f} GiB for it are mostly"
            f" {named}: the wall to move first.")


# ---- the fine-tune, watched ----------------------------------------------------------------------
#: Notebook 06's fine-tune, watched: the learner's own cells load a pretrained model under ZeRO-3,
#: train it with ZeRO-Infinity's offload, evaluate, save and reload; this module only measures around
#: them (host RAM of the kernel, GPU memory, time), reads fp16 overflow, and holds the checks.
#:
#: The fine-tune runs in the notebook's kernel, as it will in the learner's own notebook, so its host
#: RAM is the kernel's: sampled from before the weights load, through ``deepspeed.initialize`` and
#: every step, with the kernel's high-water mark (``getrusage``) read at the end where it rose.


#: Reloaded 16-bit weights give the trained model's logits up to this much (fp32 runs: 1e-3).
RELOAD_TOL = {"fp32": 1e-3, "bf16": 0.1, "fp16": 5e-2}
#: More skipped optimizer steps than this share of the run is not fp16's normal start.


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
    param_offload: str = ""  # ...and the fp16 weights ("none": on the GPU)
    trace: list[dict] = field(default_factory=list)

    @property
    def median_step_s(self) -> float:
        ordered = sorted(self.step_seconds)
        return ordered[len(ordered) // 2] if ordered else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.median_step_s if self.step_seconds else math.nan


def release_kernel_memory() -> tuple[int, int]:
    """Hand what the fine-tune freed back to the operating system before the ladder measures what
    is left: Python's garbage (cycles), PyTorch's cached GPU blocks, and the free heap that glibc
    keeps (``malloc_trim``). Returns this kernel's RSS (bytes) before and after."""
    import ctypes
    import gc

    import psutil
    import torch

    before = psutil.Process().memory_info().rss
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing more to hand back
        pass
    return before, psutil.Process().memory_info().rss


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
        # the trace reads (and resets) torch's GPU peak at each phase it closes: its record holds
        # the whole fine-tune's, torch's own counter only what came after
        gpu = self._trace.gpu_high if self._cuda else None
        return FinetuneRun(list(losses), list(step_seconds), int(skipped_steps), tokens_per_step,
                           wall_s, peak, gpu, offload_of(engine), offload_of(engine, "param"), phases)


def offload_of(engine, what: str = "optimizer") -> str:
    """The device DeepSpeed offloads the optimizer's states (or, with ``what="param"``, the fp16
    weights) to ("nvme", "cpu", "none"), as the engine itself reads its config ("" without an
    engine)."""
    read = {"optimizer": "zero_offload_optimizer", "param": "zero_offload_param"}[what]
    offload = getattr(engine, read)() if engine is not None else None
    device = getattr(offload, "device", None)
    return str(getattr(device, "value", device) or ("none" if engine is not None else ""))


def overflow_advice(run: FinetuneRun, precision: str, steps: int) -> str:
    """claims.overflow_advice for the fine-tune's run."""
    return claims.overflow_advice(run.skipped_steps, precision, steps)


def finetune_table(run: FinetuneRun, environment: kit_env.Environment, eval_before: float,
              eval_after: float, offload: str) -> Table:
    """The fine-tune in one table: memory, time, throughput, held-out loss before and after."""
    gpu = "-" if run.peak_gpu_allocated_bytes is None else f"{run.peak_gpu_allocated_bytes / GiB:.2f} GiB"
    hours_per_m = 1e6 / run.tokens_per_s / 3600 if run.tokens_per_s > 0 else math.nan
    rows = [("offload of the optimizer's states", offload),
            ("offload of the fp16 weights", {"none": "none (on the GPU)"}.get(
                run.param_offload, run.param_offload or "-")),
            ("peak GPU memory (allocated)", gpu),
            ("peak host RAM of this kernel", f"{run.peak_host_rss_bytes / GB:.2f} GB "
             f"(the notebook has {environment.notebook_ram_bytes / GB:.1f} GB)"),
            ("median seconds per optimizer step", f"{run.median_step_s:.2f}"),
            ("tokens per second", f"{run.tokens_per_s:,.0f}"),
            ("hours per million training tokens", f"{hours_per_m:.2f}"),
            ("steps skipped for fp16 overflow", str(run.skipped_steps)),
            ("held-out loss before / after", f"{eval_before:.4f} / {eval_after:.4f}")]
    return Table(["measured", "value"], rows, title="The fine-tune, as this run measured it")


def finetune_checks(run: FinetuneRun, eval_before: float, eval_after: float, logit_diff: float,
           precision: str, environment: kit_env.Environment,
           vocab: int | None = None) -> list[claims.Claim]:
    """The fine-tune's claims, each able to fail: the training loss falls (the shared rule; from a
    pretrained start, see :func:`helpers.claims.training_loss_claim`), the held-out loss falls, most optimizer
    steps were taken (not skipped for overflow), the reloaded folder gives the trained logits, host
    RAM stayed within the budget, and on a GPU the peak fits a T4's allocator."""
    steps = len(run.losses)
    tol = RELOAD_TOL.get(precision, RELOAD_TOL["fp16"])
    runner.report({"probe": "finetune", "losses": run.losses, "step_seconds": run.step_seconds,
                   "skipped_steps": run.skipped_steps, "tokens_per_step": run.tokens_per_step,
                   "peak_host_rss_bytes": run.peak_host_rss_bytes,
                   "peak_gpu_allocated_bytes": run.peak_gpu_allocated_bytes, "offload": run.offload,
                   "param_offload": run.param_offload,
                   "eval_before": eval_before, "eval_after": eval_after, "logit_diff": logit_diff,
                   "kernel_rss_bytes": environment.kernel_rss_bytes,
                   "notebook_ram_bytes": environment.notebook_ram_bytes,
                   "gpu_cap_bytes": environment.gpu_cap_bytes, "wall_s": run.wall_s,
                   "trace": run.trace})
    out = [claims.training_loss_claim("fine-tune", run.losses, claims.pretrained_start(eval_before, vocab)),
           claims.held_out_claim(eval_before, eval_after),
           claims.skipped_claim(run.skipped_steps, steps),
           (f"the reloaded folder gives the trained model's logits (within {tol:g})",
            math.isfinite(logit_diff) and logit_diff <= tol),
           (f"peak host RAM of the kernel within the {environment.notebook_ram_bytes / GB:.1f} GB"
            " the notebook has", 0 < run.peak_host_rss_bytes <= environment.notebook_ram_bytes)]
    if environment.has_gpu:
        out.append(t4_gpu_claim("peak GPU memory", run.peak_gpu_allocated_bytes, environment))
    return out


#: How close a resumed run's first loss must come to the uninterrupted run's at the same step:
#: the same 16-bit weights and micro-batches give the same forward, up to kernels' rounding.
RESUME_RTOL = 1e-3


def resume_claim(resumed_loss: float, losses: list[float], kept_steps: int,
                 first_step: int = 0) -> claims.Claim:
    """A run resumed from the kept folder: its first step's loss equals the uninterrupted run's
    loss at that step (``losses`` began at ``first_step``) within :data:`RESUME_RTOL`. Stale
    weights, or micro-batches that do not start where the kept step stopped, fail it."""
    index = kept_steps - first_step
    if not 0 <= index < len(losses):
        return (f"resumed at step {kept_steps + 1}: this run has no loss for that step to compare "
                f"with (it trained steps {first_step + 1} to {first_step + len(losses)})", False)
    same = losses[index]
    return (f"resumed from the kept weights at step {kept_steps + 1}: loss {resumed_loss:.4f}, "
            f"the uninterrupted run's {same:.4f} (within {RESUME_RTOL:g})",
            math.isfinite(resumed_loss) and claims.within(resumed_loss, same, RESUME_RTOL))


def t4_gpu_claim(label: str, peak_bytes: int | None,
                 environment: kit_env.Environment) -> claims.Claim:
    """A run's peak GPU memory held to a T4's allocator (its 14.75 GiB less the CUDA context): under
    T4 emulation, on a real T4 (where the allocator's own limit is the whole card), or on a bigger
    GPU without emulation (where nothing else would stop a run past a T4)."""
    cap = kit_env.EMULATIONS["t4"].gpu_cap_bytes
    how = "T4 emulation" if environment.emulation else f"measured on {environment.gpu_name}"
    return (f"{label} within the {cap / GiB:.2f} GiB PyTorch has on a T4 ({how})",
            0 < (peak_bytes or 0) <= cap)


def finetune_takeaways(run: FinetuneRun, eval_before: float, eval_after: float, logit_diff: float,
              info, offload: str, frozen_embedding: bool = False) -> list[str]:
    """The fine-tune's summary lines, each figure from this run (``frozen_embedding``: the lesson's
    FREEZE_EMBEDDING, so all but the input embedding trained)."""
    gpu = ("" if run.peak_gpu_allocated_bytes is None
           else f"{run.peak_gpu_allocated_bytes / GiB:.2f} GiB of GPU, ")
    size = (f"{info.n_params / 1e9:.2f}B" if info.n_params >= 1e9 else f"{info.n_params / 1e6:,.1f}M")
    which = (f"all but the input embedding's {memory.embedding_numel(info):,}" if frozen_embedding
             else "every one")
    return [f"Fine-tuned {size} parameters ({which}, full Adam) with ZeRO-3 and"
            f" {offload} offload: {gpu}{run.peak_host_rss_bytes / GB:.1f} GB of host RAM at the"
            f" kernel's peak, {run.median_step_s:.1f} s per optimizer step"
            f" ({run.tokens_per_s:,.0f} tokens/s).",
            f"Held-out loss {eval_before:.3f} -> {eval_after:.3f}; the saved 16-bit folder reloads"
            f" with logits within {logit_diff:.1e} of the trained model's.",
            f"1,000 such steps would take about {1000 * run.median_step_s / 3600:.1f} hours at this"
            " pace: the disk's bandwidth sets it, and gradient accumulation spreads each step's"
            " NVMe traffic over more tokens."]


def finetune_summary(run: FinetuneRun, nvme_ready: bool, claims_held: list[claims.Claim]) -> str:
    """Facts that read the same on a CPU and on a T4 (notebook 06's checked output)."""
    expected = "nvme" if nvme_ready else "cpu"
    return "\n".join([
        "the engine offloaded the optimizer to NVMe where libaio is ready, else to the CPU: "
        f"{run.offload == expected}",
        f"fine-tune checks held: {claims.every(held for _, held in claims_held)}",
    ])
