"""Measured memory of training runs, kept in the repository (helpers/memory_measurements.json) with
the machine each ran on, and the estimator checked against them: the validation half only.

Each row names a kit shape, a row of the stage and offload matrix (its config comes from
:func:`helpers.config.for_row`, as the run's did), the batch shape, and what was measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from helpers import claims, config, memory
from helpers import env as kit_env
from helpers.show import Table, gib

MEASUREMENTS = Path(__file__).resolve().parent / "memory_measurements.json"
#: The issue's bar on the validation half: peak GPU within 10%, host RSS within 15%.
GPU_RTOL, HOST_RTOL = 0.10, 0.15
OK = "ok"
#: Statuses that mean "did not fit": the verdict must never say "fits" for them.
OUT_OF_MEMORY = {kit_env.OUT_OF_GPU_MEMORY: "gpu", "killed for host RAM": "cpu"}
T4 = kit_env.EMULATIONS["t4"]


@dataclass(frozen=True)
class Prediction:
    """One measured row and what the estimator says about it."""

    row: dict
    estimate: memory.Estimate
    words: dict[str, str]  # place -> verdict against a T4's limits


def load(path: str | Path = MEASUREMENTS) -> list[dict]:
    """The rows of a measurements file (a JSON object with "rows", or JSON lines of rows)."""
    text = Path(path).read_text()
    if text.lstrip().startswith("{") and '"rows"' in text[:4000]:
        return json.loads(text)["rows"]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def choice_of(label: str) -> dict:
    """The matrix row's choices for a label of :data:`helpers.config.STAGE_ROWS` (ValueError
    otherwise)."""
    found = dict(config.STAGE_ROWS).get(label)
    if found is None:
        raise ValueError(
            f"unknown matrix row {label!r}: choose one of {', '.join(dict(config.STAGE_ROWS))}"
        )
    return found


#: A row's "overflow_check": "sliced" (the default: the kit's helpers.deepspeed_fixes ran) or
#: "whole buffer" (measured before the kit sliced ZeRO-3's overflow check on 2026-11-30).
SLICED_OVERFLOW_CHECK, WHOLE_OVERFLOW_CHECK = "sliced", "whole buffer"


def sliced_check(row: dict) -> bool:
    """Whether the row's run had the kit's sliced overflow check (ValueError for another value)."""
    value = row.get("overflow_check", SLICED_OVERFLOW_CHECK)
    if value not in (SLICED_OVERFLOW_CHECK, WHOLE_OVERFLOW_CHECK):
        raise ValueError(
            f"row {row.get('id')!r}: overflow_check {value!r} is neither "
            f"{SLICED_OVERFLOW_CHECK!r} nor {WHOLE_OVERFLOW_CHECK!r}"
        )
    return value == SLICED_OVERFLOW_CHECK


def row_config(row: dict, info: memory.ModelInfo) -> dict:
    """The engine config a measured row ran with: its matrix row, fp16, pinned memory off, and the
    row's own ``zero_overrides`` (notebook 06's NVMe rungs size their sub-groups to the model)."""
    ds = config.for_row(
        choice_of(row["row"]),
        info,
        None,
        row["micro_batch"],
        row.get("world_size", 1),
        precision="fp16",
        pin_memory=False,
    )
    ds["zero_optimization"].update(row.get("zero_overrides", {}))
    return ds


def predict(row: dict, infos: dict[str, memory.ModelInfo] | None = None) -> Prediction:
    """The estimate and T4 verdicts (GPU, host RAM) for one row (``infos`` caches ModelInfo by
    shape)."""
    infos = {} if infos is None else infos
    info = infos.setdefault(row["shape"], memory.ModelInfo.for_shape(row["shape"]))
    est = memory.estimate(
        info,
        row_config(row, info),
        world_size=row.get("world_size", 1),
        micro_batch=row["micro_batch"],
        seq_len=row["seq_len"],
        grad_ckpt=row["grad_ckpt"],
        zero_init=bool(row.get("zero_init", False)),
        sliced_overflow_check=sliced_check(row),
    )
    # GPU and host RAM only: a T4 emulation has no disk figure (Colab's free disk varies), and
    # every row's disk use is in the row itself (peak_nvme_bytes)
    limits = {"gpu": T4.gpu_cap_bytes, "cpu": T4.ram_budget_bytes}
    words = {p: v.word for p, v in memory.verdicts({k: est.total(k) for k in limits}, limits).items()}
    return Prediction(row, est, words)


def first_step_only(row: dict) -> bool:
    """Whether the run's GPU peak came before Adam's moments existed: its optimizer states live on
    the GPU (no optimizer offload) and fp16 overflow skipped every step but the last, so no backward
    ran after the first real step, the one that allocates the moments (8 bytes per parameter of
    the partition). Such a peak is a first-step figure, below a longer run's (seen in the grid of
    2026-12-01: Llama-shaped models at DeepSpeed's loss scale 2**16 skipped 2 of 3 steps)."""
    offloaded = choice_of(row["row"]).get("offload_optimizer", "none") != "none"
    taken = row.get("steps_done", 0) - row.get("skipped_steps", 0)
    return not offloaded and row.get("skipped_steps", 0) > 0 and taken <= 1


