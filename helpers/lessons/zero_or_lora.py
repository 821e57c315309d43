"""Notebook 09, ZeRO or LoRA: one pretrained model, one text, one seed and one token budget
fine-tuned every way a T4 allows, each run in a fresh process (helpers.runner) from the same
weights, side by side: LoRA with PEFT (the model frozen, small adapters trained), QLoRA (the same
adapters on the base loaded in 4 bits by bitsandbytes), full fine-tuning at stage 0 (also with
bitsandbytes' 8-bit Adam), ZeRO-2 with CPU offload (pinned and unpinned buffers), ZeRO-3 with
partial offload
(notebook 05's variant), ZenFlow (with helpers.deepspeed_fixes' weight fix) and fp16 master
weights; each scored on the same held-out blocks as the pretrained model before training
(:func:`held_out_before`). Then how large a model each trains inside a T4's envelope
(helpers.memory's estimator), and a decision table. Also here: the LoRA adapter a ZeRO-3 Trainer
saved, checked (its tensors must not be empty) and reloaded.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path

from helpers import claims, colab, config, memory, runner, show
from helpers import env as kit_env
from helpers.lessons import stages_and_offload as offload
from helpers.show import GiB, Table

#: ZenFlow's settings (DeepSpeed's docs, synchronous: no overlap process): 5% of each matrix's
#: gradient columns (the largest) updated on the GPU every step, the rest by CPU Adam every 4th
#: (the columns chosen again every 4th step: DeepSpeed wants select_interval >= update_interval).
ZENFLOW = {"topk_ratio": 0.05, "select_strategy": "step", "select_interval": 4,
           "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": False}
#: How far fp16 master weights' losses may be from full precision's (relative): each step of the
#: run's first third, and the held-out loss after it.
FP16_MASTER_RTOL = 0.10
#: The status of a run whose loss went inf or NaN in fp16 (a method DeepSpeed may refuse there).
DIVERGED_FP16 = "loss not finite in fp16"


@dataclass(frozen=True)
class Method:
    """One way to train: what it trains, its config (``config.build``'s choices, keys merged
    under ``zero_optimization`` and ``fp16``), and when a learner should pick it."""

    name: str
    trains: str
    choice: dict
    pick_when: str
    zero_extra: dict = field(default_factory=dict)
    fp16_extra: dict = field(default_factory=dict)
    lora: bool = False
    quantized: bool = False  # the frozen base in 4 bits (QLoRA: the lesson's BitsAndBytesConfig)
    optimizer: str = ""  # TrainingArguments' optim: its optimizer in place of the config's
    pinned: bool = False
    variant: str = ""  # the name of notebook 05's offload variant it is (its config, reused)


LORA_NAME = "LoRA (PEFT)"
QLORA_NAME = "QLoRA (4-bit base)"
FULL = "full, stage 0"
ADAM_8BIT = "full, stage 0, 8-bit Adam"
UNPINNED = "ZeRO-2 + CPU offload"
PINNED = "ZeRO-2 + CPU offload, pinned"
PARTIAL = offload.VARIANTS[2][0]
ZENFLOW_NAME = "ZeRO-2 + ZenFlow"
FP16_MASTER = "ZeRO-2 + CPU offload, fp16 master weights"

#: Every method, in the order the tables show them.
METHODS: list[Method] = [
    Method(LORA_NAME, "adapters", {"stage": 0},
           "you adapt a pretrained model and its fp16 weights fit on the GPU: least memory, "
           "a checkpoint of megabytes", lora=True),
    Method(QLORA_NAME, "adapters", {"stage": 0},
           "you adapt a pretrained model whose 16-bit weights do not fit on the GPU: its frozen "
           "weights in 4 bits, the same adapters", lora=True, quantized=True),
    Method(FULL, "every weight", {"stage": 0},
           "every weight must train and 16 bytes per parameter fit on the GPU: fastest"),
    Method(ADAM_8BIT, "every weight", {"stage": 0},
           "every weight must train and Adam's fp32 moments are what does not fit: 8 bits each "
           "(bitsandbytes), no offload", optimizer="adamw_bnb_8bit"),
    Method(UNPINNED, "every weight", {"stage": 2, "offload_optimizer": "cpu"},
           "every weight must train, the model is too big for stage 0's GPU memory, and host "
           "RAM holds the optimizer (the line below the table says how much)",
           variant=offload.PLAIN),
    Method(PINNED, "every weight", {"stage": 2, "offload_optimizer": "cpu"},
           "as above with RAM to spare: page-locked buffers copy faster (6 bytes per parameter "
           "more)", pinned=True, variant=offload.PLAIN),
    Method(PARTIAL, "every weight", {"stage": 3, "offload_optimizer": "cpu"},
           "some GPU memory is left over: part of the optimizer stays on the GPU",
           variant=PARTIAL),
    Method(ZENFLOW_NAME, "every weight", {"stage": 2, "offload_optimizer": "cpu"},
           "CPU offload's step is the bottleneck: the largest gradients update on the GPU",
           zero_extra={"zenflow": ZENFLOW}, variant=offload.PLAIN),
    Method(FP16_MASTER, "every weight", {"stage": 2, "offload_optimizer": "cpu"},
           "host RAM binds: fp16 master weights and gradients (DeepSpeed's CPU Adam only)",
           fp16_extra={"fp16_master_weights_and_grads": True}, variant=offload.PLAIN),
]
METHOD_NAMES = [m.name for m in METHODS]


def method(name: str) -> Method:
    """The method called ``name`` (ValueError naming the known ones otherwise)."""
    for m in METHODS:
        if m.name == name:
            return m
    raise ValueError(f"no method {name!r}: choose from {', '.join(METHOD_NAMES)}")


def method_config(m: Method, model: memory.ModelInfo, environment: kit_env.Environment,
                  micro_batch: int, steps: int, lr: float, trainer: dict | None = None) -> dict:
    """The engine config ``m`` runs with: notebook 05's variant config where ``m`` is one of its
    variants (the same learning-rate warmup, buckets and sub-groups), else the stage row's
    (``config.for_row``); then the learning rate, the pinning and ``m``'s own keys. With
    ``trainer`` (:func:`trainer_settings`) its precision and clipping; its schedule replaces the
    config's "scheduler" when the run starts (``RunSpec.lr_schedule``)."""
    if m.variant:
        ds = offload.variant_config(m.variant, model, environment, micro_batch, steps)
    else:
        ds = config.for_row(m.choice, model, environment, micro_batch)
    ds["optimizer"]["params"]["lr"] = lr
    if "scheduler" in ds:
        ds["scheduler"]["params"].update(warmup_min_lr=lr / 10, warmup_max_lr=lr)
    zero = ds["zero_optimization"]
    if "offload_optimizer" in zero:
        zero["offload_optimizer"]["pin_memory"] = m.pinned
    zero.update(copy.deepcopy(m.zero_extra))
    if trainer:
        ds.pop("scheduler", None)  # the Trainer's schedule runs instead (RunSpec.lr_schedule)
        ds["gradient_clipping"] = trainer["gradient_clipping"]
        for section in ("fp16", "bf16"):
            ds[section] = {**ds.get(section, {}), "enabled": trainer["precision"] == section}
    if m.fp16_extra:
        ds["fp16"] = {**ds.get("fp16", {"enabled": False}), **m.fp16_extra}
    return ds


