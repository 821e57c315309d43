"""Measure the memory grid of issue 16: GPT-2 and Llama-style shapes from 124M to 1.5B, micro batch
1-16, sequence 256-2048, checkpointing on and off, stages 0-3, CPU and NVMe offload, with cases
near (and past) a T4's 15 GiB. Each case runs through helpers.runner.measure in a fresh subprocess
(out of memory is a result, not a crash) and is appended to ``--out`` as one JSON line, with its
prediction, the machine and its split ("fit" or "validation": alternating within each family).
Calling it again with the same ``--out`` runs only the cases not recorded yet.

    KIT_EMULATE=t4 python tools/measure_memory_grid.py --out grid.jsonl      # one H200, ~8 min
    python tools/measure_memory_grid.py --dry-run                             # cases, predictions
    python tools/measure_memory_grid.py --smoke --out /tmp/smoke.jsonl        # CPU, tiny models
    KIT_EMULATE=t4 python tools/measure_memory_grid.py --held-out --out h.jsonl  # cases no rule saw

Several cases run side by side (``--parallel``): each process is capped at the emulated 15 GiB,
and its peak GPU memory is its own (torch.cuda.max_memory_allocated), so the peaks are unaffected;
step times are not comparable. The rows load with helpers.measurements.load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import cli, config, env, measurements, runner  # noqa: E402
from helpers import memory  # noqa: E402

S0, S1, S2, S3 = "stage 0", "stage 1", "stage 2", "stage 3"
S2C, S3C, S3N = "stage 2 + CPU offload", "stage 3 + CPU offload", "stage 3 + NVMe offload"


@dataclass(frozen=True)
class Case:
    """One grid point: a kit shape, a matrix row, the batch shape, checkpointing."""

    shape: str
    row: str
    micro_batch: int
    seq_len: int
    grad_ckpt: bool

    @property
    def id(self) -> str:
        return (
            f"{self.shape}|{self.row}|{self.micro_batch}x{self.seq_len}"
            f"|{'ckpt' if self.grad_ckpt else 'nockpt'}"
        )


# (shape, row, micro batch, sequence, checkpointing). Ordered by family; the split alternates.
_GPT2 = [
    ("gpt2-124m", S0, 16, 512, False),
    ("gpt2-124m", S1, 8, 1024, False),
    ("gpt2-124m", S2, 4, 2048, True),
    ("gpt2-124m", S3, 2, 2048, False),
    ("gpt2-124m", S0, 1, 256, False),
    ("gpt2-124m", S2C, 16, 512, True),
    ("gpt2-124m", S3C, 8, 1024, True),
    ("gpt2-124m", S3N, 4, 512, True),
    ("gpt2-124m", S0, 16, 1024, False),
    ("gpt2-124m", S2, 12, 1024, False),
    ("gpt2-355m", S0, 2, 1024, False),
    ("gpt2-355m", S1, 4, 512, False),
    ("gpt2-355m", S2, 8, 512, True),
    ("gpt2-355m", S3, 16, 256, True),
    ("gpt2-355m", S0, 8, 2048, True),
    ("gpt2-355m", S2C, 8, 1024, False),
    ("gpt2-355m", S3C, 2, 2048, False),
    ("gpt2-355m", S0, 16, 512, False),
    ("gpt2-355m", S2, 4, 1024, False),
    ("gpt2-355m", S3, 8, 1024, True),
    ("gpt2-774m", S0, 1, 256, True),
    ("gpt2-774m", S1, 2, 512, True),
    ("gpt2-774m", S2C, 8, 512, True),
    ("gpt2-774m", S3, 1, 512, True),
    ("gpt2-774m", S3, 4, 1024, True),
    ("gpt2-774m", S3C, 4, 1024, True),
    ("gpt2-774m", S2, 1, 1024, True),
    ("gpt2-1.5b", S2C, 2, 512, True),
    ("gpt2-1.5b", S3C, 1, 1024, True),
    ("gpt2-1.5b", S0, 1, 256, True),
]
_LLAMA = [
    ("smollm2-135m-shaped", S0, 8, 512, False),
    ("smollm2-135m-shaped", S1, 16, 256, False),
    ("smollm2-135m-shaped", S2, 4, 2048, False),
    ("smollm2-135m-shaped", S3, 8, 1024, True),
    ("smollm2-135m-shaped", S2C, 16, 1024, True),
    ("smollm2-135m-shaped", S3C, 4, 512, False),
    ("smollm2-135m-shaped", S3N, 2, 512, True),
    ("smollm2-135m-shaped", S0, 16, 1024, False),
    ("smollm2-360m-shaped", S0, 4, 512, False),
    ("smollm2-360m-shaped", S1, 2, 2048, True),
    ("smollm2-360m-shaped", S2, 8, 512, False),
    ("smollm2-360m-shaped", S3, 4, 1024, False),
    ("smollm2-360m-shaped", S2C, 8, 512, False),
    ("smollm2-360m-shaped", S3C, 16, 512, True),
    ("smollm2-360m-shaped", S0, 16, 512, False),
    ("qwen2.5-0.5b-shaped", S0, 4, 512, True),
    ("qwen2.5-0.5b-shaped", S2, 2, 512, True),
    ("qwen2.5-0.5b-shaped", S2C, 4, 1024, True),
    ("qwen2.5-0.5b-shaped", S3, 1, 2048, False),
    ("qwen2.5-0.5b-shaped", S3C, 8, 512, True),
    ("tinyllama-1.1b-shaped", S2C, 2, 1024, True),
    ("tinyllama-1.1b-shaped", S3, 1, 512, True),
    ("tinyllama-1.1b-shaped", S3C, 4, 512, False),
    ("llama-3.2-1b-shaped", S2C, 1, 512, True),
    ("llama-3.2-1b-shaped", S0, 1, 256, True),
    ("llama-3.2-1b-shaped", S3C, 2, 1024, True),
]
_SMOKE = [("tiny", S0, 2, 64, False), ("llama-tiny", S2, 2, 64, True)]
# Cases no rule was fitted on (``--held-out``), all "validation": a 152k-vocabulary 1.5B under
# parameter offload, where the estimator read 10% low before it knew when the head's gradient
# leaves the GPU.
_HELD_OUT = [
    ("qwen2.5-1.5b-shaped", S3C, 2, 512, True),
    ("qwen2.5-1.5b-shaped", S3N, 2, 512, True),
    ("qwen2.5-1.5b-shaped", S3C, 4, 1024, True),
]


def grid(smoke: bool = False, held_out: bool = False) -> list[tuple[Case, str]]:
    """The cases and their split: alternating "fit" / "validation" within each family's list;
    ``held_out``: only the held-out cases, each "validation"."""
    if held_out:
        return [(Case(*c), "validation") for c in _HELD_OUT]
    families = [_SMOKE] if smoke else [_GPT2, _LLAMA]
    return [
        (Case(*c), "fit" if i % 2 == 0 else "validation")
        for family in families
        for i, c in enumerate(family)
    ]


def predicted_seconds(case: Case, info: memory.ModelInfo, steps: int) -> float:
    """A rough wall time for one case on an H200 (process start and model build, then the steps):
    what --dry-run adds up and --limit-minutes plans with. Deliberately pessimistic."""
    start = 15 + 25 * info.n_params / 1e9  # imports, fp32 build and init on the host
    compute = 6 * info.n_params * case.micro_batch * case.seq_len / 150e12
    per_param = {S2C: 2.5e-9, S3C: 4e-9, S3N: 30e-9}.get(case.row, 0.0)
    return start + steps * (
        compute * (1.33 if case.grad_ckpt else 1) + per_param * info.n_params + 0.1
    )


def _limits(machine: env.Environment) -> dict[str, int | None]:
    gpu = machine.vram_total_bytes if machine.has_gpu else None
    return {"gpu": gpu, "cpu": machine.ram_budget_bytes, "nvme": machine.disk_free_bytes}


def plan(machine: env.Environment, smoke: bool, steps: int, nvme: bool, held_out: bool = False):
    """(case, split, config, estimate, seconds) for every case; NVMe rows only with libaio."""
    infos: dict[str, memory.ModelInfo] = {}
    out = []
    for case, split in grid(smoke, held_out):
        if case.row == S3N and not nvme:
            continue
        info = infos.setdefault(case.shape, memory.ModelInfo.for_shape(case.shape))
        # NVMe cases side by side must not share a swap folder (a run deletes its folder's files)
        folder = str(Path(machine.offload_dir) / f"grid-{len(out)}")
        own = {"nvme_path": folder} if case.row == S3N else {}
        choice = dict(config.STAGE_ROWS)[case.row]
        ds = config.for_row(choice, info, machine, case.micro_batch, **own)
        est = memory.estimate(
            info,
            ds,
            micro_batch=case.micro_batch,
            seq_len=case.seq_len,
            grad_ckpt=case.grad_ckpt,
            on_gpu=machine.has_gpu,
        )
        out.append((case, split, ds, est, predicted_seconds(case, info, steps)))
    return out


def _verdicts(est: memory.Estimate, machine: env.Environment) -> dict[str, str]:
    needs = {p: est.total(p) for p in memory.PLACES}
    return {p: v.word for p, v in memory.verdicts(needs, _limits(machine)).items()}


def row_for(
    case: Case,
    split: str,
    est: memory.Estimate,
    result: runner.RunResult,
    machine: env.Environment,
    steps: int,
) -> dict:
    """One JSON line: the case, its prediction and verdicts, the measurement, the machine."""
    return {
        "id": case.id,
        "source": "tools/measure_memory_grid.py",
        "machine": machine.measured_on(),
        "machine_facts": {
            "gpu": machine.gpu_name,
            "emulation": machine.emulation.name if machine.emulation else None,
            "precision": machine.precision,
            "torch": machine.torch_version,
            "deepspeed": machine.deepspeed_version,
            "transformers": machine.transformers_version,
        },
        "shape": case.shape,
        "row": case.row,
        "world_size": 1,
        "micro_batch": case.micro_batch,
        "seq_len": case.seq_len,
        "grad_ckpt": case.grad_ckpt,
        "steps": steps,
        "split": split,
        "predicted_gpu_bytes": est.total("gpu"),
        "predicted_cpu_bytes": est.total("cpu"),
        "predicted_nvme_bytes": est.total("nvme"),
        "predicted_parts": est.parts,
        "predicted_phase": est.phase,
        "verdicts": _verdicts(est, machine),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **asdict(result),
    }


def dry_run_lines(planned, parallel: int) -> list[str]:
    """The cases as text, with predicted GiB, verdicts and the expected wall time."""
    lines = []
    for case, split, _, est, secs in planned:
        lines.append(
            f"{case.id:58s} {split:10s} gpu {est.total('gpu') / 2**30:6.2f} "
            f"host {est.total('cpu') / 2**30:6.2f} GiB  ~{secs:4.0f} s"
        )
    total = sum(p[4] for p in planned)
    lines.append(
        f"{len(planned)} cases ({sum(p[1] == 'validation' for p in planned)} validation), "
        f"about {total / 60:.1f} min of runs, {total / 60 / parallel:.1f} min wall with "
        f"--parallel {parallel}"
    )
    return lines


def finished_ids(out: Path, redo_first_step: bool = False) -> set[str]:
    """Ids of the cases an earlier call recorded in ``out`` (not those it left "not tried"; with
    ``redo_first_step``, not those whose latest run was first-step only either: see
    helpers.measurements.first_step_only)."""
    if not out.is_file():
        return set()
    latest = {r["id"]: r for r in measurements.load(out) if r.get("status") != runner.NOT_TRIED}
    return {i for i, r in latest.items()
            if not (redo_first_step and r["status"] == runner.OK and measurements.first_step_only(r))}


def _out_path(parser: argparse.ArgumentParser, value: str | None, needed: bool) -> Path | None:
    if value is None:
        if needed:
            cli.refuse(parser, "--out", "", "give a file for the JSON lines, e.g. --out grid.jsonl")
        return None
    path = Path(value)
    if path.is_dir() or not path.resolve().parent.is_dir():
        why = "is a folder" if path.is_dir() else "its folder does not exist"
        cli.refuse(parser, "--out", value, f"{why}: give a file in an existing folder")
    return path


def _rows_file(value: str) -> list[dict]:
    """``--merge``'s type: a JSON-lines file of grid rows (id, shape, row, status, split)."""
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"{cli.quoted(value)}: no such file; give the --out file of a run"
        )
    try:
        rows = measurements.load(path)
    except (ValueError, KeyError) as err:
        raise argparse.ArgumentTypeError(f"{cli.quoted(value)}: not JSON lines ({err})") from None
    bad = [i for i, r in enumerate(rows) if not {"id", "shape", "row", "status", "split"} <= set(r)]
    if not rows or bad:
        raise argparse.ArgumentTypeError(
            f"{cli.quoted(value)}: no grid rows (line {bad[0] + 1 if bad else 1} "
            "lacks id, shape, row, status or split)"
        )
    return rows


