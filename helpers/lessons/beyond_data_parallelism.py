"""Notebook 08, beyond data parallelism: pipeline parallelism, mixture of experts and tensor
parallelism (AutoTP) on 2 GPUs (2 gloo CPU ranks without a GPU), each run in a fresh subprocess
(``torchrun`` for 2 ranks) that returns one JSON file per rank; the refusals DeepSpeed makes
(ZeRO-2/3 with a pipeline, ZeRO-3 with native MoE) caught and explained; checks that fail on a
bad run. The model code the runs execute is its last section, shown in the notebook.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from helpers import claims, runner, show
from helpers import env as kit_env
from helpers.show import Table
from helpers.lessons import stages_and_offload

KINDS = ("dense", "pipeline", "moe", "autotp", "refusals")

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


@dataclass
class ParallelSpec:
    """One run of notebook 08: what kind, on how many ranks, with which model and batches."""

    kind: str
    label: str = ""
    world_size: int = 1
    stage: int = 1  # ZeRO stage
    stages: int = 1  # pipeline stages ("pipeline")
    tensor_parallel: int = 1  # AutoTP size ("autotp")
    layers: int = 4
    width: int = 64
    heads: int = 2
    vocab: int = 257
    seq_len: int = 64
    micro_batch: int = 2
    micro_batches: int = 4  # per optimizer step, whole job: the same global batch in every layout
    steps: int = 4
    experts: int = 4  # "moe"
    ep_size: int = 1  # "moe": ranks the experts are spread over
    aux_coef: float = 0.01  # "moe": weight of the load-balancing loss
    tp_shape: str = "llama-tiny"  # "autotp": a Llama shape of helpers.models
    precision: str = "fp32"
    lr: float = 3e-3
    warmup: int = 2
    seed: int = 0
    timeout_s: int = 900
    force_cpu: bool = False

    def data_parallel(self) -> int:
        """How many copies of the model the ranks hold (the rest of the ranks split one copy)."""
        return self.world_size // (self.stages * self.tensor_parallel)

    def problems(self) -> list[str]:
        """What is wrong with the spec, one sentence each (empty: it can run)."""
        out = []
        if self.kind not in KINDS:
            out.append(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.world_size < 1 or self.world_size % (self.stages * self.tensor_parallel):
            out.append(f"world size {self.world_size} is not a multiple of stages x tensor "
                       f"parallel ({self.stages} x {self.tensor_parallel})")
        elif self.micro_batches % max(1, self.data_parallel()):
            out.append(f"{self.micro_batches} micro-batches do not split evenly over "
                       f"{self.data_parallel()} data-parallel ranks")
        if self.kind == "moe" and (self.ep_size < 1 or self.experts % self.ep_size):
            out.append(f"{self.experts} experts do not split over ep_size={self.ep_size}")
        if self.steps < 1 or self.micro_batches < 1 or self.micro_batch < 1:
            out.append("steps, micro_batches and micro_batch must be at least 1")
        return out


def global_tokens(spec: ParallelSpec) -> int:
    """Tokens in one optimizer step of the whole job."""
    return spec.micro_batch * spec.micro_batches * spec.seq_len


# ---- the worker (one rank, inside the subprocess) ------------------------------------------------


def _shape(spec: ParallelSpec):
    return GPTShape(spec.layers, spec.width, spec.heads, spec.vocab, spec.seq_len)


def _start(spec: ParallelSpec) -> bool:
    """Device, T4 emulation, process group (an in-process store for one rank); True on a GPU."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        kit_env.emulate()  # KIT_EMULATE, as the parent set it: the same GPU cap here
    else:  # one thread per rank, as torchrun gives each CPU rank: 1 and 2 ranks compare fairly
        torch.set_num_threads(1)
    kit_env.setup_single_process_dist()
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        import torch.distributed as torch_dist

        torch_dist.init_process_group("nccl" if cuda else "gloo", store=torch_dist.HashStore(),
                                      rank=0, world_size=1)
    import deepspeed

    from helpers import deepspeed_fixes

    deepspeed_fixes.apply_all()
    deepspeed.init_distributed()  # a PipelineModule needs the group before deepspeed.initialize
    return cuda