@dataclass
class MethodRun:
    """One method's run: what ran (its config, and for LoRA the lesson's settings: PEFT's
    LoraConfig arguments), what came back, what was predicted."""

    method: Method
    result: runner.RunResult
    ds_config: dict | None = None
    estimate: memory.Estimate | None = None
    lora: dict | None = None

    @property
    def lora_rank(self) -> int | None:
        """The adapters' rank this run trained (None: not a LoRA run)."""
        return int(self.lora["r"]) if self.lora else None


@dataclass(frozen=True)
class Start:
    """The model before any training: its loss on the held-out blocks every run scores after
    training, and its vocabulary (a freshly initialised model reads about ln(vocab))."""

    eval_loss: float
    vocab: int

    @property
    def pretrained(self) -> bool:
        """Whether the weights were trained already (:func:`helpers.claims.pretrained_start`)."""
        return claims.pretrained_start(self.eval_loss, self.vocab)

    def line(self) -> str:
        return (f"held-out loss before training (the model as loaded, the blocks every run scores "
                f"after training): {self.eval_loss:.3f}; ln(vocabulary {self.vocab:,}) = "
                f"{math.log(self.vocab):.2f}")


def held_out_before(model_path: str, text_path: str, seq_len: int, micro_batch: int,
                    eval_batches: int, seed: int = 0) -> Start:
    """The loss of ``model_path``'s weights as loaded on the held-out blocks every measured run
    scores after training (helpers.runner: the text's last tenth, ``data.batches`` with the runs'
    seed), in fp32, once, in this process (on the GPU where there is one; freed afterwards)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers import data

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # fp32 weights whatever the checkpoint stores; PyTorch's own layers, no Hub kernels
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32,
                                                 use_kernels=False)
    if torch.cuda.is_available():
        model.to("cuda")
    _, held_out = data.split_held_out(Path(text_path).read_text())
    blocks = data.batches(held_out, tokenizer, seq_len, micro_batch, eval_batches, seed=seed)
    loss = runner.held_out_loss(model, blocks)
    vocab = int(model.config.vocab_size)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return Start(loss, vocab)


def lora_trainable(model: memory.ModelInfo, rank: int) -> int:
    """The parameters LoRA's adapters of ``rank`` add to ``model`` (helpers.memory.lora_params)."""
    return memory.lora_params(model, rank)


def _not_run(m: Method, environment: kit_env.Environment, ds: dict, info: memory.ModelInfo,
             micro_batch: int, seq_len: int) -> str:
    """Why ``m`` is not run here, or "": pinned buffers where the estimator says host RAM would not
    hold them (free Colab's budget under T4 emulation), bitsandbytes missing for the methods that
    use it."""
    if (m.quantized or m.optimizer) and importlib.util.find_spec("bitsandbytes") is None:
        return "needs bitsandbytes: pip install bitsandbytes (make setup installs it)"
    if m.pinned:
        need = memory.estimate(info, ds, micro_batch=micro_batch, seq_len=seq_len,
                               on_gpu=environment.has_gpu).total("cpu")
        budget = kit_env.ram_left_for_runs(environment)
        if memory.verdict(need, budget) != memory.FITS:
            return (f"pinned buffers need {need / GiB:.1f} GiB of host RAM, predicted; a run has "
                    f"{budget / GiB:.1f} GiB here: unpinned is the choice")
    return ""


def trainer_settings(args, steps: int) -> dict:
    """What a Trainer given TrainingArguments ``args`` runs ``steps`` optimizer steps with, that an
    engine config does not say by itself: its learning-rate schedule (transformers.get_scheduler's
    arguments, as the Trainer builds it), its precision and its gradient clipping."""
    name = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    return {"lr_schedule": {"name": str(name), "num_warmup_steps": args.get_warmup_steps(steps),
                            "num_training_steps": steps},
            "precision": "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32",
            "gradient_clipping": args.max_grad_norm}


