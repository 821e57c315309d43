"""Notebook 08, beyond data parallelism: pipeline parallelism, mixture of experts and tensor
parallelism (AutoTP) on 2 GPUs (2 gloo CPU ranks without a GPU). The training code is the
notebook's ``lesson`` cells; here, the runs it is launched for (:func:`plan`: one folder per run
holding the lesson cells as ``train.py``, the values injected after the parameters cell, and the
``torchrun`` command that starts it), what each run's processes wrote (:func:`collect`: one JSON
file per rank, the log for errors), the refusals DeepSpeed makes (ZeRO-2/3 with a pipeline, ZeRO-3
with native MoE) read from the runs that tried them, and checks that fail on a bad run.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from helpers import claims, launch, runner, show
from helpers import env as kit_env
from helpers.show import Table
from helpers.lessons import stages_and_offload

#: The notebook whose lesson cells every run executes.
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "08_beyond_data_parallelism.ipynb"

# Labels of the runs (every table, check and takeaway finds a run by its label).
BASE, DP, PIPE, PIPE_1 = ("1 rank, ZeRO-1", "data parallel, 2 ranks, ZeRO-1", "pipeline, 2 stages",
                          "pipeline, 2 stages, 1 micro-batch")
MOE_1, MOE_2 = "MoE, ep_size=1 (1 rank)", "MoE, ep_size=2 (2 ranks)"
TP_1, TP_2 = "Llama, 1 rank, ZeRO-2", "AutoTP, autotp_size=2, ZeRO-2"

#: What DeepSpeed says when it refuses a combination, and the kit's explanation of why.
REFUSALS: dict[str, tuple[str, str]] = {
    "pipeline + ZeRO-2": (
        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
        "a stage accumulates its gradients over all micro-batches and reduces them once per step; "
        "ZeRO-2 reduce-scatters and frees gradients during every backward pass. Use ZeRO-1: the "
        "optimizer states are still split across the data-parallel copies of each stage."),
    "pipeline + ZeRO-3": (
        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
        "ZeRO-3 would gather each stage's parameters again for every micro-batch, on top of the "
        "pipeline's own sends; the pipeline already splits the parameters by stage."),
    "MoE + ZeRO-3": (
        "MoE is not supported with ZeRO Stage 3",
        "native MoE keeps each expert whole on the ranks of its expert-parallel group; ZeRO-3 "
        "would partition it across ranks that never receive its tokens. Use ZeRO-1/2 with the "
        "expert parameters in their own optimizer groups, or DeepSpeed's AutoEP (stage 3 OK)."),
}

#: Every run of the notebook: (label, section, the script's LAYOUT, processes, other values
#: injected). The refusals are the lesson's own layouts at a ZeRO stage DeepSpeed refuses; the
#: pipeline with one micro-batch per step shows the bubble at its largest.
RUNS: list[tuple[str, str, str, int, dict]] = [
    ("pipeline + ZeRO-2", "refusals", "pipeline", 1, {"ZERO_STAGE": 2}),
    ("pipeline + ZeRO-3", "refusals", "pipeline", 1, {"ZERO_STAGE": 3}),
    ("MoE + ZeRO-3", "refusals", "moe", 1, {"ZERO_STAGE": 3}),
    (BASE, "pipeline", "dense", 1, {}),
    (DP, "pipeline", "dense", 2, {}),
    (PIPE, "pipeline", "pipeline", 2, {}),
    (PIPE_1, "pipeline", "pipeline", 2, {"MICRO_BATCHES": 1}),
    (MOE_1, "moe", "moe", 1, {}),
    (MOE_2, "moe", "moe", 2, {}),
    (TP_1, "autotp", "autotp", 1, {}),
    (TP_2, "autotp", "autotp", 2, {}),
]


@dataclass
class Launch:
    """One run of the lesson script: what it trains on how many processes, its folder (train.py,
    log.txt, rank<N>.json), the command that starts it (None: not here, ``why`` says why), and,
    once it ran, its exit code."""

    label: str
    section: str
    layout: str
    world_size: int
    values: dict = field(default_factory=dict)
    folder: str = ""
    command: str | None = None
    why: str = ""
    returncode: int | None = None

    @property
    def log(self) -> str:
        """Where the notebook sends the run's output."""
        return os.path.join(self.folder, "log.txt")

    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step of the whole job (every layout takes the same)."""
        v = self.values
        return v.get("MICRO_BATCH", 0) * v.get("MICRO_BATCHES", 0) * v.get("SEQ_LEN", 0)


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def plan(values: dict, environment: kit_env.Environment, work_dir: str | os.PathLike,
         runs: list[tuple[str, str, str, int, dict]] | None = None,
         notebook: Path = NOTEBOOK) -> list[Launch]:
    """Every run of ``runs`` (default :data:`RUNS`): its folder under ``work_dir`` with
    ``train.py`` (the parameters cell, ``values`` and the run's own after it, the lesson cells)
    and its ``torchrun`` command; a 2-process run on one GPU gets no command, and the reason."""
    runs = RUNS if runs is None else runs
    two, why = two_rank_note(environment)
    ports = launch.free_ports(len(runs))
    out = []
    for (label, section, layout, world, extra), port in zip(runs, ports):
        folder = Path(work_dir) / _slug(label)
        run_values = {**values, "LAYOUT": layout, **extra, "WORK_DIR": str(folder)}
        script = launch.write_train_script(folder, run_values, notebook)
        runnable = world == 1 or two
        out.append(Launch(label, section, layout, world, run_values, str(folder),
                          launch.torchrun_command(script, world, port) if runnable else None,
                          "" if runnable else why))
    return out


_ERROR = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_]\w*(?:Error|Exception): .*|terminate called .*)$",
                    re.M)


def first_error(log: str) -> str:
    """The first exception a rank raised (``SomeError: words``, torchrun's ``[rankN]:`` prefix
    dropped) or C++'s "terminate called ..." of a rank that aborted, or ""; the launcher's own
    summary that follows it is not one."""
    found = _ERROR.search(log)
    return show.clip(" ".join(found.group(1).split()), 300) if found else ""


def _ranks(run: Launch) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in Path(run.folder).glob("rank*.json")),
                  key=lambda r: r.get("rank", 0))


def _log(run: Launch) -> str:
    return Path(run.log).read_text(errors="replace") if Path(run.log).exists() else ""


#: Seconds a launched run may take before `timeout` stops it (exit code 124): a rank that hangs in a
#: collective would otherwise hold the notebook until nbval's cell timeout.
LAUNCH_TIMEOUT_S = 900


def result(run: Launch) -> runner.RunResult:
    """What one launched run left, as a :class:`helpers.runner.RunResult`: not here (no command),
    or every rank's JSON merged (:func:`merge`), with the error from its log when it failed."""
    if run.command is None:
        return not_here(run)
    done = merge(runner.RunResult(run.label, runner.ERROR, world_size=run.world_size), _ranks(run),
                 run.world_size, run.tokens_per_step())
    if run.returncode not in (0, None) or done.status != runner.OK:
        done.status = runner.ERROR
        log = _log(run)
        done.message = (f"timed out after {LAUNCH_TIMEOUT_S} s" if run.returncode == 124 else
                        first_error(log) or f"{done.message or 'failed'}, exit code "
                        f"{run.returncode}; its log ends: " + launch.log_end(log, " / "))
    runner.report({"shape": run.layout, **asdict(done)})
    return done


def refusals_result(runs: list[Launch]) -> runner.RunResult:
    """The refusal runs as one result: per combination, whether the script failed, and the error
    DeepSpeed raised (read from its log)."""
    found = [{"combination": r.label, "refused": r.returncode not in (0, None),
              "error": first_error(_log(r))} for r in runs if r.returncode is not None]
    status = runner.OK if found and len(found) == len(runs) else runner.ERROR
    return runner.RunResult("refusals", status, "" if status == runner.OK else "not run",
                            ranks=[{"rank": 0, "refusals": found}] if found else [])


def collect(runs: list[Launch]) -> tuple[runner.RunResult, dict, dict, dict]:
    """(the refusals, the pipeline section's runs, MoE's, AutoTP's), each run by its label."""
    sections: dict[str, dict] = {"pipeline": {}, "moe": {}, "autotp": {}}
    for run in runs:
        if run.section in sections:
            sections[run.section][run.label] = result(run)
    return (refusals_result([r for r in runs if r.section == "refusals"]), sections["pipeline"],
            sections["moe"], sections["autotp"])


def not_here(run: Launch) -> runner.RunResult:
    """A run that was not started, and why (one GPU: nothing to split across)."""
    return runner.RunResult(run.label, runner.NOT_HERE, run.why, world_size=run.world_size)


def merge(result: runner.RunResult, ranks: list[dict], world_size: int,
          tokens_per_step: int) -> runner.RunResult:
    """Fill a result from the ranks' JSON: ok when every rank wrote one; rank 0's losses and step
    times (losses are already the mean over ranks), tokens/s, the largest GPU peak, all ranks."""
    result.status = runner.OK if ranks and len(ranks) == world_size else runner.ERROR
    result.message = "" if result.status == runner.OK else (
        f"{len(ranks)} of {world_size} ranks reported")
    first = ranks[0] if ranks else {}
    result.n_params = first.get("n_params", 0)
    result.losses = first.get("losses", [])
    result.step_times_s = first.get("step_times_s", [])
    result.steps_done = len(result.losses)
    result.median_step_s = runner.median_step_s(result.step_times_s)
    if result.median_step_s:
        result.tokens_per_s = tokens_per_step / result.median_step_s
    peaks = [r["peak_gpu_allocated_bytes"] for r in ranks if r.get("peak_gpu_allocated_bytes")]
    result.peak_gpu_allocated_bytes = max(peaks) if peaks else None
    result.ranks = ranks
    return result


def two_rank_note(environment: kit_env.Environment) -> tuple[bool, str]:
    """(can 2-rank runs go here, why): 2 GPUs, or 2 CPU ranks without a GPU; not on 1 GPU."""
    where, why = stages_and_offload.two_rank_plan(environment)
    return where is not None, why


# ---- checks --------------------------------------------------------------------------------------


def _ok(runs: dict, label: str) -> runner.RunResult | None:
    r = runs.get(label)
    return r if r is not None and r.status == runner.OK else None


def _losses_claim(label: str, run: runner.RunResult | None, base: runner.RunResult | None,
                  environment: kit_env.Environment) -> claims.Claim:
    first, every = stages_and_offload.loss_tolerance(environment)
    a, b = (base.losses if base else []), (run.losses if run else [])
    held = (bool(a) and len(a) == len(b) and claims.within(b[0], a[0], first)
            and claims.every(claims.within(y, x, every) for x, y in zip(a, b)))
    return (f"{label}: losses match the 1-rank run (first within {first:g}, all within {every:g})",
            held)


def _ran_or_explained(runs: dict) -> claims.Claim:
    """Every run ran or says why not; a failed one is named with its error, which is all a CI
    log shows of a run that failed there."""
    failed = [f"{r.label}: {r.message or r.status}" for r in runs.values()
              if not runner.explained(r)]
    return ("every run ran, or says why it did not (no errors)"
            + ("; failed: " + " | ".join(failed) if failed else ""),
            claims.every(runner.explained(r) for r in runs.values()))


def _split_claim(label: str, run: runner.RunResult | None, whole: int,
                 share_max: float) -> list[claims.Claim]:
    """Each of 2 ranks holds at most ``share_max`` of the whole model's parameters."""
    held = [r.get("n_params") or 0 for r in (run.ranks if run else [])]
    return [(f"{label}: 2 ranks reported their parameters ({', '.join(map(str, held)) or 'none'})",
             len(held) == 2),
            (f"{label}: each rank holds at most {share_max:.0%} of the model's {whole:,} "
             "parameters",
             whole > 0 and claims.every(0 < h <= share_max * whole for h in held))]


def _gpu_split_claim(label: str, run: runner.RunResult | None,
                     base: runner.RunResult | None) -> claims.Claim:
    peaks = [r.get("peak_gpu_allocated_bytes") or 0 for r in (run.ranks if run else [])]
    whole = base.peak_gpu_allocated_bytes if base else None
    return (f"{label}: every GPU peaks below the 1-GPU run's peak",
            bool(whole) and claims.every(0 < p < whole for p in peaks))


def pipeline_checks(runs: dict, environment: kit_env.Environment) -> list[claims.Claim]:
    """The pipeline's claims: it ran, each stage holds part of the model (and of the GPU memory),
    losses equal the 1-rank run's; on GPUs, one micro-batch per step leaves the stages idler."""
    base = _ok(runs, BASE)
    out = [_ran_or_explained(runs), (f"{BASE} ran", base is not None),
           claims.loss_falls_claim(BASE, base.losses if base else [])]
    if runs.get(PIPE) and runs[PIPE].status == runner.NOT_HERE:
        return out
    pipe, data_parallel = _ok(runs, PIPE), _ok(runs, DP)
    whole = base.n_params if base else 0
    out += _split_claim(PIPE, pipe, whole, 0.75)
    if pipe:
        out.append((f"{PIPE}: the two stages' parameters add up to the whole model",
                    sum(r.get("n_params") or 0 for r in pipe.ranks) == whole))
    out += [_losses_claim(PIPE, pipe, base, environment), _losses_claim(DP, data_parallel, base,
                                                                        environment)]
    if environment.has_gpu:
        out.append(_gpu_split_claim(PIPE, pipe, base))
        few, many = idle_fraction(runs.get(PIPE_1)), idle_fraction(runs.get(PIPE))
        out.append((f"{PIPE}: stages idle less with more micro-batches per step",
                    few is not None and many is not None and many < few))
    return out


def moe_checks(runs: dict, environment: kit_env.Environment) -> list[claims.Claim]:
    """MoE's claims: the gate's counts cover every token, the aux loss is finite; with ep_size=2
    each rank holds half the experts and the dense part whole, losses equal ep_size=1's."""
    one = _ok(runs, MOE_1)
    out = [_ran_or_explained(runs), (f"{MOE_1} ran", one is not None),
           claims.loss_falls_claim(MOE_1, one.losses if one else [])]
    for label in (MOE_1, MOE_2):
        run = _ok(runs, label)
        if run is None:
            continue
        aux = [a for r in run.ranks for a in r.get("aux_losses", [])]
        out.append((f"{label}: the load-balancing loss is finite and positive",
                    claims.every(math.isfinite(a) and a > 0 for a in aux)))
        out.append((f"{label}: the gate sent every token to an expert (counts add up)",
                    tokens_seen(run) > 0 and claims.every(
                        tokens_routed(run, layer) == tokens_seen(run)
                        for layer in range(len(run.ranks[0].get("expert_counts") or [])))))
    if runs.get(MOE_2) and runs[MOE_2].status == runner.NOT_HERE:
        return out
    two = _ok(runs, MOE_2)
    solo = one.ranks[0] if one else {}
    experts = [r.get("expert_params") or 0 for r in (two.ranks if two else [])]
    dense = [r.get("dense_params") for r in (two.ranks if two else [])]
    out += [(f"{MOE_2}: each of 2 ranks holds half of the experts' parameters",
             len(experts) == 2 and bool(solo.get("expert_params"))
             and claims.every(2 * e == solo["expert_params"] for e in experts)),
            (f"{MOE_2}: each rank holds the whole dense part (attention, embeddings)",
             len(dense) == 2 and claims.every(d == solo.get("dense_params") for d in dense)),
            _losses_claim(MOE_2, two, one, environment)]
    if environment.has_gpu:
        out.append(_gpu_split_claim(MOE_2, two, one))
    return out


def tp_checks(runs: dict, environment: kit_env.Environment) -> list[claims.Claim]:
    """AutoTP's claims: it ran, each rank holds part of the model, losses equal the 1-rank run's."""
    one = _ok(runs, TP_1)
    out = [_ran_or_explained(runs), (f"{TP_1} ran", one is not None),
           claims.loss_falls_claim(TP_1, one.losses if one else [])]
    if runs.get(TP_2) and runs[TP_2].status == runner.NOT_HERE:
        return out
    two = _ok(runs, TP_2)
    out += _split_claim(TP_2, two, one.n_params if one else 0, 0.8)
    out.append(_losses_claim(TP_2, two, one, environment))
    if environment.has_gpu:
        out.append(_gpu_split_claim(TP_2, two, one))
    return out


def refusal_checks(result: runner.RunResult) -> list[claims.Claim]:
    """Each combination of :data:`REFUSALS` was refused with DeepSpeed's expected words: a check
    that fails the day DeepSpeed accepts one (or refuses it for another reason)."""
    found = {r["combination"]: r for r in (result.ranks[0].get("refusals", [])
                                           if result.ranks else [])}
    out = [("the refusal run came back", result.status == runner.OK and bool(found))]
    for name, (words, _) in REFUSALS.items():
        got = found.get(name, {})
        out.append((f"{name}: DeepSpeed refuses it ({words!r})",
                    bool(got.get("refused")) and words in got.get("error", "")))
    return out


# ---- figures derived from the runs ---------------------------------------------------------------


def idle_fraction(run: runner.RunResult | None) -> float | None:
    """The share of a pipeline step a stage spent outside forward and backward (waiting for the
    other stage, sending, the optimizer step), the busiest stage's, steps after the first."""
    if run is None or run.status != runner.OK:
        return None
    shares = []
    for r in run.ranks:
        pairs = list(zip(r.get("busy_s", []), r.get("step_times_s", [])))[1:]
        if pairs:
            shares.append(1 - sum(b for b, _ in pairs) / sum(t for _, t in pairs))
    return min(shares) if shares else None


def bubble_theory(stages: int, micro_batches: int) -> float:
    """The pipeline bubble of a 1F1B/GPipe schedule: (p - 1) / (m + p - 1) of a step idle."""
    return (stages - 1) / (micro_batches + stages - 1)


def tokens_routed(run: runner.RunResult, layer: int) -> int:
    """Tokens the gates of one MoE layer assigned over the run, all ranks together."""
    return sum(sum(counts[layer]) for r in run.ranks
               if len(counts := r.get("expert_counts") or []) > layer)


def tokens_seen(run: runner.RunResult) -> int:
    """Tokens that entered each MoE layer over the run, all ranks together."""
    return sum(r.get("tokens") or 0 for r in run.ranks)


def expert_tokens(run: runner.RunResult) -> list[int]:
    """Tokens each expert received over the run (all layers, all ranks)."""
    totals: list[int] = []
    for r in run.ranks:
        for layer in r.get("expert_counts") or []:
            totals = [a + b for a, b in zip(totals, layer)] if totals else list(layer)
    return totals


def moe_sizes(run: runner.RunResult | None, experts: int) -> dict[str, int]:
    """Parameters of the MoE GPT as one rank with all experts counted them: all of them, and
    those one token passes through (top-1: the dense part plus one expert of each layer), which
    sets the compute per token. Empty when the run did not come back."""
    if run is None or not run.ranks or not run.ranks[0].get("expert_params"):
        return {}
    dense, expert = run.ranks[0]["dense_params"], run.ranks[0]["expert_params"]
    return {"total": dense + expert, "active": dense + expert // experts, "dense": dense,
            "experts": expert}


# ---- tables, figures, summary --------------------------------------------------------------------

#: The dimensions of 3D parallelism (and experts): what each splits, what it sends, which ZeRO
#: stages DeepSpeed lets it combine with (the refusals are run in notebook 08).
DIMENSIONS = [
    ("data", "the batch: every rank holds a whole copy of the model",
     "all-reduce of all gradients once per step (ZeRO: reduce-scatter + all-gather)",
     "0, 1, 2, 3"),
    ("pipeline", "the layers: each stage holds a contiguous slice of them",
     "activations forward and their gradients backward, per micro-batch, between neighbours "
     "only; idle stages at the start and end of each step (the bubble)",
     "0, 1 (2 and 3 refused)"),
    ("tensor", "every layer's weight matrices, by columns or rows",
     "an all-reduce of activations inside every layer, forward and backward: needs a fast link",
     "0, 1, 2, 3 (AutoTP: DeepSpeed 0.19.8 refuses none; run here with 2)"),
    ("experts (MoE)", "the experts of each MoE layer; the rest of the model is data parallel",
     "two all-to-alls per MoE layer, forward and backward (tokens to their expert and back)",
     "0, 1, 2 (native MoE; 3 refused, AutoEP allows it)"),
]


def dimensions_table() -> Table:
    """What each dimension splits, what it communicates, which ZeRO stages combine with it."""
    return Table(["dimension", "splits", "communicates", "ZeRO stages"], DIMENSIONS,
                 title="The dimensions of parallelism (3D: data x pipeline x tensor)")


def three_d_figure():
    """8 GPUs as a 2 x 2 x 2 grid: pipeline stages left to right, tensor-parallel pairs, data-
    parallel copies; beside it, what one GPU holds of a 4-layer model under each split."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    fig, (grid, held) = plt.subplots(1, 2, figsize=(11, 3.8),
                                     gridspec_kw={"width_ratios": [1.1, 1]})
    colours = {0: "#8ecae6", 1: "#ffb703"}
    for copy in (0, 1):  # data-parallel copies, drawn one above the other
        for stage in (0, 1):
            for half in (0, 1):  # tensor-parallel halves of a stage
                x, y = 0.3 + stage * 2.2 + half * 0.95, 0.3 + copy * 1.9
                grid.add_patch(Rectangle((x, y), 0.85, 1.3, facecolor=colours[stage],
                                         edgecolor="black", alpha=0.5 + 0.3 * half))
                grid.text(x + 0.42, y + 0.65, f"GPU {copy * 4 + stage * 2 + half}\nlayers "
                          f"{'1-2' if stage == 0 else '3-4'}\n{'left' if half == 0 else 'right'} "
                          "half", ha="center", va="center", fontsize=7)
        grid.add_patch(FancyArrowPatch((2.2, 0.95 + copy * 1.9), (2.5, 0.95 + copy * 1.9),
                                       arrowstyle="->", mutation_scale=12))
        grid.text(4.75, 0.95 + copy * 1.9, f"data copy {copy}\n(half the batch)", fontsize=8,
                  va="center")
    grid.text(2.3, 4.05, "pipeline: stage 0 -> stage 1 (activations)", ha="center", fontsize=8)
    grid.text(2.3, -0.1, "tensor: each stage's matrices split in two (all-reduce per layer)",
              ha="center", fontsize=8)
    grid.set_xlim(0, 6)
    grid.set_ylim(-0.3, 4.3)
    grid.axis("off")
    grid.set_title("3D parallelism on 8 GPUs: 2 data x 2 pipeline x 2 tensor", fontsize=9)
    rows = [("data parallel", [1, 1, 1, 1], 1.0), ("pipeline (2 stages)", [1, 1, 0, 0], 1.0),
            ("tensor (2-way)", [1, 1, 1, 1], 0.5), ("MoE (2-way experts)", [1, 1, 1, 1], 0.5)]
    for i, (name, layers, width) in enumerate(rows):
        y = 3 - i
        for j, here in enumerate(layers):
            held.add_patch(Rectangle((1.6 + j * 0.9, y), 0.8 * (width if here else 1), 0.6,
                                     facecolor="#219ebc" if here else "white", edgecolor="black"))
        held.text(1.5, y + 0.3, name, ha="right", va="center", fontsize=8)
    held.text(3.4, 3.85, "what GPU 0 holds of a 4-layer model\n(MoE: half of each layer's "
              "experts; tensor: half of each matrix)", ha="center", fontsize=8)
    held.set_xlim(0, 5.4)
    held.set_ylim(-0.2, 4.4)
    held.axis("off")
    fig.tight_layout()
    return fig


def refusal_table(result: runner.RunResult) -> Table:
    """Each combination tried, whether DeepSpeed refused it, its words and the kit's why."""
    found = {r["combination"]: r for r in (result.ranks[0].get("refusals", [])
                                           if result.ranks else [])}
    rows = [(name, found.get(name, {}).get("refused"), found.get(name, {}).get("error") or
             show.status_cell(result.status, result.message, runner.OK, 80), why)
            for name, (_, why) in REFUSALS.items()]
    return Table(["combination", "refused", "DeepSpeed says", "why (the kit's explanation)"], rows,
                 title="Combinations DeepSpeed refuses (tried in a fresh process, errors caught)")


def _per_rank(run: runner.RunResult, key: str, fmt=lambda v: f"{v:,}") -> str:
    values = [r.get(key) for r in run.ranks]
    return " / ".join("-" if v is None else fmt(v) for v in values) or "-"


def runs_table(runs: dict, title: str, environment: kit_env.Environment) -> Table:
    """Every run of a section: status, ranks, parameters and peak GPU memory per rank, speed,
    loss, and for pipelines the idle share of a step against the bubble's theory."""
    rows = []
    for label, r in runs.items():
        idle = idle_fraction(r)
        m = r.ranks[0].get("micro_batches") if r.ranks and label.startswith("pipeline") else None
        theory = f"{bubble_theory(2, m):.0%}" if m else "-"
        rows.append((label, show.status_cell(r.status, r.message, runner.OK, 70), r.world_size,
                     _per_rank(r, "n_params"),
                     _per_rank(r, "peak_gpu_allocated_bytes", show.gib) if environment.has_gpu
                     else "-", show.seconds(r.median_step_s),
                     "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
                     "-" if idle is None else f"{idle:.0%} (theory {theory})",
                     show.loss_cell(r.losses, 4)))
    return Table(["run", "status", "ranks", "parameters per rank", "peak GPU GiB per rank",
                  "s/step", "tokens/s", "idle share of a step", "loss first -> last"], rows,
                 title=f"{title}, {environment.measured_on()}")


def moe_table(runs: dict) -> Table:
    """Per rank: the experts it holds, expert and dense parameters, tokens its experts got."""
    rows = []
    for label, r in runs.items():
        totals = expert_tokens(r) if r.status == runner.OK else []
        for x in r.ranks:
            held = x.get("experts_held") or []
            rows.append((label, x.get("rank"), ", ".join(map(str, held)) or "-",
                         f"{x.get('expert_params') or 0:,}", f"{x.get('dense_params') or 0:,}",
                         sum(totals[i] for i in held if i < len(totals)),
                         show.loss_cell(x.get("aux_losses") or [], 3)))
        if not r.ranks:
            rows.append((label, "-", show.status_cell(r.status, r.message, runner.OK, 60),
                         "-", "-", "-", "-"))
    return Table(["run", "rank", "experts held", "expert params", "dense params",
                  "tokens its experts got", "aux loss first -> last"], rows,
                 title="Mixture of experts: who holds what, who computes what")


def plot_expert_tokens(run: runner.RunResult | None, title: str = ""):
    """Tokens per expert over the run (all layers): the load the auxiliary loss balances."""
    import matplotlib.pyplot as plt

    totals = expert_tokens(run) if run is not None else []
    fig, ax = plt.subplots(figsize=(6, 2.8))
    owner = {}
    for x in (run.ranks if run else []):
        for i in x.get("experts_held") or []:
            owner.setdefault(i, x.get("rank"))
    ax.bar(range(len(totals)), totals, color=[f"C{owner.get(i, 0)}" for i in range(len(totals))])
    if totals:
        ax.axhline(sum(totals) / len(totals), color="black", linestyle="--", linewidth=1,
                   label="perfect balance")
        ax.legend(fontsize=7)
    ax.set_xlabel("expert (colour: the rank that holds it)")
    ax.set_ylabel("tokens routed")
    ax.set_title(title or "Tokens per expert", fontsize=9)
    fig.tight_layout()
    return fig


def plot_memory_speed(runs: dict, environment: kit_env.Environment):
    """Per rank: peak GPU GiB on GPUs, else parameters held (millions); and tokens/s per run."""
    import matplotlib.pyplot as plt

    done = {k: r for k, r in runs.items() if r.status == runner.OK}
    fig, (mem, speed) = plt.subplots(1, 2, figsize=(11, 3.4))
    key = "peak_gpu_allocated_bytes" if environment.has_gpu else "n_params"
    scale = show.GiB if environment.has_gpu else 1e6
    labels, x = list(done), 0
    for i, (label, r) in enumerate(done.items()):
        for j, rank in enumerate(r.ranks):
            mem.bar(i + (j - (len(r.ranks) - 1) / 2) * 0.35, (rank.get(key) or 0) / scale, 0.33,
                    color=f"C{j}", label=f"rank {j}" if i == 0 or (j and x == 0) else None)
        x += len(r.ranks) > 1
    mem.set_xticks(range(len(labels)), labels, rotation=25, ha="right", fontsize=7)
    mem.set_ylabel("peak GPU GiB" if environment.has_gpu else "parameters held (millions)")
    mem.set_title("What each rank holds" + ("" if environment.has_gpu else
                                            " (no GPU: parameters, not memory)"), fontsize=9)
    mem.legend(fontsize=7)
    speed.bar(labels, [r.tokens_per_s or 0 for r in done.values()], color="gray")
    speed.set_xticks(range(len(labels)), labels, rotation=25, ha="right", fontsize=7)
    speed.set_ylabel("tokens/s")
    speed.set_title("Throughput (whole job)", fontsize=9)
    fig.tight_layout()
    return fig


def loss_curves(*sections: dict):
    """Every run's losses, one line each: layouts of the same model should lie on top."""


    curves = {label: r.losses for runs in sections for label, r in runs.items() if r.losses}
    return show.loss_curves(curves, "Loss per step: each layout against its 1-rank run")


def takeaways(pipe: dict, moe: dict, tp: dict, refused: runner.RunResult,
              environment: kit_env.Environment, experts: int) -> list[str]:
    """Notebook 08's summary, each figure from this run."""
    where = "GPU" if environment.has_gpu else "CPU rank (gloo; no GPU here)"
    lines = []
    base, pp = _ok(pipe, BASE), _ok(pipe, PIPE)
    if base and pp:
        held = " / ".join(f"{r.get('n_params', 0) / 1e6:.2f}M" for r in pp.ranks)
        lines.append(f"The 2-stage pipeline split the GPT's {base.n_params / 1e6:.2f}M parameters "
                     f"as {held} per {where}, with the 1-rank run's losses ({pp.losses[0]:.4f} -> "
                     f"{pp.losses[-1]:.4f}).")
        few, many = idle_fraction(_ok(pipe, PIPE_1)), idle_fraction(pp)
        if few is not None and many is not None:
            lines.append(f"Stages sat idle {few:.0%} of a step with 1 micro-batch and {many:.0%} "
                         f"with more (the bubble's theory: {bubble_theory(2, 1):.0%} and less); "
                         f"tokens/s: pipeline {pp.tokens_per_s:,.0f}, data parallel "
                         f"{(_ok(pipe, DP) or pp).tokens_per_s:,.0f}, 1 rank "
                         f"{base.tokens_per_s:,.0f}"
                         + ("." if environment.has_gpu else " (not checked here: CPU ranks share "
                            "the cores, so idle time is noise; the GPU run checks it)."))
    sizes = moe_sizes(_ok(moe, MOE_1), experts)
    if sizes:
        lines.append(f"The MoE GPT has {sizes['total'] / 1e6:.2f}M parameters but a token passes "
                     f"through {sizes['active'] / 1e6:.2f}M ({sizes['active'] / sizes['total']:.0%}"
                     f"): {experts} experts, top-1 routing.")
    two = _ok(moe, MOE_2)
    if two:
        mine = two.ranks[0].get("expert_params", 0) / 1e6
        lines.append(f"With ep_size=2 each rank held {mine:.2f}M"
                     f" of the {sizes.get('experts', 0) / 1e6:.2f}M expert parameters; tokens per "
                     f"expert {expert_tokens(two)}.")
    tp2, tp1 = _ok(tp, TP_2), _ok(tp, TP_1)
    if tp2 and tp1:
        shares = " + ".join(f"{r.get('n_params', 0) / 1e6:.2f}M" for r in tp2.ranks)
        lines.append(f"AutoTP split the Llama-shaped model's {tp1.n_params / 1e6:.2f}M parameters "
                     f"into {shares} (norms stay whole), losses {tp2.losses[0]:.4f} -> "
                     f"{tp2.losses[-1]:.4f} as on 1 rank.")
    refusals = [r["combination"] for r in (refused.ranks[0].get("refusals", [])
                                           if refused.ranks else []) if r.get("refused")]
    lines.append(f"DeepSpeed refused {', '.join(refusals) or 'nothing'}: pipelines take ZeRO-0/1, "
                 "native MoE ZeRO-0/1/2.")
    if not two_rank_note(environment)[0]:
        lines.append("One GPU here: the 2-rank runs were not started. On Kaggle (GPU T4 x2) every "
                     "section runs on two GPUs.")
    lines.append("Next: 09 · ZeRO or LoRA: full fine-tuning with ZeRO against LoRA on the same tokens.")
    return lines


def summary(pipe: dict, moe: dict, tp: dict, refused: runner.RunResult,
            all_claims: list[claims.Claim]) -> str:
    """Facts that read the same on a CPU and on 2 GPUs (notebook 08's checked output)."""
    runs = {**pipe, **moe, **tp}
    said = [r["combination"] for r in (refused.ranks[0].get("refusals", [])
                                       if refused.ranks else []) if r.get("refused")]
    return "\n".join([
        "runs: " + " | ".join(runs),
        "every run ran or explained itself: "
        f"{claims.every(runner.explained(r) for r in runs.values())}",
        "DeepSpeed refused: " + (" | ".join(said) or "nothing"),
        f"all checks held: {claims.every(held for _, held in all_claims)}",
    ])