def _all_micro_batches(spec: ParallelSpec) -> list:
    """Every micro-batch of the run, step after step: the same tokens for every layout."""
    from helpers import data, models

    n = spec.steps * spec.micro_batches
    corpus = data.offline_corpus(max(50_000, spec.seq_len * spec.micro_batch * (n + 2) * 2),
                                 seed=spec.seed)
    return data.batches(corpus, models.ByteTokenizer(), spec.seq_len, spec.micro_batch, n,
                        seed=spec.seed)


def _mine(spec: ParallelSpec, everything: list, step: int, dp_rank: int) -> list:
    """This data-parallel rank's share of one step's micro-batches."""
    m = spec.micro_batches
    share = m // spec.data_parallel()
    return everything[step * m:(step + 1) * m][dp_rank * share:(dp_rank + 1) * share]


def _mean_over_ranks(value: float, device) -> float:
    import torch
    import torch.distributed as torch_dist

    t = torch.tensor([value], dtype=torch.float64 if device.type == "cpu" else torch.float32,
                     device=device)
    torch_dist.all_reduce(t)
    return float(t.item()) / torch_dist.get_world_size()


def _held(engine, result: dict) -> None:
    result.update({k: v for k, v in runner.held_bytes(engine).items() if k != "grads_bytes"})
    result["n_params"] = sum(p.numel() for p in engine.module.parameters())


def _timed_pipeline(engine, busy: list[float], cuda: bool) -> None:
    """Time the forward and backward instructions of the pipeline schedule on this stage: the
    rest of a step is waiting (the bubble), sending activations and the optimizer step."""
    import torch
    from deepspeed.runtime.pipe import schedule

    def timed(fn):
        def run(self, *args, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = fn(self, *args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            busy[-1] += time.perf_counter() - start
            return out
        return run

    table = dict(engine._INSTRUCTION_MAP)
    for kind in (schedule.ForwardPass, schedule.BackwardPass):
        table[kind] = timed(table[kind])
    engine._INSTRUCTION_MAP = table  # the instance's map shadows the class's


def _train(spec: ParallelSpec, result: dict) -> None:
    """dense, pipeline, moe and autotp: build, ``deepspeed.initialize``, train, measure."""
    import deepspeed
    import torch

    cuda = _start(spec)
    rank = int(os.environ.get("RANK", "0"))
    shape = _shape(spec)
    dp = spec.data_parallel()
    config = engine_config(spec.micro_batch, spec.micro_batches // dp, spec.stage,
                              spec.precision, spec.lr, spec.warmup, spec.tensor_parallel,
                              optimizer=spec.kind != "moe")
    busy: list[float] = []
    if spec.kind == "pipeline":
        model = pipeline_model(shape, spec.stages, spec.seed)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        result["stage_id"], result["layers"] = engine.stage_id, [
            type(layer).__name__ for layer in model.forward_funcs]
        _timed_pipeline(engine, busy, cuda)
        dp_rank = 0
    elif spec.kind == "moe":
        torch.manual_seed(spec.seed)
        model = MoEGPT(shape, spec.experts, spec.ep_size)
        engine, *_ = deepspeed.initialize(model=model, optimizer=moe_optimizer(model, spec.lr),
                                          config=config)
        dp_rank = rank
        _moe_facts(spec, model, result)
    elif spec.kind == "autotp":
        from helpers import models

        model = models.build_model(models.model_config(spec.tp_shape, spec.vocab,
                                                       max(1024, spec.seq_len)), seed=spec.seed)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        dp_rank = 0  # every rank of a tensor-parallel group sees the same batch
    else:
        model = dense_model(shape, spec.seed)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          config=config)
        dp_rank = rank
    everything = _all_micro_batches(spec)
    losses, aux, times, counts, tokens = [], [], [], None, 0
    for step in range(spec.steps):
        mine = [ids.to(engine.device) for ids in _mine(spec, everything, step, dp_rank)]
        busy.append(0.0)
        start = time.perf_counter()
        if spec.kind == "pipeline":
            loss = train_pipeline_step(engine, mine)  # already the mean of every micro-batch
        else:
            out = train_step(engine, mine, spec.aux_coef, hugging_face=spec.kind == "autotp")
            loss = _mean_over_ranks(out["loss"], engine.device)
            if out["aux"] is not None:
                aux.append(_mean_over_ranks(out["aux"], engine.device))
                counts = out["counts"] if counts is None else [
                    [a + b for a, b in zip(x, y)] for x, y in zip(counts, out["counts"])]
        tokens += sum(ids.numel() for ids in mine)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss)
        if step == 0:
            _held(engine, result)
    result.update(losses=losses, step_times_s=times, steps_done=len(losses),
                  micro_batches=spec.micro_batches)
    if busy and spec.kind == "pipeline":
        result["busy_s"] = busy
    if aux:
        result.update(aux_losses=aux, expert_counts=counts, tokens=tokens)
    if cuda:
        result["peak_gpu_allocated_bytes"] = torch.cuda.max_memory_allocated()