def run_methods(model_path: str, text_path: str, environment: kit_env.Environment,
                micro_batch: int, seq_len: int, steps: int, eval_batches: int, lr: float,
                lora_lr: float, lora: dict, grad_ckpt: bool = True, names: list[str] | None = None,
                progress: bool = True, trainer_args=None,
                quantize: dict | None = None) -> list[MethodRun]:
    """Every method (or those ``names``) on the same model folder, text, seed and tokens, each in
    a fresh subprocess (helpers.runner), scored on the text's held-out tenth afterwards; each
    predicted by the estimator too (``grad_ckpt``: activation checkpointing, as the lesson's
    GRAD_CKPT). The LoRA row trains adapters with ``lora``, the lesson's own settings (PEFT's
    LoraConfig arguments, ``r`` among them). With ``trainer_args`` (the lesson's TrainingArguments)
    every row runs the Trainer's schedule, precision and clipping (:func:`trainer_settings`); the
    learning rates stay ``lr`` and ``lora_lr``. The QLoRA row loads the base quantized with
    ``quantize``, the lesson's BitsAndBytesConfig arguments (needed when that row runs). A method
    that cannot run here is a row saying why."""
    if "r" not in lora:
        raise ValueError(f"lora holds PEFT's LoraConfig arguments, the rank 'r' among them: {lora!r}")
    chosen = [method(n) for n in names] if names else METHODS
    if quantize is None and any(m.quantized for m in chosen):
        raise ValueError(f"{QLORA_NAME} loads its base quantized: pass quantize=, the lesson's "
                         "BitsAndBytesConfig arguments (or leave the row out with names=)")
    trainer = trainer_settings(trainer_args, steps) if trainer_args is not None else None
    from tqdm.auto import tqdm

    info = memory.ModelInfo.from_pretrained(model_path)
    out = []
    for m in tqdm(chosen, desc="methods", disable=not progress):
        ds = method_config(m, info, environment, micro_batch, steps, lora_lr if m.lora else lr,
                           trainer)
        est = memory.estimate(info, ds, micro_batch=micro_batch, seq_len=seq_len,
                              grad_ckpt=grad_ckpt, on_gpu=environment.has_gpu,
                              trainable=lora_trainable(info, lora["r"]) if m.lora else None,
                              quantized=m.quantized, adam_8bit=m.optimizer == "adamw_bnb_8bit")
        settings = dict(lora) if m.lora else None
        why = _not_run(m, environment, ds, info, micro_batch, seq_len)
        if why:
            out.append(MethodRun(m, runner.RunResult(m.name, runner.NOT_TRIED, why), ds, est,
                                 settings))
            continue
        spec = runner.RunSpec(ds_config=ds, model_path=model_path, text_path=text_path,
                              seq_len=seq_len, steps=steps,
                              grad_ckpt=grad_ckpt, label=m.name, eval_batches=eval_batches,
                              lora=settings,
                              lr_schedule=trainer["lr_schedule"] if trainer else None,
                              quantize=dict(quantize) if m.quantized else None,
                              optimizer=m.optimizer or None)
        out.append(MethodRun(m, diverged_in_fp16(m, runner.measure(spec), ds), ds, est, settings))
    return out


def diverged_in_fp16(m: Method, result: runner.RunResult, ds: dict) -> runner.RunResult:
    """ZenFlow run in fp16 with a loss gone inf or NaN, as a row saying so (status
    :data:`DIVERGED_FP16`, the step and the skipped steps in its message): in T4 emulation
    ZenFlow's went NaN from step 2 (T4 emulation, 2026-12-03; docs/gpu_runs.md). Anything else as it came:
    in fp32, or for any other method (fp16 master weights run only in fp16, and going NaN is what
    their check is for), such a loss stays a failed run."""
    fp16 = bool(ds.get("fp16", {}).get("enabled"))
    bad = [i for i, x in enumerate(result.losses or []) if not math.isfinite(x)]
    if m.name != ZENFLOW_NAME or not fp16 or result.status != runner.OK or not bad:
        return result
    why = (f"its loss went {result.losses[bad[0]]} at step {bad[0] + 1} in fp16 "
           f"({result.skipped_steps or 0} steps skipped for overflow): DeepSpeed "
           f"{colab.version_of('deepspeed')}'s {m.name} does not train in fp16 here")
    return dataclasses.replace(result, status=DIVERGED_FP16, message=why)


#: Methods DeepSpeed may refuse on some hardware (ZenFlow, fp16 master weights, in fp16): their row
#: shows DeepSpeed's error instead of failing the notebook. Every other method must run, or hit a
#: limit the runner names (GPU memory, host RAM): a crash is not an explanation.
MAY_REFUSE = (ZENFLOW_NAME, FP16_MASTER)


def row_explained(run: MethodRun) -> bool:
    """The run went or hit a named limit, or it is a :data:`MAY_REFUSE` method with DeepSpeed's
    error."""
    return runner.explained(run.result) or (run.method.name in MAY_REFUSE
                                            and bool(run.result.message))


def _ok(runs: list[MethodRun]) -> dict[str, runner.RunResult]:
    return {r.method.name: r.result for r in runs if r.result.status == runner.OK}


def runs_table(runs: list[MethodRun], environment: kit_env.Environment,
               start: Start | None = None) -> Table:
    """Every method's run: status (DeepSpeed's error where it failed), trained parameters, peak
    GPU (measured and predicted), peak host RSS, s/step, tokens/s, training loss, and held-out
    loss after training (with its change from ``start``'s, the model before training)."""
    rows = []
    for r in runs:
        res = r.result
        trained = (f"{res.n_trainable / 1e6:.2f}M of {res.n_params / 1e6:.1f}M"
                   if res.n_params else "-")
        predicted = show.gib(r.estimate.total("gpu")) if r.estimate and environment.has_gpu else "-"
        rows.append((r.method.name, show.status_cell(res.status, res.message, runner.OK, 70), trained,
                     show.gib(res.peak_gpu_allocated_bytes), predicted,
                     show.gib(res.peak_host_rss_bytes or None), show.seconds(res.median_step_s),
                     "-" if res.tokens_per_s is None else f"{res.tokens_per_s:,.0f}",
                     show.loss_cell(res.losses), _eval_cell(res, start)))
    return Table(["method", "status", "trained", "GPU GiB", "GPU predicted", "host RSS GiB",
                  "s/step", "tokens/s", "loss", _eval_header(start)], rows,
                 title=f"Same pretrained model, text, seed and tokens, {environment.measured_on()}",
                 note=runner.fixes_note([r.result for r in runs], [r.method.name for r in runs]))


def loss_before(result: runner.RunResult, start: Start) -> float:
    """The held-out loss ``result``'s run started from: its own where it measured one (a
    quantized base is not the model as loaded), else the model's as loaded (``start``)."""
    return start.eval_loss if result.eval_loss_before is None else result.eval_loss_before