def adam_moment_bytes(row: dict, info: memory.ModelInfo) -> int:
    """Adam's two fp32 moments on one rank (what a first-step run's backward did not hold yet):
    partitioned across the ranks from stage 1, whole at stage 0."""
    stage = int(choice_of(row["row"]).get("stage", 0))
    return 8 * info.n_params // (max(1, row.get("world_size", 1)) if stage >= 1 else 1)


def _error(predicted: int, measured: int | None) -> float | None:
    return None if not measured else (predicted - measured) / measured


def checks(
    predictions: list[Prediction], gpu_rtol: float = GPU_RTOL, host_rtol: float = HOST_RTOL
) -> list[claims.Claim]:
    """Claims about every row: GPU and host within tolerance where measured, never "fits" when the
    run ran out of memory (GPU) or was killed for host RAM."""
    out = []
    for p in predictions:
        r = p.row
        name = f"{r['id']} ({r['shape']}, {r['row']}, {r['micro_batch']} x {r['seq_len']})"
        if r["status"] in OUT_OF_MEMORY:
            place = OUT_OF_MEMORY[r["status"]]
            out.append(
                (
                    f"{name}: {r['status']}, verdict for {memory.PLACES[place]} is "
                    f"{p.words.get(place)!r}, not 'fits'",
                    p.words.get(place) != memory.FITS,
                )
            )
            continue
        if r["status"] != OK:
            continue
        gpu = r.get("peak_gpu_allocated_bytes")
        if gpu and first_step_only(r) and p.estimate.phase["gpu"].endswith("of backward"):
            # its backward ran without Adam's moments: the estimate less them must match
            info = memory.ModelInfo.for_shape(r["shape"])
            without = p.estimate.total("gpu") - adam_moment_bytes(r, info)
            out.append(
                (
                    f"{name}: first-step run ({r['skipped_steps']} of {r['steps_done']} steps "
                    f"skipped for fp16 overflow), GPU predicted less Adam's moments "
                    f"{gib(without)} GiB within {gpu_rtol:.0%} of {gib(gpu)}",
                    claims.within(without, gpu, gpu_rtol),
                )
            )
        elif gpu and first_step_only(r):  # a first real step's peak: a lower bound, re-measure it
            out.append(
                (
                    f"{name}: first-step run ({r['skipped_steps']} of {r['steps_done']} steps "
                    f"skipped for fp16 overflow; re-measure with --redo-first-step), GPU predicted "
                    f"{gib(p.estimate.total('gpu'))} GiB not below {gib(gpu)} less {gpu_rtol:.0%}",
                    p.estimate.total("gpu") >= (1 - gpu_rtol) * gpu,
                )
            )
        elif gpu:
            out.append(
                (
                    f"{name}: GPU predicted {gib(p.estimate.total('gpu'))} GiB within "
                    f"{gpu_rtol:.0%} of "
                    f"{gib(gpu)}",
                    claims.within(p.estimate.total("gpu"), gpu, gpu_rtol),
                )
            )
        host = r.get("peak_host_rss_bytes")
        if host and not r.get("host_rss_all_ranks"):
            out.append(
                (
                    f"{name}: host predicted {gib(p.estimate.total('cpu'))} GiB within "
                    f"{host_rtol:.0%} of "
                    f"{gib(host)}",
                    claims.within(p.estimate.total("cpu"), host, host_rtol),
                )
            )
    return out


def overall_verdict(words: dict[str, str]) -> str:
    """The worst of a row's verdicts, naming where it binds: "does not fit (host RAM)"."""
    word = memory.worst_verdict(list(words.values()))
    where = [memory.PLACES[p] for p, w in words.items() if w == word and w != memory.FITS]
    return word + (f" ({', '.join(where)})" if where else "")


def table(predictions: list[Prediction], title: str = "Predicted against measured") -> Table:
    """One line per row: measured and predicted GPU and host GiB, errors, the T4 verdict over GPU
    and host RAM (a run killed for host RAM shows the host's), the split."""

    def pct(e: float | None) -> str:
        return "-" if e is None else f"{e:+.1%}"

    out = []
    for p in predictions:
        r, est = p.row, p.estimate
        gpu, host = r.get("peak_gpu_allocated_bytes"), r.get("peak_host_rss_bytes")
        host_cmp = None if r.get("host_rss_all_ranks") else host
        out.append(
            (
                r["shape"],
                r["row"] + (f" x{r['world_size']} GPUs" if r.get("world_size", 1) > 1 else ""),
                f"{r['micro_batch']} x {r['seq_len']}{' ckpt' if r['grad_ckpt'] else ''}",
                r["status"],
                gib(gpu),
                gib(est.total("gpu")),
                pct(_error(est.total("gpu"), gpu)),
                gib(host),
                gib(est.total("cpu")),
                pct(_error(est.total("cpu"), host_cmp)),
                overall_verdict(p.words),
                est.phase.get("gpu", "-"),
                r.get("split", "-"),
            )
        )
    return Table(
        [
            "model",
            "config",
            "batch",
            "status",
            "GPU GiB",
            "predicted",
            "error",
            "host GiB",
            "predicted",
            "error",
            "T4 verdict (GPU, host RAM)",
            "GPU peak at",
            "split",
        ],
        out,
        title=title,
    )


def validation(rows: list[dict]) -> list[dict]:
    """The rows kept out of the fit."""
    return [r for r in rows if r.get("split") == "validation"]