def _moe_facts(spec: ParallelSpec, model, result: dict) -> None:
    """Which experts this rank holds, and its expert and dense parameter counts."""
    import torch.distributed as torch_dist
    from deepspeed.moe.utils import is_moe_param

    local = spec.experts // spec.ep_size
    first = (torch_dist.get_rank() % spec.ep_size) * local
    result["experts_held"] = list(range(first, first + local))
    result["expert_params"] = sum(p.numel() for p in model.parameters() if is_moe_param(p))
    result["dense_params"] = sum(p.numel() for p in model.parameters() if not is_moe_param(p))


def _refusals(spec: ParallelSpec, result: dict) -> None:
    """Try each combination of :data:`REFUSALS` in one process; record what DeepSpeed said."""
    import deepspeed
    import torch

    _start(spec)
    shape = GPTShape(1, 64, 2, spec.vocab, spec.seq_len)  # the refusal comes before any step
    found = []
    for name in REFUSALS:
        stage = 2 if "ZeRO-2" in name else 3
        config = engine_config(spec.micro_batch, 1, stage, spec.precision, spec.lr, spec.warmup,
                                  optimizer=not name.startswith("MoE"))
        try:
            if name.startswith("pipeline"):
                model = pipeline_model(shape, stages=1, seed=spec.seed)
                deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                     config=config)
            else:
                torch.manual_seed(spec.seed)
                model = MoEGPT(shape, spec.experts, ep_size=1)
                deepspeed.initialize(model=model, optimizer=moe_optimizer(model, spec.lr),
                                     config=config)
            found.append({"combination": name, "refused": False, "error": ""})
        except Exception as err:  # the refusal we came for (or another error: the check says)
            text = " ".join(str(err).split())
            found.append({"combination": name, "refused": True,
                          "error": f"{type(err).__name__}: {text}"[:300]})
    result["refusals"] = found


#: The entry point each rank of a notebook 08 run starts at (helpers.runner runs it).
RANK_ENTRY = "helpers.lessons.beyond_data_parallelism:run_rank"


def run_rank(payload: dict, result: dict) -> None:
    """One rank of one run, inside its subprocess: the refusals, or a run to train and measure."""
    spec = ParallelSpec(**payload)
    (_refusals if spec.kind == "refusals" else _train)(spec, result)


# ---- the parent ----------------------------------------------------------------------------------


def not_here(spec: ParallelSpec, why: str) -> runner.RunResult:
    """A run that was not started, and why (one GPU: nothing to split across)."""
    return runner.RunResult(spec.label, runner.NOT_HERE, why, world_size=spec.world_size)


def measure(spec: ParallelSpec) -> runner.RunResult:
    """Run ``spec`` in a fresh subprocess (``torchrun`` for 2 ranks, through helpers.runner);
    every rank's JSON comes back in ``ranks``. A spec that cannot run is refused in one line
    (ValueError)."""
    bad = spec.problems()
    if bad:
        raise ValueError(f"{spec.label or spec.kind}: " + "; ".join(bad))
    result = runner.run_ranks(asdict(spec), RANK_ENTRY, spec.world_size, spec.label or spec.kind,
                              timeout_s=spec.timeout_s, force_cpu=spec.force_cpu,
                              merge=lambda result, ranks: merge(result, ranks, spec),
                              work_prefix="kit_parallel_")
    runner.report({"shape": spec.kind, **asdict(result)})
    return result