def _eval_cell(result: runner.RunResult, start: Start | None = None) -> str:
    """The held-out loss after training, and its change from the model's before (``start``)."""
    if result.eval_loss is None:
        return "-"
    if result.eval_loss_before is not None:  # a quantized base: its own loss before training
        return (f"{result.eval_loss:.3f} ({result.eval_loss - result.eval_loss_before:+.3f} "
                f"from its 4-bit base's {result.eval_loss_before:.3f})")
    if start is None or not math.isfinite(result.eval_loss):
        return f"{result.eval_loss:.3f}"
    return f"{result.eval_loss:.3f} ({result.eval_loss - start.eval_loss:+.3f})"


def _eval_header(start: Start | None) -> str:
    return "held-out loss" if start is None else f"held-out loss (before: {start.eval_loss:.3f})"


def plot(runs: list[MethodRun], environment: kit_env.Environment):
    """Peak GPU memory (on a GPU) and host RAM against a T4's limits, seconds per step, and every
    method's loss per step."""
    t4 = kit_env.EMULATIONS["t4"]
    ran = [r for r in runs if r.result.status == runner.OK]
    labels = [r.method.name for r in ran]
    figures = []
    if environment.has_gpu:
        figures.append(show.memory_bars(
            labels, [(r.result.peak_gpu_allocated_bytes or 0) / GiB or None for r in ran],
            [r.estimate.total("gpu") / GiB if r.estimate else None for r in ran],
            t4.gpu_cap_bytes / GiB, "Peak GPU memory", f"{t4.gpu_cap_bytes / GiB:.2f} GiB PyTorch has on a T4"))
    figures.append(show.memory_bars(
        labels, [(r.result.peak_host_rss_bytes or 0) / GiB or None for r in ran],
        [r.estimate.total("cpu") / GiB if r.estimate else None for r in ran],
        t4.ram_budget_bytes / GiB, "Peak host RAM (RSS of the run's processes)",
        f"a run's share of free Colab: {t4.ram_budget_bytes / GiB:.1f} GiB"))
    figures.append(show.step_times(labels, [r.result.median_step_s for r in ran],
                                    "Seconds per step (median, first step left out)"))
    figures.append(show.loss_curves({r.method.name: r.result.losses for r in ran},
                                     "Same model, text, seed and tokens: the loss per step"))
    return figures


#: How far LoRA under ZeRO-3's logged losses may be from LoRA on one GPU's in fp32 (relative):
#: DeepSpeed's Adam and clipping against torch's; measured on the CPU (smoke): equal to 4 decimals
#: for 8 steps, 0.3% apart by step 12.
ZERO3_LORA_RTOL = 0.01


def same_training_claim(plain: list[float], zero3: list[float],
                        environment: kit_env.Environment) -> claims.Claim:
    """LoRA under ZeRO-3 trained as LoRA on one GPU did: the same number of logged losses, the
    first within 1e-3 (the Trainer logs 4 decimals), every one within :data:`ZERO3_LORA_RTOL`
    (fp16: notebook 05's 10%)."""
    first_tol, all_tol = offload.loss_tolerance(environment)
    first_tol, all_tol = max(first_tol, 1e-3), max(all_tol, ZERO3_LORA_RTOL)
    return (f"LoRA under ZeRO-3 trained as LoRA on one GPU did (first loss within {first_tol:g}, "
            f"all within {all_tol:.0%}: {show.loss_cell(plain)} vs {show.loss_cell(zero3)})",
            offload.losses_match(plain, zero3, first_tol, all_tol))


# ---- the largest model each method trains on a T4 -----------------------------------------------


def _t4_estimate(m: Method, ds: dict, n: int, micro_batch: int, seq_len: int,
                 lora_rank: int | None = None) -> memory.Estimate:
    info = memory.ModelInfo.from_count(n)
    if m.lora and not lora_rank:
        raise ValueError(f"{m.name}: the adapters' rank is needed to size it")
    return memory.estimate(info, ds, micro_batch=micro_batch, seq_len=seq_len, grad_ckpt=True,
                           trainable=lora_trainable(info, lora_rank) if m.lora else None,
                           quantized=m.quantized, adam_8bit=m.optimizer == "adamw_bnb_8bit")


#: The most parameters :func:`largest_on_t4` tries (QLoRA's 4-bit base goes far past the rest).
LARGEST_SEARCHED = 100_000_000_000


def largest_on_t4(m: Method, ds: dict, micro_batch: int, seq_len: int,
                  ram_budget_bytes: int | None = None, lora_rank: int | None = None) -> int:
    """The most parameters (a GPT-2-like shape of that count, helpers.memory.ModelInfo.from_count)
    for which the estimator says ``m``'s config "fits" a free Colab T4: the GPU under the T4's cap
    and host RAM under what a run started from a typical kernel has (12.7 GB less the VM's and the
    kernel's share), or under ``ram_budget_bytes`` where given. 0: not even 100M parameters."""
    t4 = kit_env.EMULATIONS["t4"]
    ram = t4.ram_budget_bytes if ram_budget_bytes is None else ram_budget_bytes

    def fits(n: int) -> bool:
        est = _t4_estimate(m, ds, n, micro_batch, seq_len, lora_rank)
        return (memory.verdict(est.total("gpu"), t4.gpu_cap_bytes) == memory.FITS
                and memory.verdict(est.total("cpu"), ram) == memory.FITS)

    low, high = 100_000_000, LARGEST_SEARCHED
    if not fits(low):
        return 0
    while high - low > low // 100:  # to 1%
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _as_on_t4(ds: dict) -> dict:
    """A run's config in fp16, as a T4 trains."""
    ds = copy.deepcopy(ds)
    ds["fp16"] = {**ds.get("fp16", {}), "enabled": True}
    ds.pop("bf16", None)
    return ds


def largest_models(runs: list[MethodRun], micro_batch: int, seq_len: int) -> dict[str, int]:
    """{method: the largest parameter count it trains on a T4} (:func:`largest_on_t4`), with the
    config each method ran with here, in fp16 as on a T4."""
    return {r.method.name: largest_on_t4(r.method, _as_on_t4(r.ds_config), micro_batch, seq_len,
                                         lora_rank=r.lora_rank)
            for r in runs if r.ds_config is not None}


