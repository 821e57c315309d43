"""One training measurement in a fresh subprocess: a (model, DeepSpeed config) pair, N steps, JSON back.

A fresh process per run means a re-run cell never inherits leaked GPU memory, a used port or a
half-initialised process group. The parent watches the whole process tree's host RSS (and can
kill it past a RAM budget, as Colab's out-of-memory killer would), and the disk used by NVMe files.

    python -m helpers.bench --shape gpt2-124m --stage 2 --offload-optimizer cpu --steps 5
    python -m helpers.matrix --world-size 2 --shape gpt2-355m --micro-batch 4 --seq-len 512
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from helpers import accounting, rss_trace, show
from helpers import env as kit_env
from helpers.show import Table

OK, OOM, KILLED_RAM, TIMEOUT, ERROR = "ok", kit_env.OUT_OF_GPU_MEMORY, "killed for host RAM", "timeout", "error"
FAKE_OOM_ENV = "KIT_BENCH_FAKE_OOM"  # test hook: the worker raises an out-of-memory error at step 0
NOT_HERE, NOT_TRIED, REFUSED_DISK = "not here", "not tried", "refused: disk"
#: Outcomes a table may show: a run that went, a limit it hit, or a reason it was not started.
#: "error" and "timeout" are not among them: they mean something broke.
EXPLAINED = (OK, OOM, KILLED_RAM, NOT_HERE, NOT_TRIED, REFUSED_DISK)
LOG_ENV = "KIT_BENCH_LOG"  # a file: every finished run appends its result there as one JSON line


@dataclass
class RunSpec:
    """What to run: a GPT-2-shaped model, a DeepSpeed config, and the sizes of the batches."""

    ds_config: dict
    shape: str = "tiny"
    vocab_size: int | None = None  # None: GPT-2's 50257
    seq_len: int = 64
    micro_batch: int = 2
    steps: int = 4
    grad_ckpt: bool = False
    seed: int = 0
    world_size: int = 1
    label: str = ""
    gpu_cap_bytes: int | None = None  # cap GPU memory for this run (tests provoke OOM with it)
    ram_limit_bytes: int | None = None  # kill the run when its process tree's RSS passes this
    timeout_s: int = 1800
    zero_init: bool = False  # ZeRO-3: build the model partitioned (low host RAM; other random init than stage 0)
    force_cpu: bool = False  # hide the GPUs: DeepSpeed's CPU accelerator, gloo between ranks


@dataclass
class RunResult:
    """The JSON a run returns. Byte counts are per rank; peaks are the largest over ranks."""

    label: str
    status: str
    message: str = ""
    world_size: int = 1
    n_params: int = 0
    steps_done: int = 0
    losses: list[float] = field(default_factory=list)
    loss_scales: list[float] = field(default_factory=list)
    skipped_steps: int = 0
    step_times_s: list[float] = field(default_factory=list)
    median_step_s: float | None = None
    tokens_per_s: float | None = None
    peak_gpu_allocated_bytes: int | None = None
    peak_gpu_reserved_bytes: int | None = None
    peak_host_rss_bytes: int = 0
    peak_nvme_bytes: int = 0
    wall_s: float = 0.0
    ranks: list[dict] = field(default_factory=list)
    rss_phases: list[dict] = field(default_factory=list)  # rank 0's helpers.rss_trace phases


# ---- the worker (inside the subprocess) ------------------------------------------------------------------


def _oom_message(text: str, cap_bytes: int | None = None) -> str:
    """CUDA's out-of-memory text names the real card's capacity (139 GiB on an H200 emulating a
    T4); say instead what was asked for, what was held, and the limit this run had."""
    import re

    import torch

    asked = re.search(r"Tried to allocate ([\d.]+ [KMGT]iB)", text)
    msg = "CUDA out of memory" + (f": tried to allocate {asked.group(1)}" if asked else "")
    if "(simulated" in text:
        msg += " (simulated on CPU)" if "on CPU" in text else " (simulated)"
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        held = torch.cuda.memory_allocated(device) / show.GiB
        emulated = kit_env.resolve_emulation()
        limit = min(b for b in (cap_bytes, emulated and emulated.gpu_bytes,
                                torch.cuda.get_device_properties(device).total_memory) if b)
        msg += f" with {held:.2f} GiB in use, limit {limit / show.GiB:.1f} GiB"
    return msg


def _worker(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out_dir = Path(spec.pop("out_dir"))
    rank = int(os.environ.get("RANK", "0"))
    result: dict = {"rank": rank, "status": ERROR, "message": ""}
    trace = rss_trace.PhaseTrace()
    trace.enter("imports, process group")
    try:
        train_steps(RunSpec(**spec), result, trace)
        result["status"] = OK
    except BaseException as err:  # report every failure as JSON; the parent explains it
        result["status"] = OOM if kit_env.is_out_of_memory(err) else ERROR
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        result["message"] = (_oom_message(str(err), spec.get("gpu_cap_bytes")) if result["status"] == OOM else
                             f"{type(err).__name__}: {' | '.join(l.strip() for l in lines[:3])}"[:500])
    finally:
        result["rss_phases"] = trace.stop()
        high = rss_trace.high_water_bytes()  # this rank's own peak, where it passed the parent's
        result["rss_high_water_bytes"] = high if high > trace.inherited_high_water else None
        (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    return 0 if result["status"] == OK else 3


def train_steps(spec: RunSpec, result: dict, trace: rss_trace.PhaseTrace | None = None) -> None:
    """The engine loop every measured run executes, in its subprocess: notebook 07's lesson
    (``deepspeed.initialize``, then ``engine(batch)``, ``engine.backward(loss)``, ``engine.step()``)
    with the kit's measurements around it (bytes each rank holds, step times, peak GPU memory, and
    ``trace``'s host RSS per phase)."""
    enter = trace.enter if trace else (lambda phase: None)
    import torch

    from helpers import data, models

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        kit_env.apply_emulation(kit_env.resolve_emulation(), kit_env._gpu_facts())
        if spec.gpu_cap_bytes:
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, spec.gpu_cap_bytes / total))
    kit_env.setup_single_process_dist()
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        # One rank needs no rendezvous: an in-process store, so no port can be taken by another run.
        import torch.distributed as torch_dist

        torch_dist.init_process_group("nccl" if cuda else "gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
    import deepspeed

    from helpers import deepspeed_fixes

    deepspeed_fixes.apply_all()
    config = dict(spec.ds_config)
    model_config = models.model_config(spec.shape, spec.vocab_size, max_positions=max(1024, spec.seq_len))
    keep_alive = None
    if spec.zero_init and config.get("zero_optimization", {}).get("stage") == 3:
        # Partitioned construction with HF's weight init (a bare zero.Init started at loss ~100).
        from transformers.integrations import HfDeepSpeedConfig

        keep_alive = HfDeepSpeedConfig(config)
    enter("model built")
    model = models.build_model(model_config, seed=spec.seed)
    if spec.grad_ckpt:
        model.gradient_checkpointing_enable()
    enter("deepspeed.initialize")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    result["n_params"] = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    tokenizer = models.ByteTokenizer()
    corpus = data.offline_corpus(max(50_000, spec.seq_len * spec.micro_batch * (spec.steps + 2) * 2), seed=spec.seed)
    rank = int(os.environ.get("RANK", "0"))
    steps = data.batches(corpus, tokenizer, spec.seq_len, spec.micro_batch, spec.steps, seed=spec.seed + rank)
    losses, times, scales = [], [], []
    for step, batch in enumerate(steps):
        if step == 0 and os.environ.get(FAKE_OOM_ENV) == "1":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated"
                                              + (")" if cuda else " on CPU)"))
        batch = batch.to(engine.device)
        start = time.perf_counter()
        enter("forward and backward")
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        if step == 0:
            result["grads_bytes"] = accounting.held_bytes(engine)["grads_bytes"]
        enter("optimizer step")
        engine.step()
        if step == 0:  # Adam's moments exist after the first step
            result.update({k: v for k, v in accounting.held_bytes(engine).items() if k != "grads_bytes"})
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(loss.item()))
        scale = getattr(engine.optimizer, "loss_scale", None)
        scales.append(float(scale) if isinstance(scale, (int, float)) else float(getattr(scale, "item", lambda: 1.0)()))
    result.update(losses=losses, step_times_s=times, loss_scales=scales, steps_done=len(losses),
                  skipped_steps=int(getattr(engine, "skipped_steps", 0)))
    if cuda:
        result["peak_gpu_allocated_bytes"] = torch.cuda.max_memory_allocated()
        result["peak_gpu_reserved_bytes"] = torch.cuda.max_memory_reserved()
    del keep_alive