def _positive_minutes(value: str) -> float:
    try:
        minutes = float(value)
    except ValueError:
        minutes = -1.0
    if minutes <= 0:
        raise argparse.ArgumentTypeError(f"{cli.quoted(value)}: must be a number of minutes > 0")
    return minutes


class HostGate:
    """Admit cases side by side only while their predicted host RAM adds up to less than ``budget``
    (one case always runs, however large)."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used, self.cond = budget, 0, threading.Condition()

    @contextlib.contextmanager
    def hold(self, need: int):
        with self.cond:
            self.cond.wait_for(lambda: self.used == 0 or self.used + need <= self.budget)
            self.used += need
        try:
            yield
        finally:
            with self.cond:
                self.used -= need
                self.cond.notify_all()


def run(
    planned,
    machine: env.Environment,
    out: Path,
    steps: int,
    parallel: int,
    limit_minutes: float,
    echo=print,
) -> list[dict]:
    """Run the planned cases (``parallel`` at a time), append each row to ``out`` as it finishes.
    A case whose predicted time would pass ``limit_minutes`` is recorded as "not tried"."""
    lock, rows, start = threading.Lock(), [], time.monotonic()
    gate = HostGate(int(0.7 * machine.ram_total_bytes))

    def one(item) -> None:
        case, split, ds, est, secs = item
        need = int(1.3 * est.total("cpu"))  # cases side by side must not exhaust the host's RAM
        with gate.hold(need):
            elapsed = time.monotonic() - start
            if elapsed + secs / max(1, parallel) > limit_minutes * 60:
                result = runner.RunResult(
                    case.id, runner.NOT_TRIED, f"--limit-minutes {limit_minutes:g} reached"
                )
            else:
                spec = runner.RunSpec(
                    ds_config=ds,
                    shape=case.shape,
                    seq_len=case.seq_len,
                    steps=steps,
                    grad_ckpt=case.grad_ckpt,
                    label=case.id,
                    timeout_s=int(max(120, 4 * secs)),
                )
                result = runner.measure(spec)
        row = row_for(case, split, est, result, machine, steps)
        with lock:
            rows.append(row)
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            gpu = result.peak_gpu_allocated_bytes
            echo(
                f"[{time.monotonic() - start:5.0f} s] {case.id:58s} {result.status:18s} gpu pred "
                f"{est.total('gpu') / 2**30:6.2f} meas "
                f"{'-' if gpu is None else f'{gpu / 2**30:6.2f}'} "
                f"host pred {est.total('cpu') / 2**30:6.2f} "
                f"meas {result.peak_host_rss_bytes / 2**30:6.2f} "
                f"{result.message[:80]}"
            )

    # the slowest first, so that the limit cuts short cases rather than a long one at the end
    order = sorted(planned, key=lambda p: -p[4])
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, order))
    return rows


def merge(new_rows: list[dict], path: str | Path = measurements.MEASUREMENTS) -> int:
    """Add rows (e.g. a grid's JSON lines) to a measurements file, replacing rows of the same id;
    rows of cases a grid did not try (no measurement) are left out. Returns how many rows the file
    holds afterwards."""
    data = json.loads(Path(path).read_text())
    # a resumed grid may list an id twice: the last wins
    latest = {r["id"]: r for r in new_rows if r.get("status") != runner.NOT_TRIED}
    data["rows"] = [r for r in data["rows"] if r["id"] not in latest] + list(latest.values())
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
    return len(data["rows"])


def main(argv: list[str] | None = None) -> int:
    parser = cli.OneLineParser(
        description=__doc__,
        name="measure_memory_grid",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", help="a JSON-lines file the rows are appended to")
    parser.add_argument("--steps", type=cli.positive_int, default=3)
    parser.add_argument(
        "--parallel",
        type=cli.positive_int,
        default=None,
        help="cases run side by side (default: 4 on a GPU, 1 on a CPU)",
    )
    parser.add_argument(
        "--limit-minutes",
        type=_positive_minutes,
        default=8.0,
        help="start no case that would end past this (default 8)",
    )
    parser.add_argument(
        "--max-cases", type=cli.positive_int, default=None, help="run only the first N cases"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny models on the CPU (what the test runs)"
    )
    parser.add_argument(
        "--held-out", action="store_true", help="only the held-out cases no rule was fitted on"
    )
    parser.add_argument(
        "--redo-first-step",
        action="store_true",
        help="run again the recorded cases whose GPU peak was first-step only (fp16 overflow "
        "skipped every step but the last; the grid's loss scale now starts at 2**12)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list the cases and predictions; run nothing"
    )
    parser.add_argument(
        "--merge",
        metavar="JSONL",
        type=_rows_file,
        help="add a grid's rows to helpers/memory_measurements.json (runs nothing)",
    )
    args = parser.parse_args(argv)
    if args.merge:
        total = merge(args.merge)
        tried = sum(r["status"] != runner.NOT_TRIED for r in args.merge)
        print(
            f"{tried} of {len(args.merge)} rows merged into {measurements.MEASUREMENTS} (the "
            f"others were not tried: nothing measured); {total} rows now"
        )
        return 0
    out = _out_path(parser, args.out, needed=not args.dry_run)
    machine = env.describe()
    if not args.smoke and not args.dry_run and not machine.has_gpu:
        cli.refuse(
            parser,
            "--smoke",
            "off",
            "no GPU here: the full grid needs one (KIT_EMULATE=t4 on a large "
            "GPU); add --smoke for the tiny CPU cases, or --dry-run to list the cases",
        )
    if args.dry_run and not args.smoke and not machine.has_gpu:
        machine = config.t4_profile(machine)  # predict as on the GPU the grid is meant for
    parallel = args.parallel or (4 if machine.has_gpu else 1)
    planned = plan(machine, args.smoke, args.steps, nvme=env.libaio_available(),
                   held_out=args.held_out)[: args.max_cases]
    done = finished_ids(out, args.redo_first_step) if out and not args.dry_run else set()
    if done:  # a second call with the same --out resumes: cases already recorded are not run again
        print(f"{len(done)} cases already in {out}: resuming with the others")
        planned = [p for p in planned if p[0].id not in done]
    print(
        machine.measured_on()
        if not args.dry_run
        else f"predicted for: {machine.gpu_name}, "
        f"{machine.precision}, GPU {(machine.vram_total_bytes or 0) / 2**30:.1f} GiB"
    )
    if args.dry_run:
        print("\n".join(dry_run_lines(planned, parallel)))
        return 0
    rows = run(planned, machine, out, args.steps, parallel, args.limit_minutes)
    ran = [r for r in rows if r["status"] not in (runner.NOT_TRIED,)]
    print(f"{len(ran)} of {len(rows)} cases ran or hit a limit; rows appended to {out}")
    return (
        0
        if all(
            runner.explained(runner.RunResult(**{k: r[k] for k in ("label", "status", "message")}))
            for r in rows
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