#: More RAM than free Colab's, to show what offload trains where RAM does not bind (a desktop's).
MORE_RAM_BYTES = 32 * 10**9


def offload_limit_line(runs: list[MethodRun], largest: dict[str, int], micro_batch: int,
                       seq_len: int) -> str:
    """Why plain CPU offload trains a smaller model than stage 0 on free Colab (or not): at its
    largest size, the estimator's host RAM against what a run has, and its GPU against the T4's
    cap, which of the two binds, its bytes of optimizer states and gradients per parameter in
    host RAM (the rest of the RAM: the process and the model's build), and the largest it trains
    with :data:`MORE_RAM_BYTES` of RAM budget instead."""
    run = next((r for r in runs if r.method.name == UNPINNED and r.ds_config is not None), None)
    most, stage0 = largest.get(UNPINNED, 0), largest.get(FULL, 0)
    if run is None or not most:
        return f"{UNPINNED}: no configuration ran here, so no limit to explain."
    t4 = kit_env.EMULATIONS["t4"]
    ds = _as_on_t4(run.ds_config)
    est = _t4_estimate(run.method, ds, most, micro_batch, seq_len)
    ram, gpu = est.total("cpu"), est.total("gpu")
    cpu = est.parts.get("cpu", {})
    states = cpu.get("optimizer", 0) + cpu.get("grads", 0)  # the rest: the process, the build
    ram_binds = ram / t4.ram_budget_bytes >= gpu / t4.gpu_cap_bytes
    more = largest_on_t4(run.method, ds, micro_batch, seq_len, MORE_RAM_BYTES)
    than = (f"less than stage 0's {stage0 / 1e9:.2f}B" if most < stage0
            else f"against stage 0's {stage0 / 1e9:.2f}B")
    binds = ("free Colab's RAM binds, not the T4" if ram_binds
             else "the T4's memory binds, not the RAM")
    return (f"{UNPINNED} trains up to {most / 1e9:.2f}B on a T4, {than}: at that size the "
            f"estimator puts {ram / 1e9:.1f} GB in host RAM (of the {t4.ram_budget_bytes / 1e9:.1f}"
            f" GB a run has: {states / most:.0f} bytes a parameter for fp32 master weights, "
            f"Adam's moments and the gradients, {(ram - states) / 1e9:.1f} GB for the process "
            f"and the model's build) and {show.gib(gpu)} GiB on the GPU (of "
            f"{show.gib(t4.gpu_cap_bytes)}): {binds}. With {MORE_RAM_BYTES / 1e9:.0f} GB of RAM "
            f"for the run it would train up to {more / 1e9:.2f}B.")


# ---- checks -----------------------------------------------------------------------------------


def precision_of(ds: dict | None) -> str:
    """"fp16", "bf16" or "fp32": the precision a run's config trains in."""
    ds = ds or {}
    return next((p for p in ("fp16", "bf16") if ds.get(p, {}).get("enabled")), "fp32")


#: The rows whose GPU peak the estimator must predict within ``gpu_rtol`` (on a GPU).
PREDICTED = (LORA_NAME, QLORA_NAME, FULL, ADAM_8BIT)
#: How far QLoRA's 4-bit base may score from the model as loaded, before training (relative):
#: NF4 costs a little; a quantization that broke the model would start near ln(vocabulary).
QUANTIZED_START_RTOL = 0.15


def close_to_claim(name: str, run: runner.RunResult, base_name: str,
                   base: runner.RunResult | None, what: str) -> claims.Claim:
    """``run`` trained as ``base`` did within :data:`FP16_MASTER_RTOL`: the same number of
    losses, the first third of them and the held-out loss (a method that stores the same training
    in fewer bits: fp16 master weights, 8-bit Adam)."""
    third = len(run.losses) // 3
    held_out = (f"{run.eval_loss:.3f} vs {base.eval_loss:.3f}"
                if base and base.eval_loss is not None and run.eval_loss is not None else "-")
    return (f"{name}: the first third of its losses and its held-out loss ({held_out}) within "
            f"{FP16_MASTER_RTOL:.0%} of {base_name}'s ({what})",
            bool(base) and third > 0 and len(run.losses) == len(base.losses)
            and offload.losses_match(base.losses[:third], run.losses[:third],
                                     FP16_MASTER_RTOL, FP16_MASTER_RTOL)
            and claims.within(run.eval_loss, base.eval_loss, FP16_MASTER_RTOL))