# ---- the parent -------------------------------------------------------------------------------------------


def _tree_rss(proc) -> int:
    import psutil

    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _folder_bytes(path: str | None) -> int:
    if not path or not os.path.isdir(path):
        return 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def nvme_path(config: dict) -> str | None:
    """The NVMe offload folder a config writes to, if any."""
    zero = config.get("zero_optimization", {})
    for key in ("offload_param", "offload_optimizer"):
        if zero.get(key, {}).get("device") == "nvme":
            return zero[key].get("nvme_path")
    return None


def with_nvme_folder(config: dict, folder: str) -> dict:
    """A copy of ``config`` whose NVMe offload (parameters and optimizer) swaps into ``folder``."""
    out = json.loads(json.dumps(config))
    zero = out.get("zero_optimization", {})
    for key in ("offload_param", "offload_optimizer"):
        if (zero.get(key) or {}).get("device") == "nvme":
            zero[key]["nvme_path"] = folder
    return out


def _child_env(world_size: int, force_cpu: bool = False) -> dict[str, str]:
    child = dict(os.environ)
    if force_cpu:
        child.update(CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        child.pop(key, None)
    child.setdefault("PYTHONUNBUFFERED", "1")
    root = str(kit_env.REPO_ROOT)
    child["PYTHONPATH"] = root + (os.pathsep + child["PYTHONPATH"] if child.get("PYTHONPATH") else "")
    if world_size == 1:
        child["MASTER_PORT"] = str(kit_env.free_port())
    return child


def _port_clash(result: RunResult) -> bool:
    return result.status == ERROR and any(s in result.message for s in ("DistNetworkError", "EADDRINUSE",
                                                                         "address already in use"))


def run(spec: RunSpec, log_path: str | os.PathLike | None = None) -> RunResult:
    """Run ``spec`` in a fresh subprocess (``torchrun`` for world size > 1) and return its result.

    A run whose rendezvous port was taken in the moment between probing and binding (another run
    starting beside it) is started once more on a new port."""
    result = _run_once(spec, log_path)
    return _run_once(spec, log_path) if _port_clash(result) else result


def _run_once(spec: RunSpec, log_path: str | os.PathLike | None = None) -> RunResult:
    import psutil

    work = Path(tempfile.mkdtemp(prefix="kit_bench_"))
    nvme = nvme_path(spec.ds_config)
    nvme_existed = bool(nvme) and os.path.exists(nvme)
    if nvme:
        # Each run swaps into its own subfolder of the config's nvme_path: DeepSpeed names its
        # swap files the same in every process, so two runs side by side (pytest workers, two
        # notebooks, the grid) would overwrite each other's states, and one's clean-up would
        # delete the other's.
        nvme = os.path.join(nvme, f"run-{os.getpid()}-{work.name}")
        spec = replace(spec, ds_config=with_nvme_folder(spec.ds_config, nvme))
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps({**asdict(spec), "out_dir": str(work)}))
    worker = ["-m", "helpers.bench", "--worker", str(spec_path)]
    if spec.world_size == 1:
        cmd = [sys.executable, *worker]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(spec.world_size),
               "--master-addr", "127.0.0.1", "--master-port", str(kit_env.free_port()), *worker]
    log_file = open(log_path or work / "log.txt", "w")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=str(kit_env.REPO_ROOT),
                            env=_child_env(spec.world_size, spec.force_cpu), start_new_session=True)
    watched = psutil.Process(proc.pid)
    peak_rss = peak_nvme = 0
    forced = ""
    last_disk = 0.0
    while proc.poll() is None:
        peak_rss = max(peak_rss, _tree_rss(watched))
        if nvme and time.perf_counter() - last_disk > 1.0:
            peak_nvme, last_disk = max(peak_nvme, _folder_bytes(nvme)), time.perf_counter()
        if spec.ram_limit_bytes and peak_rss > spec.ram_limit_bytes:
            forced = KILLED_RAM
        elif time.perf_counter() - start > spec.timeout_s:
            forced = TIMEOUT
        if forced:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.1)
    log_file.close()
    result = RunResult(label=spec.label or _label(spec.ds_config), status=ERROR, world_size=spec.world_size,
                       peak_host_rss_bytes=peak_rss, peak_nvme_bytes=peak_nvme, wall_s=time.perf_counter() - start)
    ranks = [json.loads(p.read_text()) for p in sorted(work.glob("rank*.json"))]
    log_text = Path(log_path or work / "log.txt").read_text(errors="replace")
    if forced == KILLED_RAM:
        result.status = KILLED_RAM
        result.message = (f"host RSS passed the {spec.ram_limit_bytes / kit_env.GB:.1f} GB budget "
                          f"({peak_rss / kit_env.GB:.1f} GB): on Colab the kernel would be killed here")
    elif forced == TIMEOUT:
        result.status, result.message = TIMEOUT, f"stopped after {spec.timeout_s} s"
    elif not ranks:
        result.status = KILLED_RAM if proc.returncode in (-9, 137) else ERROR
        result.message = ("killed by signal 9, as the kernel's out-of-memory killer does: not enough host RAM"
                          if result.status == KILLED_RAM else _last_error(log_text) or f"exit code {proc.returncode}")
    else:
        _merge(result, ranks)
    if nvme:
        _remove_swap_files(nvme, os.path.dirname(nvme), created=not nvme_existed)
    shutil.rmtree(work, ignore_errors=True)
    log_record({"shape": spec.shape, **asdict(result)})
    return result