def merge(result: runner.RunResult, ranks: list[dict], spec: ParallelSpec) -> runner.RunResult:
    """Fill a result from the ranks' JSON: status (every rank ok), rank 0's losses and step
    times (losses are already the mean over ranks), tokens/s, the largest GPU peak, all ranks."""
    bad = [r for r in ranks if r.get("status") != runner.OK]
    result.status = (runner.OK if not bad and len(ranks) == spec.world_size
                     else bad[0]["status"] if bad else runner.ERROR)
    result.message = bad[0].get("message", "") if bad else (
        "" if len(ranks) == spec.world_size
        else f"{len(ranks)} of {spec.world_size} ranks reported")
    first = ranks[0]
    result.n_params = first.get("n_params", 0)
    result.losses = first.get("losses", [])
    result.step_times_s = first.get("step_times_s", [])
    result.steps_done = first.get("steps_done", 0)
    timed = sorted(result.step_times_s[1:] or result.step_times_s)
    if timed:
        result.median_step_s = timed[len(timed) // 2]
        result.tokens_per_s = global_tokens(spec) / result.median_step_s
    peaks = [r["peak_gpu_allocated_bytes"] for r in ranks if r.get("peak_gpu_allocated_bytes")]
    result.peak_gpu_allocated_bytes = max(peaks) if peaks else None
    result.ranks = ranks
    return result


# ---- the plan: which runs, where -----------------------------------------------------------------


def two_rank_note(environment: kit_env.Environment) -> tuple[bool, str]:
    """(can 2-rank runs go here, why): 2 GPUs, or 2 CPU ranks without a GPU; not on 1 GPU."""
    where, why = stages_and_offload.two_rank_plan(environment)
    return where is not None, why


def _run_all(specs: list[tuple[ParallelSpec, bool]], why: str, progress: bool) -> dict:
    from tqdm.auto import tqdm

    out = {}
    for spec, runnable in tqdm(specs, desc="runs", disable=not progress):
        out[spec.label] = measure(spec) if runnable else not_here(spec, why)
    return out


def pipeline_runs(base: ParallelSpec, environment: kit_env.Environment,
                  progress: bool = True) -> dict[str, runner.RunResult]:
    """The same GPT, data and seed: on 1 rank, data parallel on 2 (ZeRO-1), a 2-stage pipeline
    (ZeRO-1), and the pipeline again with 1 micro-batch per step (the bubble at its largest)."""
    two, why = two_rank_note(environment)
    dense = replace(base, kind="dense", stage=1)
    specs = [(replace(dense, label=BASE), True),
             (replace(dense, label=DP, world_size=2), two),
             (replace(dense, kind="pipeline", label=PIPE, world_size=2, stages=2), two),
             (replace(dense, kind="pipeline", label=PIPE_1, world_size=2, stages=2,
                      micro_batches=1), two)]
    return _run_all(specs, why, progress)


def moe_runs(base: ParallelSpec, environment: kit_env.Environment,
             progress: bool = True) -> dict[str, runner.RunResult]:
    """The MoE GPT (ZeRO-2) with all experts on 1 rank, then spread over 2 (ep_size=2)."""
    two, why = two_rank_note(environment)
    moe = replace(base, kind="moe", stage=2)
    specs = [(replace(moe, label=MOE_1, ep_size=1), True),
             (replace(moe, label=MOE_2, ep_size=2, world_size=2), two)]
    return _run_all(specs, why, progress)


def tp_runs(base: ParallelSpec, environment: kit_env.Environment,
            progress: bool = True) -> dict[str, runner.RunResult]:
    """A Hugging Face Llama-shaped model (ZeRO-2) on 1 rank, then split by AutoTP over 2."""
    two, why = two_rank_note(environment)
    tp = replace(base, kind="autotp", stage=2)
    specs = [(replace(tp, label=TP_1), True),
             (replace(tp, label=TP_2, world_size=2, tensor_parallel=2), two)]
    return _run_all(specs, why, progress)


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
    return ("every run ran, or says why it did not (no errors)",
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
                         f"{base.tokens_per_s:,.0f}.")
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


# ---- the models and training steps the runs execute (only torch and DeepSpeed) -------------------
#: The code a learner writes for notebook 08, in one place: a small GPT as a list of layers, the
#: same layers as a ``deepspeed.pipe.PipelineModule`` and as a plain model, a GPT whose MLPs are
#: ``deepspeed.moe.layer.MoE`` layers, and the three training steps (``engine.train_batch`` for the
#: pipeline, the engine loop with gradient accumulation for the others). Notebook 08 prints each
#: piece beside the call that runs it (``helpers.show.Source``); the runs above execute them in
#: subprocesses, one per rank. Only torch and DeepSpeed, no kit imports: it reads as a user's script.


@dataclass(frozen=True)
class GPTShape:
    """Sizes of the small GPT: layers, width, heads, vocabulary, context."""

    layers: int = 4
    width: int = 64
    heads: int = 2
    vocab: int = 257
    seq_len: int = 64


class Embed(nn.Module):
    """Token plus learned position embeddings: the first pipeline stage starts here."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.tokens = nn.Embedding(shape.vocab, shape.width)
        self.positions = nn.Embedding(shape.seq_len, shape.width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


def mlp(width: int) -> nn.Module:
    """GPT's MLP (4x wider, GELU): a block's feed-forward, and one expert of an MoE layer."""
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then the MLP (or an MoE layer)."""

    def __init__(self, shape: GPTShape, feed_forward: nn.Module | None = None) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(shape.width), nn.LayerNorm(shape.width)
        self.attn = nn.MultiheadAttention(shape.width, shape.heads, batch_first=True)
        self.ff = feed_forward if feed_forward is not None else mlp(shape.width)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        return x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attend(x)
        return x + self.ff(self.ln2(x))


class Head(nn.Module):
    """Final norm and the output projection to the vocabulary: the last stage ends here."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(shape.width)
        self.out = nn.Linear(shape.width, shape.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy: position i predicts token i + 1."""
    vocab = logits.shape[-1]
    return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(),
                                       labels[:, 1:].reshape(-1))