def checks(runs: list[MethodRun], environment: kit_env.Environment, start: Start,
           gpu_rtol: float = 0.15) -> list[claims.Claim]:
    """Each able to fail on a bad run: the model starts pretrained (``start``, its held-out loss
    before training, well below ln(vocab)); LoRA and full stage 0 ran, every other method ran or
    says why; every run that went has finite training losses (from a random start: a falling loss,
    :func:`helpers.claims.training_loss_claim`) and a held-out loss below ``start``'s, on the same
    blocks (where fp16 skipped steps for overflow, the claim says what to do); LoRA trained under 5%
    of the parameters; plain offload trained as stage 0 did (notebook 05's tolerance), pinned and
    partial offload as plain offload did;
    ZenFlow's first loss equals plain offload's, also where its loss then went non-finite in fp16
    (weights unchanged at initialize: helpers.deepspeed_fixes; later ones part by design: most
    columns move once per ``update_interval`` steps, so the gap shows in held-out loss); fp16
    master weights within :data:`FP16_MASTER_RTOL` of full precision (the first third of the
    losses, the held-out loss); on a GPU, LoRA peaks below full stage 0 and the estimator is within
    ``gpu_rtol`` of LoRA's and stage 0's peaks."""
    ok = _ok(runs)
    first_tol, all_tol = offload.loss_tolerance(environment)
    out = [claims.pretrained_claim(start.eval_loss, start.vocab),
           ("every method ran or hit a named limit (ZenFlow and fp16 master weights: or show "
            "DeepSpeed's refusal)", claims.every(row_explained(r) for r in runs)),
           (f"{LORA_NAME} ran", LORA_NAME in ok), (f"{FULL} ran", FULL in ok)]
    configs = {r.method.name: r.ds_config for r in runs}
    for name, res in ok.items():
        out.append(claims.training_loss_claim(name, res.losses, start.pretrained))
        sentence, held = claims.held_out_claim(
            loss_before(res, start), math.nan if res.eval_loss is None else res.eval_loss)
        own = " (its quantized base's, not the model as loaded)" if res.eval_loss_before else ""
        sentence = sentence.replace("fell", f"fell below its loss before training{own}", 1)
        sentence = f"{name}: {sentence}"
        if not held and res.skipped_steps:
            sentence += "; " + claims.overflow_advice(res.skipped_steps,
                                                      precision_of(configs.get(name)),
                                                      res.steps_done or len(res.losses))
        out.append((sentence, held))
    if LORA_NAME in ok:
        lora = ok[LORA_NAME]
        share = lora.n_trainable / lora.n_params if lora.n_params else 1.0
        out.append((f"LoRA trained {share:.2%} of the parameters (under 5%)", 0 < share < 0.05))
    base, plain = ok.get(FULL), ok.get(UNPINNED)
    if UNPINNED in ok:  # notebook 05's rule; stage 0's fp16 optimizer fixed (deepspeed_fixes)
        out.append((f"{UNPINNED}: losses match {FULL}'s (first within {first_tol:g}, all within "
                    f"{all_tol:g})" + (offload.skipped_note(base, plain) if base else ""),
                    bool(base) and offload.losses_match(base.losses, plain.losses, first_tol,
                                                        all_tol)))
    for name in (PINNED, PARTIAL):  # the same optimizer as plain offload's: every step
        if name in ok:
            out.append((f"{name}: losses match {UNPINNED}'s (first within {first_tol:g}, all "
                        f"within {all_tol:g})" + (offload.skipped_note(plain, ok[name]) if plain
                                                   else ""),
                        bool(plain) and offload.losses_match(plain.losses, ok[name].losses,
                                                             first_tol, all_tol)))
    zenflow = next((r.result for r in runs if r.method.name == ZENFLOW_NAME), None)
    if zenflow is not None and zenflow.losses:  # went, or went non-finite in fp16
        zen = zenflow.losses
        out.append((f"{ZENFLOW_NAME}: first loss equals plain offload's within {first_tol:g} "
                    f"(weights unchanged at initialize)" + (f": {zen[0]:.4f} vs {plain.losses[0]:.4f}"
                                                            if plain else ""),
                    bool(plain) and len(zen) == len(plain.losses)
                    and claims.within(zen[0], plain.losses[0], first_tol)))
    if QLORA_NAME in ok:
        q = ok[QLORA_NAME]
        shown = "-" if q.eval_loss_before is None else f"{q.eval_loss_before:.3f}"
        out.append((f"{QLORA_NAME}: its 4-bit base scored the held-out blocks within "
                     f"{QUANTIZED_START_RTOL:.0%} of the model as loaded before training ({shown} "
                     f"against {start.eval_loss:.3f})",
                     claims.within(q.eval_loss_before, start.eval_loss, QUANTIZED_START_RTOL)))
    if QLORA_NAME in ok and LORA_NAME in ok:  # the same adapters on a base stored otherwise
        q, lora = ok[QLORA_NAME], ok[LORA_NAME]
        out.append((f"{QLORA_NAME} trained the same adapters as {LORA_NAME} "
                    f"({q.n_trainable:,} and {lora.n_trainable:,} parameters)",
                    bool(q.n_trainable) and q.n_trainable == lora.n_trainable))
    if ADAM_8BIT in ok:
        out.append(close_to_claim(ADAM_8BIT, ok[ADAM_8BIT], FULL, base, "fp32 Adam"))
    if FP16_MASTER in ok:
        out.append(close_to_claim(FP16_MASTER, ok[FP16_MASTER], UNPINNED, plain,
                                  "full-precision master weights"))
    if environment.has_gpu:
        for low, high in ((LORA_NAME, FULL), (QLORA_NAME, LORA_NAME), (ADAM_8BIT, FULL)):
            if low in ok and high in ok:
                out.append((f"{low} peaks below {high} on the GPU "
                            f"({show.gib(ok[low].peak_gpu_allocated_bytes)} against "
                            f"{show.gib(ok[high].peak_gpu_allocated_bytes)} GiB)",
                            0 < (ok[low].peak_gpu_allocated_bytes or 0)
                            < (ok[high].peak_gpu_allocated_bytes or 0)))
        for r in runs:
            if r.method.name in PREDICTED and r.estimate and r.method.name in ok:
                out.append(memory.gpu_prediction_claim(
                    r.method.name, r.estimate.total("gpu"),
                    ok[r.method.name].peak_gpu_allocated_bytes, gpu_rtol))
    return out


# ---- the decision table, the benchmark, the summary -----------------------------------------


def decision_table(runs: list[MethodRun], largest: dict[str, int],
                   environment: kit_env.Environment, start: Start | None = None) -> Table:
    """The table to read in ten seconds: method, what it trains, peak GPU, host RAM, s/step,
    held-out loss (and its change from ``start``'s, before training), the largest model it trains
    on a T4, and when to pick it."""
    rows = []
    for r in runs:
        res, ran = r.result, r.result.status == runner.OK
        gpu = show.gib(res.peak_gpu_allocated_bytes) if environment.has_gpu and ran else "-"
        most = largest.get(r.method.name, 0)
        trains = f"{r.method.trains} (rank {r.lora_rank})" if r.lora_rank else r.method.trains
        rows.append((r.method.name if ran else f"{r.method.name} ({res.status})", trains,
                     gpu, show.gib(res.peak_host_rss_bytes or None) if ran else "-",
                     show.seconds(res.median_step_s) if ran else "-", _eval_cell(res, start),
                     f"{most / 1e9:.2f}B" if most else "none", r.method.pick_when))
    return Table(["method", "trains", "GPU GiB", "host RAM GiB", "s/step", _eval_header(start),
                  "largest on a T4", "pick it when"], rows, title="ZeRO or LoRA: which to pick")