def log_record(row: dict) -> None:
    """Append one JSON line to the file ``KIT_BENCH_LOG`` names, if set: the GPU record run
    (tools/gpu_record_run.sh) collects every result and measurement there (GPU_RUNS.md), since
    nbval keeps no notebook output."""
    if os.environ.get(LOG_ENV):
        with open(os.environ[LOG_ENV], "a") as log:
            log.write(json.dumps(row) + "\n")


def _remove_swap_files(own: str, parent: str, created: bool) -> None:
    """Delete this run's own swap folder ``own`` (all of it is DeepSpeed's files), never anything
    else under the config's ``parent`` path; the parent itself only when this run created it and it
    is empty now."""
    shutil.rmtree(own, ignore_errors=True)
    if created:
        try:
            os.rmdir(parent)
        except OSError:
            pass


def _last_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return (errors or lines or [""])[-1][:500]


def _merge(result: RunResult, ranks: list[dict]) -> None:
    bad = [r for r in ranks if r["status"] != OK]
    first = ranks[0]
    if bad:
        result.status = OOM if any(r["status"] == OOM for r in bad) else ERROR
        result.message = bad[0]["message"]
    else:
        result.status = OK
    result.n_params = first.get("n_params", 0)
    result.losses = first.get("losses", [])
    result.loss_scales = first.get("loss_scales", [])
    result.skipped_steps = first.get("skipped_steps", 0)
    result.steps_done = first.get("steps_done", 0)
    result.step_times_s = first.get("step_times_s", [])
    result.rss_phases = first.get("rss_phases", [])
    timed = result.step_times_s[1:] or result.step_times_s
    if timed:
        result.median_step_s = sorted(timed)[len(timed) // 2]
    peaks = [r.get("peak_gpu_allocated_bytes") for r in ranks if r.get("peak_gpu_allocated_bytes") is not None]
    result.peak_gpu_allocated_bytes = max(peaks) if peaks else None
    reserved = [r.get("peak_gpu_reserved_bytes") for r in ranks if r.get("peak_gpu_reserved_bytes") is not None]
    result.peak_gpu_reserved_bytes = max(reserved) if reserved else None
    keys = ("rank", "params_bytes", "grads_bytes", "optimizer_bytes", "params_gpu_bytes", "optimizer_gpu_bytes",
            "peak_gpu_allocated_bytes", "rss_high_water_bytes")
    result.ranks = [{k: r.get(k) for k in keys} for r in ranks]


def explained(result: RunResult) -> bool:
    """The run went, hit a limit (GPU memory, host RAM), or was not started for a stated reason."""
    return result.status in EXPLAINED and (result.status == OK or bool(result.message))


def tokens_per_step(spec: RunSpec) -> int:
    return spec.micro_batch * spec.seq_len * spec.world_size


def finish(result: RunResult, spec: RunSpec) -> RunResult:
    """Fill the derived figures (tokens/s) once a run is back."""
    if result.median_step_s:
        result.tokens_per_s = tokens_per_step(spec) / result.median_step_s
    return result


def measure(spec: RunSpec, log_path: str | os.PathLike | None = None) -> RunResult:
    """:func:`run` plus the derived figures: the call notebooks use."""
    return finish(run(spec, log_path), spec)


def _label(config: dict) -> str:
    zero = config.get("zero_optimization", {})
    label = f"stage {zero.get('stage', 0)}"
    for key, short in (("offload_optimizer", "opt"), ("offload_param", "param")):
        device = zero.get(key, {}).get("device", "none")
        if device != "none":
            label += f" + {short}->{device}"
    return label


#: The columns of :func:`result_cells`, for tables that show runs.
RESULT_COLUMNS = ["status", "peak GPU GiB", "peak host RSS GiB", "NVMe GiB", "s/step", "tokens/s", "loss"]


def result_cells(r: RunResult, width: int = 80) -> tuple[str, ...]:
    """One run as table cells (see RESULT_COLUMNS): status, peaks, step time, tokens/s, first -> last
    loss. Every table of runs (bench, matrix, ladder) writes them the same way; no NVMe files is "-"."""
    return (show.status_cell(r.status, r.message, OK, width), show.gib(r.peak_gpu_allocated_bytes),
            show.gib(r.peak_host_rss_bytes or None), show.gib(r.peak_nvme_bytes or None),
            show.seconds(r.median_step_s), "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
            show.loss_cell(r.losses))


def results_table(results: list[RunResult]) -> Table:
    """The measurements side by side: status, peak GPU, peak host RSS, NVMe, step time, losses."""
    return Table(["config", *RESULT_COLUMNS], [(r.label, *result_cells(r)) for r in results], title="Measured runs")


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options every measuring command line shares (bench's and the matrix's): the model shape,
    the batch, the steps, the ranks, each validated by its type."""
    from helpers import cli
    from helpers.models import MODEL_SHAPES

    parser.add_argument("--shape", default="tiny", type=cli.one_of(MODEL_SHAPES, "kit shapes"),
                        help=f"the model: {', '.join(MODEL_SHAPES)} (default: tiny)")
    parser.add_argument("--micro-batch", type=cli.positive_int, default=2)
    parser.add_argument("--seq-len", type=cli.whole_number(8), default=64)
    parser.add_argument("--steps", type=cli.positive_int, default=4)
    parser.add_argument("--world-size", type=cli.positive_int, default=1)
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def refuse_more_ranks_than_gpus(parser: argparse.ArgumentParser, world_size: int) -> None:
    """Exit in one line when ``world_size`` ranks need more GPUs than this machine has."""
    from helpers import cli

    machine = kit_env.describe()
    if world_size > 1 and machine.has_gpu and machine.gpu_count < world_size:
        cli.refuse(parser, "--world-size", world_size,
                   f"needs {world_size} GPUs, this machine has {machine.gpu_count}: use --world-size "
                   f"{machine.gpu_count}, or a machine with more GPUs (Kaggle: GPU T4 x2)")


def main(argv: list[str] | None = None) -> int:
    """The command line. Every bad value is refused here, in one line on stderr and exit status 2,
    before a subprocess starts or DeepSpeed is imported (a ``--config`` file is checked with
    DeepSpeed's own classes, still before any run)."""
    from helpers import cli
    from helpers import config as kit_config

    parser = cli.OneLineParser(prog="python -m helpers.bench", name="bench",
                               description="Measure one DeepSpeed config on a kit model shape, in a subprocess.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--config", type=_config_path,
                        help="a DeepSpeed JSON config file or a preset of configs/ (e.g. zero2); "
                             "else built from the options below")
    parser.add_argument("--stage", type=cli.one_of((0, 1, 2, 3)), default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--offload-optimizer", default="none", type=cli.one_of(kit_config.OFFLOAD_DEVICES),
                        choices=kit_config.OFFLOAD_DEVICES)
    parser.add_argument("--offload-param", default="none", type=cli.one_of(kit_config.OFFLOAD_DEVICES),
                        choices=kit_config.OFFLOAD_DEVICES, help="needs --stage 3")
    parser.add_argument("--precision", default="auto", type=cli.one_of(kit_config.PRECISIONS),
                        choices=kit_config.PRECISIONS)
    add_run_options(parser)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args.worker)
    _refuse_combinations(parser, args)
    if args.config:
        ds_config = _engine_config(parser, args)
    else:
        ds_config = kit_config.build(stage=args.stage, offload_optimizer=args.offload_optimizer,
                                     offload_param=args.offload_param, precision=args.precision,
                                     micro_batch=args.micro_batch, world_size=args.world_size, trainer=False)
    spec = RunSpec(ds_config=ds_config, shape=args.shape, seq_len=args.seq_len, micro_batch=args.micro_batch,
                   steps=args.steps, grad_ckpt=args.grad_ckpt, world_size=args.world_size)
    result = measure(spec)
    print(json.dumps(asdict(result), indent=1) if args.json else results_table([result]))
    return 0 if result.status == OK else 1


def _config_path(value: str) -> str:
    """``--config``'s type: a file that exists, or a preset name of configs/ (as helpers.config.load reads it)."""
    from helpers import config as kit_config

    path = Path(value)
    preset = not path.exists() and not path.suffix and (kit_config.CONFIG_DIR / f"{value}.json").is_file()
    if path.is_file() or preset:
        return value
    presets = ", ".join(p.stem for p in sorted(kit_config.CONFIG_DIR.glob("*.json")))
    what = "a folder, not a file" if path.exists() else "no such file"
    raise argparse.ArgumentTypeError(f"{value!r}: {what}; give a JSON file or a preset: {presets}")


def _refuse_combinations(parser: argparse.ArgumentParser, args) -> None:
    """The checks that need several options; each exits through ``parser.error`` in one line."""
    from helpers import cli

    if not args.config and args.offload_param != "none" and args.stage != 3:
        cli.refuse(parser, "--offload-param", args.offload_param,
                   f"parameter offload needs --stage 3 (this is --stage {args.stage}); "
                   f"or offload only the optimizer: --offload-optimizer {args.offload_param}")
    refuse_more_ranks_than_gpus(parser, args.world_size)


def _engine_config(parser: argparse.ArgumentParser, args) -> dict:
    """``--config`` read and checked (helpers.config.load), its "auto" values filled for deepspeed.initialize,
    and checked again with the run's world size; a config with errors is refused in one line."""
    from helpers import cli
    from helpers import config as kit_config

    def refuse(err_text: str) -> None:
        first, *rest = [line.strip() for line in err_text.splitlines() if line.strip()] or [""]
        why = " ".join([first, " | ".join(x.lstrip("- ") for x in rest)]).strip()
        cli.refuse(parser, "--config", args.config, why)

    loaded, failed, filled, errors = None, "", {}, []
    with cli.quiet():  # importing DeepSpeed for the checks prints a line or two
        try:
            loaded = kit_config.load(args.config)
        except kit_config.ConfigError as err:
            failed = str(err)
        if loaded is not None:
            filled = kit_config.for_engine(loaded, micro_batch=args.micro_batch, world_size=args.world_size,
                                           precision=None if args.precision == "auto" else args.precision)
            errors = [p for p in kit_config.check(filled, for_trainer=False, world_size=args.world_size)
                      if p.level == "error"]
    if failed:
        refuse(failed)
    if errors:
        refuse(f"with --micro-batch {args.micro_batch} --world-size {args.world_size}, {len(errors)} error(s):\n"
               + "\n".join(f"- {p}" for p in errors))
    return filled


if __name__ == "__main__":
    sys.exit(main())