def layer_specs(shape: GPTShape) -> list:
    """The GPT as a flat list of ``LayerSpec``: a pipeline cuts it between two layers. A spec is
    built only on the stage that owns it, so no rank ever holds the whole model."""
    from deepspeed.pipe import LayerSpec

    return [LayerSpec(Embed, shape), *[LayerSpec(Block, shape) for _ in range(shape.layers)],
            LayerSpec(Head, shape)]


def pipeline_model(shape: GPTShape, stages: int, seed: int = 0):
    """The GPT as a ``PipelineModule`` of ``stages`` stages, cut so that each stage holds about
    the same number of parameters. Layer i is initialised from seed ``seed + i`` wherever it is
    built, so the plain model of :func:`dense_model` starts from the same weights."""
    from deepspeed.pipe import PipelineModule

    return PipelineModule(layers=layer_specs(shape), num_stages=stages, loss_fn=lm_loss,
                          partition_method="parameters", seed_layers=True, base_seed=seed,
                          # DeepSpeed 0.19.8 seeds Python's `random` with a numpy integer, which
                          # Python 3.11+ refuses (TypeError): seed torch ourselves.
                          seed_fn=lambda s: torch.manual_seed(int(s)))


class DenseGPT(nn.Sequential):
    """The same layers as one ordinary model (data parallel, one GPU): returns the loss."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return lm_loss(super().forward(ids), ids)


def dense_model(shape: GPTShape, seed: int = 0) -> DenseGPT:
    """The pipeline's layers built in one process, each from the seed the pipeline gives it."""
    layers = []
    for i, spec in enumerate(layer_specs(shape)):
        torch.manual_seed(seed + i)
        layers.append(spec.build())
    return DenseGPT(*layers)


def train_pipeline_step(engine, micro_batches: list[torch.Tensor]) -> float:
    """One optimizer step of the pipeline: ``train_batch`` pulls gradient_accumulation_steps
    micro-batches from the iterator (inputs on the first stage, labels on the last), runs the
    1F1B schedule and the optimizer, and returns the mean loss on every stage."""
    loss = engine.train_batch(data_iter=iter([(ids, ids) for ids in micro_batches]))
    return float(loss)