#: The offload benchmark as recorded in T4 emulation (an H200 capped as a T4, fp16; DeepSpeed
#: 0.19.8, 2026-12-03): what a CPU run cannot show.
RECORDED_T4_OFFLOAD_RATIO = ("3.41x with fp16 master weights, 3.79x plain ZeRO-2 + CPU offload, "
                             "at GPT-2 355M (0.524 and 0.584 s against 0.154 s): not met")


def offload_benchmark(runs: list[MethodRun],
                      environment: kit_env.Environment | None = None) -> tuple[float | None, str]:
    """(CPU offload's step time over stage 0's, one line saying it): the goal is within 2x
    at GPT-2 355M on a T4 (a benchmark, reported, not asserted). The fastest offload method that
    ran counts; None where stage 0 or every offload method did not run. Where both runs timed
    ``engine.step()`` alone, the line splits the time offload adds between the optimizer step (the
    CPU's Adam and the copies back) and the forward and backward (the gradients' copies out), and
    gives the floor the optimizer step alone sets. Without a GPU the line says the ratio means
    little (there is no bus to cross); under an emulation with fewer cores than this machine's, that
    the CPU was not emulated."""
    ok = _ok(runs)
    base = ok.get(FULL)
    offloaded = [(res.median_step_s, name) for name, res in ok.items()
                 if method(name).choice.get("offload_optimizer") and res.median_step_s]
    if not base or not base.median_step_s or not offloaded:
        return None, "offload benchmark: stage 0 or every offload method did not run here"
    seconds, name = min(offloaded)
    ratio = seconds / base.median_step_s
    judged = environment is None or environment.has_gpu  # a T4's goal, judged on a GPU only
    verdict = ("met" if ratio <= 2 else "not met") if judged else "not judged from CPU runs"
    line = (f"offload benchmark: the fastest CPU offload ({name}, {seconds:.2f} s/step) took "
            f"{ratio:.2f}x stage 0's step ({base.median_step_s:.2f} s); the goal is 2x or "
            f"less at GPT-2 355M on a T4: {verdict} here")
    line += step_breakdown(ok[name], base)
    if not judged:
        line += (" (no GPU: offload crosses no bus here; recorded in T4 emulation: "
                 f"{RECORDED_T4_OFFLOAD_RATIO})")
    elif environment and environment.cpu_note():
        line += f" (CPU cores: {environment.cpu_cores}, {environment.cpu_note()})"
    return ratio, line


def step_breakdown(offload: runner.RunResult, base: runner.RunResult) -> str:
    """Where an offload run's extra time goes, against stage 0's, from ``engine.step()`` timed
    alone in each run: '' where either run did not time it."""
    step, base_step = (runner.median_step_s(r.optimizer_step_s) for r in (offload, base))
    if step is None or base_step is None or not base.median_step_s:
        return ""
    rest, base_rest = offload.median_step_s - step, base.median_step_s - base_step
    floor = (base_rest + step) / base.median_step_s
    if step <= base_step:  # ZenFlow's step overlaps the next forward and backward
        return (f"; its optimizer step ({step:.2f} s) is no slower than stage 0's "
                f"({base_step:.2f} s): its forward and backward, where its CPU update overlaps, "
                f"take {rest - base_rest:.2f} s longer")
    return (f"; of the {offload.median_step_s - base.median_step_s:.2f} s it adds, "
            f"{step - base_step:.2f} s are the optimizer step ({step:.2f} s against "
            f"{base_step:.2f}: Adam on the CPU and the weights copied back) and "
            f"{rest - base_rest:.2f} s the forward and backward ({rest:.2f} s against "
            f"{base_rest:.2f}: the gradients copied out); with a forward and backward as fast as "
            f"stage 0's, its optimizer step alone would still make {floor:.2f}x")


def takeaways(runs: list[MethodRun], largest: dict[str, int],
              environment: kit_env.Environment, start: Start) -> list[str]:
    """Notebook 09's summary, from this run's figures (``start``: the model before training)."""
    ok = _ok(runs)
    lines = []
    if LORA_NAME in ok and FULL in ok:
        lora, full = ok[LORA_NAME], ok[FULL]
        states = memory.lora_bytes_per_param(lora.n_params, lora.n_trainable)
        lines.append(f"LoRA trained {lora.n_trainable / 1e6:.2f}M of {lora.n_params / 1e6:.1f}M "
                     f"parameters ({states:.2f} bytes of model states per parameter in fp16, "
                     f"against full fine-tuning's 16); the held-out loss went from "
                     f"{start.eval_loss:.3f} (the pretrained model) to {_eval_cell(lora, start)} "
                     f"with LoRA and to {_eval_cell(full, start)} with full fine-tuning, after the "
                     f"same tokens.")
    if QLORA_NAME in ok and LORA_NAME in ok:
        q, lora = ok[QLORA_NAME], ok[LORA_NAME]
        lines.append(f"QLoRA trained the same adapters on the base in 4 bits: held-out loss "
                     f"{_eval_cell(q, start)}, against LoRA's {_eval_cell(lora, start)} on the "
                     f"16-bit base" + _peaks(q, lora, environment) + ".")
    if ADAM_8BIT in ok and FULL in ok:
        a8, full = ok[ADAM_8BIT], ok[FULL]
        lines.append(f"8-bit Adam: held-out loss {_eval_cell(a8, start)} against fp32 Adam's "
                     f"{_eval_cell(full, start)}" + _peaks(a8, full, environment) + ".")
    if ZENFLOW_NAME in ok and UNPINNED in ok:
        zen, plain = ok[ZENFLOW_NAME], ok[UNPINNED]
        lines.append(f"ZenFlow stepped in {zen.median_step_s:.2f} s against plain offload's "
                     f"{plain.median_step_s:.2f} s, held-out loss {_eval_cell(zen)} against "
                     f"{_eval_cell(plain)}: most of its updates wait 4 steps.")
    if largest.get(LORA_NAME) and largest.get(FULL):
        lines.append(f"On a T4 (estimator): QLoRA up to {largest.get(QLORA_NAME, 0) / 1e9:.2f}B "
                     f"parameters, LoRA up to {largest[LORA_NAME] / 1e9:.2f}B, full fine-tuning "
                     f"at stage 0 up to {largest[FULL] / 1e9:.2f}B (with 8-bit Adam "
                     f"{largest.get(ADAM_8BIT, 0) / 1e9:.2f}B), with CPU offload up to "
                     f"{largest.get(UNPINNED, 0) / 1e9:.2f}B.")
    lines.append(offload_benchmark(runs, environment)[1] + ".")
    for r in runs:  # fp16's loss scale at work: how many steps it skipped, and what to do if many
        if r.result.status == runner.OK and r.result.skipped_steps:
            lines.append(f"{r.method.name}: " + claims.overflow_advice(
                r.result.skipped_steps, precision_of(r.ds_config),
                r.result.steps_done or len(r.result.losses)))
    for r in runs:
        if r.result.status != runner.OK:
            lines.append(f"{r.method.name}: {r.result.status}: {show.clip(r.result.message, 160)}")
    return lines