def train_step(engine, micro_batches: list[torch.Tensor], aux_coef: float = 0.0,
               hugging_face: bool = False) -> dict:
    """One optimizer step of an ordinary engine over this rank's micro-batches (gradient
    accumulation: DeepSpeed scales each loss and steps at the boundary). A model that returns
    (loss, aux_loss, expert_counts), as :class:`MoEGPT` does, has its load-balancing loss added
    with weight ``aux_coef``; a Hugging Face model gets ``labels`` and returns its own loss.
    Returns this rank's mean loss, mean aux loss and expert counts."""
    losses, aux_losses, counts = [], [], None
    for ids in micro_batches:
        ids = ids.to(engine.device)
        out = engine(input_ids=ids, labels=ids).loss if hugging_face else engine(ids)
        loss, aux, used = out if isinstance(out, tuple) else (out, None, None)
        engine.backward(loss + aux_coef * aux if aux is not None else loss)
        engine.step()  # an optimizer step only at the accumulation boundary
        losses.append(float(loss))
        if aux is not None:
            aux_losses.append(float(aux))
            counts = used if counts is None else [  # per layer, per expert
                [x + y for x, y in zip(a, b)] for a, b in zip(counts, used)]
    return {"loss": sum(losses) / len(losses),
            "aux": sum(aux_losses) / len(aux_losses) if aux_losses else None, "counts": counts}


class MoEGPT(nn.Module):
    """The GPT with every MLP replaced by a ``deepspeed.moe.layer.MoE`` layer of ``experts``
    copies of that MLP and a top-1 gate. ``ep_size`` GPUs share the experts (each holds
    experts / ep_size); tokens travel to their expert's GPU and back by all-to-all."""

    def __init__(self, shape: GPTShape, experts: int, ep_size: int, capacity_factor: float = 1.25):
        from deepspeed.moe.layer import MoE

        super().__init__()
        self.embed, self.head = Embed(shape), Head(shape)
        self.blocks = nn.ModuleList(
            Block(shape, MoE(hidden_size=shape.width, expert=mlp(shape.width), num_experts=experts,
                             ep_size=ep_size, k=1, capacity_factor=capacity_factor, min_capacity=4,
                             # tokens past an expert's capacity are dropped by position, not at
                             # random: every layout drops the same ones
                             use_rts=False))
            for _ in range(shape.layers))

    def forward(self, ids: torch.Tensor):
        x, aux, counts = self.embed(ids), 0.0, []
        for block in self.blocks:
            x = block.attend(x)
            y, layer_aux, layer_counts = block.ff(block.ln2(x))  # MoE returns three things
            x, aux = x + y, aux + layer_aux
            counts.append(layer_counts.tolist())  # tokens the gate sent to each expert
        return lm_loss(self.head(x), ids), aux / len(self.blocks), counts


def moe_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """AdamW with expert parameters in their own groups: ZeRO reduces expert gradients only
    among the ranks that hold the same experts, and it finds them by these groups."""
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "parameters"})
    return torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)


def engine_config(micro_batch: int, accumulation: int, stage: int, precision: str, lr: float,
                  warmup: int, tensor_parallel: int = 1, optimizer: bool = True) -> dict:
    """The DeepSpeed config of every run of notebook 08. ``tensor_parallel`` > 1 adds AutoTP:
    DeepSpeed shards the Hugging Face model's linear layers over that many GPUs at initialize."""
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        # from lr / 10: WarmupLR's first two steps run at warmup_min_lr (0 would waste them)
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": lr / 10, "warmup_max_lr": lr,
                                                     "warmup_num_steps": warmup}},
        "fp16": {"enabled": precision == "fp16", "initial_scale_power": 12},
        "bf16": {"enabled": precision == "bf16"},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1_000_000,
    }
    if optimizer:  # else the client passes one (MoE: expert parameter groups)
        config["optimizer"] = {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}}
    if tensor_parallel > 1:
        config["tensor_parallel"] = {"autotp_size": tensor_parallel}
    return config