def _peaks(run: runner.RunResult, other: runner.RunResult,
           environment: kit_env.Environment) -> str:
    """'; peak GPU a against b GiB' for two runs measured on a GPU ('' on a CPU)."""
    if not environment.has_gpu:
        return ""
    return (f"; peak GPU {show.gib(run.peak_gpu_allocated_bytes)} against "
            f"{show.gib(other.peak_gpu_allocated_bytes)} GiB")


def summary(runs: list[MethodRun], claims_held: list[claims.Claim],
            adapter_held: list[claims.Claim], start: Start) -> str:
    """Facts that read the same on a CPU and on a T4 (what nbval compares): the methods, whether
    the model started pretrained and every run's held-out loss fell below its loss before
    training, whether LoRA under ZeRO-3's adapter checks held (``adapter_held``), every row
    explained, every check."""
    ok = _ok(runs)
    fell = claims.every(res.eval_loss is not None and claims.held_out_claim(
        loss_before(res, start), res.eval_loss)[1] for res in ok.values())
    return "\n".join([
        "methods: " + "; ".join(r.method.name for r in runs),
        f"the model starts pretrained: {start.pretrained}",
        f"every run that went ended below its held-out loss before training: {fell}",
        f"LoRA under ZeRO-3: adapter saved non-empty, reloaded with the same logits, trained as "
        f"on one GPU: {claims.every(held for _, held in adapter_held)}",
        f"every method ran or said why: "
        f"{claims.every(row_explained(r) for r in runs)}",
        f"all checks held: {claims.every(held for _, held in claims_held + adapter_held)}",
    ])


# ---- LoRA under ZeRO-3: the saved adapter --------------------------------------------------


def adapter_tensors(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of the adapter PEFT saved in ``folder`` (adapter_model.safetensors).
    FileNotFoundError (saying what is there) when the folder holds no adapter."""
    from safetensors import safe_open

    path = Path(folder) / "adapter_model.safetensors"
    if not path.is_file():
        there = sorted(p.name for p in Path(folder).glob("*")) if Path(folder).is_dir() else []
        raise FileNotFoundError(f"no adapter_model.safetensors in {folder} (there: "
                                f"{', '.join(there) or 'nothing'}): save with trainer.save_model")
    with safe_open(str(path), framework="pt") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def adapter_effect(model, probe) -> float:
    """The largest change of a logit that a PEFT model's adapters make: the model against itself
    with its adapters disabled. LoRA starts with B = 0, so adapters that never trained make none,
    and a reload check alone (same logits as the trained model) cannot tell them from trained ones."""
    import torch

    model.eval()
    with torch.no_grad():
        on = model(input_ids=probe.to(model.device)).logits.float()
        with model.disable_adapter():
            off = model(input_ids=probe.to(model.device)).logits.float()
    return (on - off).abs().max().item()


#: How far the reloaded model's logits may stray from the trained one's, relative to the largest
#: |logit| (zero2_training.logit_difference): fp32 weights, and half precision ones (rounding).
RELOAD_TOL = {"fp32": 1e-4, "half": 2e-2}


def reload_claims(folder: str | Path, trained, reloaded, probe, precision: str | None
                  ) -> list[claims.Claim]:
    """The saved adapter's tensors (:func:`adapter_claims`); the reloaded model gives the trained
    one's logits (within :data:`RELOAD_TOL`); and its adapters change the base model's logits by
    more than that (:func:`adapter_effect`): untrained adapters would pass the reload check too."""
    from helpers.lessons import zero2_training

    tol = RELOAD_TOL["fp32" if precision in (None, "fp32") else "half"]
    diff = zero2_training.logit_difference(trained, reloaded, probe)
    effect = adapter_effect(reloaded, probe)
    return adapter_claims(folder) + [
        (f"the reloaded adapter gives the trained model's logits (relative difference {diff:.2e}, "
         f"tolerance {tol:g})", diff <= tol),
        (f"the reloaded adapter changes the base model's logits (by up to {effect:.2e}): it "
         "trained", effect > tol)]


def adapter_claims(folder: str | Path) -> list[claims.Claim]:
    """The saved adapter holds LoRA tensors, and none is empty: an adapter saved from a
    ZeRO-3-partitioned model without gathering holds shape-(0,) tensors (the known trap)."""
    shapes = adapter_tensors(folder)
    empty = [name for name, shape in shapes.items() if math.prod(shape) == 0]
    lora = [name for name in shapes if "lora_" in name]
    return [(f"the saved adapter holds LoRA tensors ({len(lora)})", bool(lora)),
            (f"no saved adapter tensor is empty ({len(empty)} empty of {len(shapes)}"
             + (f": {', '.join(empty[:3])}" if empty else "") + ")", bool(shapes) and not empty)]
