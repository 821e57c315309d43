"""The runner: every training run the kit measures, in a fresh process with 1 rank or N
(``torchrun``), each rank's result back as JSON. The only module that starts training runs.

A fresh process per run means a re-run cell never inherits leaked GPU memory, a used port or a
half-initialised process group. The parent watches the whole process tree's host RSS (and can
kill it past a RAM budget, as Colab's out-of-memory killer would), and the disk used by NVMe files.
Each rank runs an entry point, ``"module:function"`` called as ``function(payload, result)``:
:func:`train_rank` (a kit model and a DeepSpeed config, :class:`RunSpec`) unless a caller names
its own (notebook 08's pipeline, MoE and AutoTP runs). Also here: what a rank holds (bytes of
parameters, gradients and optimizer states) and where its host RAM goes (:class:`PhaseTrace`),
and the stage and offload rows run one after another (:func:`run_matrix`).

    python -m helpers bench --shape gpt2-124m --stage 2 --offload-optimizer cpu --steps 5
    python -m helpers matrix --world-size 2 --shape gpt2-355m --micro-batch 4 --seq-len 512
"""

from __future__ import annotations

import importlib
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from helpers import config as kit_config
from helpers import config_check, memory, show, taught
from helpers import env as kit_env
from helpers.show import Table

OK, OOM, KILLED_RAM, TIMEOUT, ERROR = "ok", kit_env.OUT_OF_GPU_MEMORY, "killed for host RAM", "timeout", "error"
NOT_HERE, NOT_TRIED, REFUSED_DISK = "not here", "not tried", "refused: disk"
#: Outcomes a table may show: a run that went, a limit it hit, or a reason it was not started.
#: "error" and "timeout" are not among them: they mean something broke.
EXPLAINED = (OK, OOM, KILLED_RAM, NOT_HERE, NOT_TRIED, REFUSED_DISK)
#: Where finished runs are reported: ``"module:function"``, called with one dict per run (its
#: result and model shape) or probe (:func:`report`). Unset: nobody listens. The GPU record run
#: sets it to tools/run_log.py's ``append`` (docs/gpu_runs.md), since nbval keeps no notebook output.
REPORT_ENV = "KIT_REPORT_TO"
#: The entry point of the kit's own runs: :func:`train_rank`.
TRAIN_ENTRY = "helpers.runner:train_rank"


@dataclass
class RunSpec:
    """What to run: a GPT-2-shaped model, a DeepSpeed config, and the sizes of the batches. The
    config is the one carrier of the micro batch and the number of ranks (:attr:`micro_batch`,
    :attr:`world_size`), as ``deepspeed.initialize`` reads them."""

    ds_config: dict
    shape: str = "tiny"
    vocab_size: int | None = None  # None: GPT-2's 50257
    seq_len: int = 64
    steps: int = 4
    grad_ckpt: bool = False
    seed: int = 0
    label: str = ""
    gpu_cap_bytes: int | None = None  # cap GPU memory for this run (tests provoke OOM with it)
    ram_limit_bytes: int | None = None  # kill the run when its process tree's RSS passes this
    timeout_s: int = 1800
    zero_init: bool = False  # ZeRO-3: build the model partitioned (low host RAM; other random init than stage 0)
    force_cpu: bool = False  # hide the GPUs: DeepSpeed's CPU accelerator, gloo between ranks
    model_path: str | None = None  # a from_pretrained folder (its own tokenizer) in place of shape
    text_path: str | None = None  # a text file to train on; None: the kit's offline corpus
    lora: dict | None = None  # LoraConfig's arguments: train PEFT adapters, the model frozen
    eval_batches: int = 0  # held-out batches (the text's last tenth) scored after training
    # the input embedding (and an LM head tied to it) frozen: no gradient, no optimizer state
    freeze_embeddings: bool = False
    # transformers.get_scheduler's arguments (name, num_warmup_steps, num_training_steps): the
    # schedule a Trainer runs, in place of the config's "scheduler" (None: the config's)
    lr_schedule: dict | None = None
    # BitsAndBytesConfig's arguments: the model's frozen weights loaded quantized (QLoRA, with lora)
    quantize: dict | None = None
    # a TrainingArguments optim name ("adamw_bnb_8bit": bitsandbytes' 8-bit AdamW) whose optimizer
    # is handed to deepspeed.initialize in place of the config's "optimizer" (its lr, betas, eps and
    # weight decay); None: the config's
    optimizer: str | None = None
    # after training: notebook 06's 16-bit save (taught.save_16bit_in_shards) into this folder,
    # the engine freed, the folder reloaded with from_pretrained and its logits compared with the
    # trained engine's on one batch; the folder is removed afterwards (None: no save)
    save_reload_dir: str | None = None

    def __post_init__(self) -> None:
        """A config that gives no micro batch in numbers ("auto" is the Trainer's to fill) cannot
        say what to run: refused (ValueError) with the fix."""
        if "micro_batch" not in memory.batch_in_config(self.ds_config):
            value = self.ds_config.get("train_micro_batch_size_per_gpu", "missing")
            raise ValueError(
                f"RunSpec {self.label or self.shape!r}: the DeepSpeed config carries the micro batch, and "
                f"its train_micro_batch_size_per_gpu is {value!r}: write a number there (and train_batch_size"
                " = micro batch x gradient_accumulation_steps x ranks for more than one rank), or build it"
                " with helpers.config.build(micro_batch=N, world_size=W, trainer=False)")

    @property
    def micro_batch(self) -> int:
        """Samples per forward and backward on one rank: the config's train_micro_batch_size_per_gpu."""
        return memory.batch_in_config(self.ds_config)["micro_batch"]

    @property
    def world_size(self) -> int:
        """How many ranks run: train_batch_size over micro batch x accumulation (1 where the config
        gives no train_batch_size: DeepSpeed would then take the launcher's number)."""
        return memory.batch_in_config(self.ds_config).get("world_size", 1)


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
    optimizer_step_s: list[float] = field(default_factory=list)  # engine.step() alone, each step
    tokens_per_s: float | None = None
    peak_gpu_allocated_bytes: int | None = None
    peak_gpu_reserved_bytes: int | None = None
    peak_host_rss_bytes: int = 0
    peak_nvme_bytes: int = 0
    wall_s: float = 0.0
    n_trainable: int = 0
    eval_loss: float | None = None  # mean loss on held-out batches after training (eval_batches)
    # ...and before training, for a run whose model is not the one loaded (a quantized base)
    eval_loss_before: float | None = None
    ranks: list[dict] = field(default_factory=list)
    rss_phases: list[dict] = field(default_factory=list)  # rank 0's phases (PhaseTrace)
    last_phase: str = ""  # the phase rank 0 was in when the parent killed the run (RAM, time)
    deepspeed_fixes: list[str] = field(default_factory=list)  # helpers.deepspeed_fixes it installed
    # RunSpec.save_reload_dir: the largest logit difference between the reloaded folder and the
    # trained engine (None: no save), the bytes the save wrote, and its seconds
    reload_logit_diff: float | None = None
    saved_bytes: int = 0
    save_s: float | None = None
    save_error: str = ""  # the save or reload failed (the training's status stands): why


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
        limit = min(b for b in (cap_bytes, emulated and emulated.gpu_cap_bytes,
                                torch.cuda.get_device_properties(device).total_memory) if b)
        msg += f" with {held:.2f} GiB in use, limit {limit / show.GiB:.1f} GiB"
    return msg


def entry_point(name: str) -> Callable:
    """The function ``"module:function"`` names (a rank's entry point, or :data:`REPORT_ENV`'s)."""
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def worker(spec_path: str) -> int:
    """One rank of one run (``python -m helpers worker <spec.json>``, as :func:`run_ranks` starts
    it): the entry point runs, and every failure comes back as JSON for the parent to explain."""
    payload = json.loads(Path(spec_path).read_text())
    out_dir, entry = Path(payload.pop("out_dir")), payload.pop("entry")
    rank = int(os.environ.get("RANK", "0"))
    os.environ[PHASE_FILE_ENV] = str(out_dir / f"phase{rank}.txt")  # survives a SIGKILL
    result: dict = {"rank": rank, "status": ERROR, "message": ""}
    try:
        entry_point(entry)(payload, result)
        result["status"] = OK
    except BaseException as err:  # report every failure as JSON; the parent explains it
        result["status"] = OOM if kit_env.is_out_of_memory(err) else ERROR
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        result["message"] = (_oom_message(str(err), payload.get("gpu_cap_bytes")) if result["status"] == OOM else
                             f"{type(err).__name__}: {' | '.join(l.strip() for l in lines[:3])}"[:500])
    finally:
        (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    return 0 if result["status"] == OK else 3


def train_rank(payload: dict, result: dict) -> None:
    """The kit's entry point (:data:`TRAIN_ENTRY`): :func:`train_steps` on a :class:`RunSpec`, with
    this rank's host RSS per phase and its own RSS peak in ``result``."""
    trace = PhaseTrace(marker=os.environ.get(PHASE_FILE_ENV))
    trace.enter("imports, process group")
    try:
        train_steps(RunSpec(**payload), result, trace)
    finally:
        result["rss_phases"] = trace.stop()
        high = high_water_bytes()  # this rank's own peak, where it passed the parent's
        result["rss_high_water_bytes"] = high if high > trace.inherited_high_water else None


def train_steps(spec: RunSpec, result: dict, trace: PhaseTrace | None = None) -> None:
    """The engine loop every measured run executes, in its subprocess: ``deepspeed.initialize``,
    then notebook 07's own ``train_step`` for each batch (:mod:`helpers.taught`, generated from its
    lesson cell), with the kit's measurements around it (:func:`measure_inside`: bytes each rank
    holds, step times; peak GPU memory, and ``trace``'s host RSS per phase)."""
    enter = trace.enter if trace else (lambda phase: None)
    import torch

    from helpers import data, models

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        kit_env.emulate()  # KIT_EMULATE, as the parent set it: the same GPU cap here
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

    config = dict(spec.ds_config)
    # Only the fixes this config needs (a stage 2 run gets none that changes a result), named in
    # the result so the tables can say which ran: a lesson's figure never leans on a hidden one.
    deepspeed_fixes.install_needed(config, in_kernel=False, on_cpu=not cuda,
                                   destroys=bool(spec.save_reload_dir))
    result["deepspeed_fixes"] = deepspeed_fixes.in_place()  # recorded before anything can fail
    model_config = models.model_config(spec.shape, spec.vocab_size, max_positions=max(1024, spec.seq_len))
    keep_alive = None
    if spec.zero_init and config.get("zero_optimization", {}).get("stage") == 3:
        # Partitioned construction with HF's weight init (a bare zero.Init started at loss ~100).
        from transformers.integrations import HfDeepSpeedConfig

        keep_alive = HfDeepSpeedConfig(config)
    enter("model built")
    model, tokenizer = prepared_model(spec, model_config)
    enter("deepspeed.initialize")
    trained = [p for p in model.parameters() if p.requires_grad]
    schedule = None
    if spec.lr_schedule:  # the Trainer's own: DeepSpeed calls it with the optimizer it builds
        from transformers import get_scheduler

        config.pop("scheduler", None)
        schedule = lambda optimizer: get_scheduler(optimizer=optimizer, **spec.lr_schedule)  # noqa: E731
    optimizer = None
    if spec.optimizer:
        optimizer = client_optimizer(spec.optimizer, trained, config.pop("optimizer", {}))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=config,
                                      optimizer=optimizer, lr_scheduler=schedule)
    result["n_params"] = sum(map(numel, model.parameters()))
    result["n_trainable"] = sum(map(numel, trained))
    if spec.text_path:
        corpus = Path(spec.text_path).read_text()
    else:
        corpus = data.offline_corpus(max(50_000, spec.seq_len * spec.micro_batch * (spec.steps + 2) * 2),
                                     seed=spec.seed)
    corpus, held_out = data.split_held_out(corpus) if spec.eval_batches else (corpus, "")
    rank = int(os.environ.get("RANK", "0"))
    steps = data.batches(corpus, tokenizer, spec.seq_len, spec.micro_batch, spec.steps, seed=spec.seed + rank)
    held = (data.batches(held_out, tokenizer, spec.seq_len, spec.micro_batch, spec.eval_batches,
                         seed=spec.seed) if spec.eval_batches else [])
    if held and spec.quantize:  # a quantized base is not the model as loaded: its own start
        result["eval_loss_before"] = held_out_loss(engine, held)
    losses, times, scales, step_times = [], [], [], []
    measure_inside(engine, result, step_times, enter, cuda)
    for batch in steps:
        batch = batch.to(engine.device)
        start = time.perf_counter()
        enter("forward and backward")
        losses.append(float(taught.train_step(engine, {"input_ids": batch, "labels": batch})))
        times.append(time.perf_counter() - start)
        scale = getattr(engine.optimizer, "loss_scale", None)
        scales.append(float(scale) if isinstance(scale, (int, float)) else float(getattr(scale, "item", lambda: 1.0)()))
    result.update(losses=losses, step_times_s=times, loss_scales=scales, steps_done=len(losses),
                  optimizer_step_s=step_times,
                  skipped_steps=int(getattr(engine, "skipped_steps", 0)))
    if held:
        result["eval_loss"] = held_out_loss(engine, held)
    if cuda:
        # the trace resets torch's peaks at each phase: the run's peak is the larger of its record
        # of the phases closed and the current one's
        result["peak_gpu_allocated_bytes"] = max(torch.cuda.max_memory_allocated(),
                                                 trace.gpu_high if trace else 0)
        result["peak_gpu_reserved_bytes"] = max(torch.cuda.max_memory_reserved(),
                                                trace.gpu_reserved_high if trace else 0)
    if spec.save_reload_dir:
        keep_alive = None  # dropped: from_pretrained would partition the reload under ZeRO-3
        try:  # the training above stands whatever the save does: its failure is its own record
            save_and_reload(engine, (held or steps)[0][:1, :32], spec.save_reload_dir,
                            precision_of(config), result, enter)
        except Exception as err:  # noqa: BLE001 - any failure of the save or reload, reported
            result["save_error"] = f"{type(err).__name__}: {err}"[:500]
    del keep_alive


def save_and_reload(engine, probe, folder: str, precision: str, result: dict, enter) -> None:
    """Notebook 06's save and reload, in its order and measured: the save in shards
    (:func:`helpers.taught.save_16bit_in_shards`, with the model's config) into ``folder``,
    ``engine``'s logits on ``probe``, the engine destroyed (its buffers freed:
    helpers.deepspeed_fixes), the folder reloaded (:func:`helpers.taught.reload_saved`) in
    ``precision`` (the config's), the largest logit difference, the bytes written and the save's seconds in
    ``result``. ``folder`` is removed afterwards, whatever happened."""
    import gc

    import torch

    device = engine.device
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    try:
        enter(SAVE_PHASE)
        start = time.perf_counter()
        files = taught.save_16bit_in_shards(engine, folder)
        engine.module.config.save_pretrained(folder)
        result["save_s"] = time.perf_counter() - start
        result["saved_bytes"] = sum((Path(folder) / f).stat().st_size for f in set(files))
        engine.eval()
        with torch.no_grad():
            trained = engine(input_ids=probe.to(device)).logits.float().cpu()
        engine.destroy()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        enter(RELOAD_PHASE)
        reloaded = taught.reload_saved(folder, dtype, str(device))
        with torch.no_grad():
            logits = reloaded(input_ids=probe.to(device)).logits.float().cpu()
        result["reload_logit_diff"] = (logits - trained).abs().max().item()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


#: The host RSS phases of a run's save and reload (:func:`save_and_reload`).
SAVE_PHASE, RELOAD_PHASE = "save in shards", "reload"


def precision_of(config: dict) -> str:
    """What a DeepSpeed config with its precision settled trains in: "fp16", "bf16" or "fp32"
    (the config checker's reading, "bfloat16" sections included)."""
    return config_check.trained_precision(config, []) or "fp32"


def bytes_per_param(config: dict) -> int:
    """Bytes a weight takes in the type a DeepSpeed config trains in (:func:`precision_of`)."""
    return 4 if precision_of(config) == "fp32" else 2


def measure_inside(engine, result: dict, step_times: list[float], enter, cuda: bool) -> None:
    """Measurement hooks around the lesson's step (notebook 07's ``train_step``, which calls
    ``engine.backward`` and ``engine.step``), installed on this engine alone: after the first
    backward, the gradients' bytes; each optimizer step timed alone (what offload moves to the CPU
    and the bus; CUDA synchronized around it); after the first, the states' bytes (Adam's moments
    exist then); ``enter`` marks the phases for the host RSS trace."""
    import torch

    backward, step = engine.backward, engine.step

    def measured_backward(*args, **kwargs):
        out = backward(*args, **kwargs)
        if "grads_bytes" not in result:  # the first backward's gradients
            result["grads_bytes"] = held_bytes(engine)["grads_bytes"]
        return out

    def measured_step(*args, **kwargs):
        enter("optimizer step")
        if cuda:
            torch.cuda.synchronize()
        stepping = time.perf_counter()
        out = step(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - stepping)
        if len(step_times) == 1:
            result.update({k: v for k, v in held_bytes(engine).items() if k != "grads_bytes"})
        return out

    engine.backward, engine.step = measured_backward, measured_step


def prepared_model(spec: RunSpec, model_config=None):
    """(model, tokenizer) as a run trains them: ``spec.model_path``'s from_pretrained folder, or
    ``spec.shape`` built from ``model_config``; in training mode (from_pretrained returns one in
    evaluation mode, where transformers skips activation checkpointing and dropout: in T4 emulation
    on 2026-12-03, notebook 09's runs peaked at the estimator's figures without checkpointing, LoRA
    at 4.56 GiB against 1.95; docs/gpu_runs.md), checkpointing on where ``spec.grad_ckpt`` asks, LoRA's adapters where
    ``spec.lora`` does."""
    import torch

    from helpers import models

    if spec.model_path:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(spec.seed)
        # fp32 weights in (a Hub checkpoint may be bf16; DeepSpeed casts); PyTorch's own layers, no Hub kernels
        model, tokenizer = (AutoModelForCausalLM.from_pretrained(spec.model_path, dtype=torch.float32,
                                                                 use_kernels=False,
                                                                 **quantized(spec.quantize)),
                            AutoTokenizer.from_pretrained(spec.model_path))
        if spec.quantize:  # PEFT's preparation, as notebook 09's qlora_model() makes it (its
            # fp32 norms and embedding go back to fp16 in DeepSpeed's fp16 engine); checkpointing
            # below, transformers' non-reentrant one
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    else:
        model_config = model_config or models.model_config(
            spec.shape, spec.vocab_size, max_positions=max(1024, spec.seq_len))
        model, tokenizer = models.build_model(model_config, seed=spec.seed), models.ByteTokenizer()
    model.train()
    if spec.lora:  # the adapters first, then checkpointing, in notebook 09's lesson order
        model = with_lora(model, spec.lora)
    if spec.grad_ckpt:  # transformers 5's name (the old one prints a FutureWarning in 5.24)
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    if spec.freeze_embeddings:  # notebook 06's lesson function
        taught.freeze_input_embedding(model)
    return model, tokenizer


def numel(param) -> int:
    """The elements a parameter stands for: ZeRO-3's whole count for a partitioned one
    (``ds_numel``), the unpacked shape's for bitsandbytes' 4-bit one (two weights a byte)."""
    state = getattr(param, "quant_state", None)
    if state is not None:
        return math.prod(state.shape)
    return int(getattr(param, "ds_numel", param.numel()))


def quantized(quantize: dict | None) -> dict:
    """``from_pretrained``'s extra arguments for a model loaded with its weights quantized by
    bitsandbytes (``BitsAndBytesConfig(**quantize)``, on this rank's GPU where there is one); {}
    for ``None``."""
    if not quantize:
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    where = {"device_map": {"": rank}} if torch.cuda.is_available() else {}
    return {"quantization_config": BitsAndBytesConfig(**quantize), **where}


def client_optimizer(optim: str, params, section: dict):
    """The optimizer class a Trainer picks for ``TrainingArguments(optim=optim)`` (transformers'
    own ``Trainer.get_optimizer_cls_and_kwargs``: "adamw_bnb_8bit" is bitsandbytes' AdamW with
    ``optim_bits=8``, Adam's moments in 8 bits) over ``params``, one group with the learning rate,
    betas, eps and weight decay of the config's "optimizer" ``section``. Where the Trainer's own
    ``create_optimizer`` goes further: it exempts biases and norms from weight decay and keeps
    embeddings' states in 32 bits, overrides registered by tensor, which DeepSpeed's fp16 engine
    (stepping fp32 copies) would not see."""
    import tempfile

    from transformers import Trainer, TrainingArguments

    given = section.get("params", {})
    betas = given.get("betas", (0.9, 0.999))
    args = TrainingArguments(output_dir=tempfile.gettempdir(), optim=optim, report_to="none",
                             learning_rate=given.get("lr", 1e-3), adam_beta1=betas[0],
                             adam_beta2=betas[1], adam_epsilon=given.get("eps", 1e-8),
                             weight_decay=given.get("weight_decay", 0.0))
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    # the Trainer hands weight decay over in parameter groups, not in kwargs: one group here
    return cls([{"params": list(params), "weight_decay": args.weight_decay}], **kwargs)


def with_lora(model, lora: dict):
    """``model`` with PEFT's LoRA adapters (``LoraConfig(**lora)``, a causal LM's task), as notebook
    09's lesson makes them: the model's own weights frozen, the adapters trained. Checkpointing is
    switched on after (transformers 5's is non-reentrant: the checkpointed layers get their
    gradients without the inputs requiring any)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))


def held_out_loss(engine, batches) -> float:
    """The mean loss of ``engine``'s model over ``batches``, without gradients (evaluation mode,
    then back to training)."""
    import torch

    engine.eval()
    with torch.no_grad():
        losses = [float(engine(input_ids=b.to(engine.device), labels=b.to(engine.device)).loss)
                  for b in batches]
    engine.train()
    return sum(losses) / len(losses)


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


def run(spec: RunSpec, log_path: str | os.PathLike | None = None, entry: str = TRAIN_ENTRY) -> RunResult:
    """Run ``spec`` in a fresh subprocess (``torchrun`` for world size > 1) and return its result,
    reported to whoever listens (:func:`report`). ``entry`` is the function each rank runs (the
    kit's engine loop unless a caller brings its own)."""
    result = run_ranks(asdict(spec), entry, spec.world_size, spec.label or _label(spec.ds_config),
                       timeout_s=spec.timeout_s, ram_limit_bytes=spec.ram_limit_bytes,
                       force_cpu=spec.force_cpu, log_path=log_path, merge=_merge)
    if not result.ranks:  # killed before any rank wrote its result: it had installed, at its
        # start, what its config needs
        import torch

        from helpers import deepspeed_fixes

        on_cpu = spec.force_cpu or not torch.cuda.is_available()
        result.deepspeed_fixes = sorted(deepspeed_fixes.needed_by(
            spec.ds_config, in_kernel=False, on_cpu=on_cpu, destroys=False))
    report({"shape": spec.shape, **asdict(result)})
    return result


def run_ranks(payload: dict, entry: str, world_size: int, label: str, *, timeout_s: int,
              ram_limit_bytes: int | None = None, force_cpu: bool = False,
              log_path: str | os.PathLike | None = None,
              merge: Callable[[RunResult, list[dict]], object] | None = None,
              work_prefix: str = "kit_bench_") -> RunResult:
    """Run ``entry`` (``"module:function"``, called as ``function(payload, result)``) in a fresh
    process, or in ``world_size`` of them under ``torchrun``, and return a :class:`RunResult`: the
    ranks' JSON passed to ``merge`` (ranks sorted; default: kept as they came), or the limit the run
    hit (host RAM past ``ram_limit_bytes``, ``timeout_s``, killed by the kernel), or the error its
    log ends with. A payload with a ``ds_config`` that offloads to NVMe gets its own swap folder.

    A run whose rendezvous port was taken in the moment between probing and binding (another run
    starting beside it) is started once more on a new port."""
    once = lambda: _run_once(payload, entry, world_size, label, timeout_s, ram_limit_bytes, force_cpu,
                             log_path, merge, work_prefix)
    result = once()
    return once() if _port_clash(result) else result


def _run_once(payload: dict, entry: str, world_size: int, label: str, timeout_s: int,
              ram_limit_bytes: int | None, force_cpu: bool, log_path: str | os.PathLike | None,
              merge: Callable[[RunResult, list[dict]], object] | None, work_prefix: str) -> RunResult:
    import psutil

    work = Path(tempfile.mkdtemp(prefix=work_prefix))
    nvme = nvme_path(payload.get("ds_config") or {})
    nvme_existed = bool(nvme) and os.path.exists(nvme)
    if nvme:
        # Each run swaps into its own subfolder of the config's nvme_path: DeepSpeed names its
        # swap files the same in every process, so two runs side by side (pytest workers, two
        # notebooks, the grid) would overwrite each other's states, and one's clean-up would
        # delete the other's.
        nvme = os.path.join(nvme, f"run-{os.getpid()}-{work.name}")
        payload = {**payload, "ds_config": with_nvme_folder(payload["ds_config"], nvme)}
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps({**payload, "entry": entry, "out_dir": str(work)}))
    worker_args = ["-m", "helpers", "worker", str(spec_path)]
    if world_size == 1:
        cmd = [sys.executable, *worker_args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world_size),
               "--master-addr", "127.0.0.1", "--master-port", str(kit_env.free_port()), *worker_args]
    log_file = open(log_path or work / "log.txt", "w")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, cwd=str(kit_env.REPO_ROOT),
                            env=_child_env(world_size, force_cpu), start_new_session=True)
    watched = psutil.Process(proc.pid)
    peak_rss = peak_nvme = 0
    forced = ""
    last_disk = 0.0
    while proc.poll() is None:
        peak_rss = max(peak_rss, _tree_rss(watched))
        if nvme and time.perf_counter() - last_disk > 1.0:
            peak_nvme, last_disk = max(peak_nvme, _folder_bytes(nvme)), time.perf_counter()
        if ram_limit_bytes and peak_rss > ram_limit_bytes:
            forced = KILLED_RAM
        elif time.perf_counter() - start > timeout_s:
            forced = TIMEOUT
        if forced:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.1)
    log_file.close()
    result = RunResult(label=label, status=ERROR, world_size=world_size,
                       peak_host_rss_bytes=peak_rss, peak_nvme_bytes=peak_nvme, wall_s=time.perf_counter() - start)
    ranks = sorted((json.loads(p.read_text()) for p in work.glob("rank*.json")), key=lambda r: r.get("rank", 0))
    log_text = Path(log_path or work / "log.txt").read_text(errors="replace")
    if forced or not ranks:  # rank 0 wrote no JSON: the phase it was in, from its marker file
        marker = work / "phase0.txt"
        result.last_phase = marker.read_text().strip() if marker.exists() else ""
    during = f" during {result.last_phase}" if result.last_phase else ""
    if forced == KILLED_RAM:
        result.status = KILLED_RAM
        result.message = (f"host RSS passed the {ram_limit_bytes / kit_env.GB:.1f} GB budget "
                          f"({peak_rss / kit_env.GB:.1f} GB){during}: on Colab the kernel would be"
                          " killed here")
    elif forced == TIMEOUT:
        result.status, result.message = TIMEOUT, f"stopped after {timeout_s} s"
    elif not ranks:
        result.status = KILLED_RAM if proc.returncode in (-9, 137) else ERROR
        result.message = (f"killed by signal 9{during}, as the kernel's out-of-memory killer does:"
                          " not enough host RAM"
                          if result.status == KILLED_RAM else _last_error(log_text) or f"exit code {proc.returncode}")
    elif merge is not None:
        merge(result, ranks)
    else:
        result.ranks = ranks
    if nvme:
        _remove_swap_files(nvme, os.path.dirname(nvme), created=not nvme_existed)
    if payload.get("save_reload_dir"):  # a run killed mid-save leaves its shards: gone too
        shutil.rmtree(payload["save_reload_dir"], ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    if world_size > 1:  # DeepSpeed leaves its CPU ranks' all-reduce buffers in RAM
        kit_env.remove_ended_shm_buffers()
    return result


def report(record: dict) -> None:
    """Hand one record (a finished run, a disk probe) to the function :data:`REPORT_ENV` names, if
    set: how a measurement campaign (tools/gpu_record_run.sh) collects what notebooks measured."""
    if os.environ.get(REPORT_ENV):
        entry_point(os.environ[REPORT_ENV])(record)


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
    return show.clip((errors or lines or [""])[-1], 500)


def median_step_s(step_times_s: list[float]) -> float | None:
    """A run's typical step time: the median without the first step (warm-up, compiles), or the
    first step alone; None when no step was timed."""
    timed = sorted(step_times_s[1:] or step_times_s)
    return timed[len(timed) // 2] if timed else None


def _merge(result: RunResult, ranks: list[dict]) -> None:
    bad = [r for r in ranks if r["status"] != OK]
    first = ranks[0]
    if bad:
        result.status = OOM if any(r["status"] == OOM for r in bad) else ERROR
        result.message = bad[0]["message"]
    else:
        result.status = OK
    result.n_params = first.get("n_params", 0)
    result.n_trainable = first.get("n_trainable", 0)
    result.eval_loss = first.get("eval_loss")
    result.eval_loss_before = first.get("eval_loss_before")
    result.losses = first.get("losses", [])
    result.loss_scales = first.get("loss_scales", [])
    result.skipped_steps = first.get("skipped_steps", 0)
    result.steps_done = first.get("steps_done", 0)
    result.step_times_s = first.get("step_times_s", [])
    result.optimizer_step_s = first.get("optimizer_step_s", [])
    result.rss_phases = first.get("rss_phases", [])
    result.deepspeed_fixes = first.get("deepspeed_fixes", [])
    result.reload_logit_diff = first.get("reload_logit_diff")
    result.saved_bytes = first.get("saved_bytes", 0)
    result.save_s = first.get("save_s")
    result.save_error = first.get("save_error", "")
    result.median_step_s = median_step_s(result.step_times_s)
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


def fixes_note(results: list[RunResult], labels: list[str] | None = None) -> str:
    """Which of the kit's DeepSpeed fixes each run installed (it installs only those its config
    needs: helpers.deepspeed_fixes.needed_by), for the line under a table of runs; each run named
    by its label (or ``labels``, one per run, as the table names its rows)."""
    by_fix: dict[str, list[str]] = {}
    names = labels if labels is not None else [r.label for r in results]
    for r, label in zip(results, names, strict=True):
        for name in r.deepspeed_fixes:
            by_fix.setdefault(name, []).append(label)
    if not by_fix:
        return "DeepSpeed fixes: these runs needed none of the kit's (helpers.deepspeed_fixes)."
    note = ("DeepSpeed fixes these runs installed (helpers.deepspeed_fixes, each in "
            "docs/deepspeed_gaps.md): " + "; ".join(f"{name} in {', '.join(labels)}"
                                                   for name, labels in by_fix.items()))
    return note + ("; the other runs none." if any(not r.deepspeed_fixes for r in results) else ".")


def results_table(results: list[RunResult]) -> Table:
    """The measurements side by side: status, peak GPU, peak host RSS, NVMe, step time, losses."""
    return Table(["config", *RESULT_COLUMNS], [(r.label, *result_cells(r)) for r in results],
                 title="Measured runs", note=fixes_note(results))


# ---- the stage and offload rows, one run each --------------------------------------------------


@dataclass
class Row:
    """One config of the matrix: what ran, what came back, what was predicted."""

    label: str
    choice: dict
    spec: RunSpec | None
    result: RunResult
    estimate: memory.Estimate | None


def run_matrix(shape: str, environment: kit_env.Environment, micro_batch: int, seq_len: int, steps: int,
               grad_ckpt: bool = True, nvme_ready: bool = True, kinds: list[dict] | None = None,
               world_size: int = 1, progress: bool = True,
               configs: dict[str, dict] | None = None) -> list[Row]:
    """Run every row of ``configs`` (label: a learner's engine config, as notebook 05's lesson cell
    writes them) or, without them, the rows its lesson functions build in the machine's precision
    (:func:`helpers.config.lesson_row_configs`, NVMe files in the kit's offload folder); where
    ``kinds`` is given, only the rows
    whose config is one of them (stage and offload devices, as config.row_choice reads a config and
    STAGE_ROWS writes them), whatever their labels: a row renamed in the lesson is still picked. Each runs
    with ``world_size`` ranks (one per GPU, or CPU ranks with gloo where there is no GPU) and is
    predicted too. A given config runs as written: the kit's tuning for the row fills only the keys
    it leaves unset (:func:`helpers.config.tuned_row`), and each run's micro batch is its config's. NVMe without async_io becomes an explained row."""
    from tqdm.auto import tqdm

    info = memory.ModelInfo.for_shape(shape)
    rows = []
    if configs is None:
        configs = kit_config.lesson_row_configs(micro_batch, environment.precision,
                                                kit_env.default_offload_dir())
    given = [(label, kit_config.row_choice(cfg.get("zero_optimization", {})), cfg)
             for label, cfg in configs.items()]
    todo = [row for row in given if kinds is None or row[1] in kinds]
    for label, choice, written in tqdm(todo, desc="configs", disable=not progress):
        if "nvme" in choice.values() and not nvme_ready:
            rows.append(Row(label, choice, None, RunResult(
                label, NOT_HERE, "NVMe offload needs libaio: apt-get install -y libaio-dev (notebook 02)"), None))
            continue
        ds = kit_config.tuned_row(written, info, environment, micro_batch, world_size)
        spec = RunSpec(ds_config=ds, shape=shape, seq_len=seq_len, steps=steps, grad_ckpt=grad_ckpt,
                       label=label)
        est = memory.estimate(info, spec.ds_config, seq_len=spec.seq_len, grad_ckpt=spec.grad_ckpt, on_gpu=environment.has_gpu)
        rows.append(Row(label, choice, spec, measure(spec), est))
    return rows


def rows_table(rows: list[Row], environment: kit_env.Environment) -> Table:
    """Measured and predicted side by side, with the T4-sized limits."""
    gib = show.gib
    out = []
    for r in rows:
        res, est = r.result, r.estimate
        out.append((r.label, show.status_cell(res.status, res.message, OK, 70),
                    gib(res.peak_gpu_allocated_bytes), gib(est.total("gpu")) if est and environment.has_gpu else "-",
                    gib(res.peak_host_rss_bytes or None), gib(est.total("cpu")) if est else "-",
                    gib(res.peak_nvme_bytes or None),
                    show.seconds(res.median_step_s),
                    "-" if res.tokens_per_s is None else f"{res.tokens_per_s:,.0f}", show.loss_cell(res.losses, 4)))
    return Table(["config", "status", "GPU GiB", "GPU predicted", "host RSS GiB", "host predicted", "NVMe GiB",
                  "s/step", "tokens/s", "loss first -> last"], out,
                 title=f"ZeRO stages and offload, {environment.measured_on()}",
                 note=fixes_note([r.result for r in rows]))


#: What a rank holds, by kind (:func:`held_bytes`' keys, in the order tables show them).
HELD_KINDS = ("optimizer_bytes", "grads_bytes", "params_bytes")


def ranks_table(rows: list[Row]) -> Table:
    """Every rank's bytes of optimizer states, gradients and parameters, and its peak GPU memory."""
    out = []
    for r in rows:
        for x in r.result.ranks:
            peak = x.get("peak_gpu_allocated_bytes")
            out.append((r.label, x.get("rank"), *(show.mib(x.get(k) or 0) for k in HELD_KINDS),
                        show.gib(peak)))
    return Table(["config", "rank", "optimizer MiB", "gradients MiB", "parameters MiB", "peak GPU GiB"], out,
                 title="Per rank")


# ---- what one rank holds -------------------------------------------------------------------------
#: What one rank holds: bytes of parameters, gradients and optimizer states in a DeepSpeed engine,
#: counted from the tensors themselves (views of one flat buffer counted once). The runner records
#: it after the first step of every run; notebook 05 compares it across 1 and 2 ranks.


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _unique_bytes(tensors, exclude: list | None = None) -> tuple[int, list]:
    """Bytes covered by ``tensors``, overlaps (views of one buffer) counted once, minus ``exclude``.

    Views are counted at their own extent, not their storage's: ZeRO's partitions are views into
    flat buffers, and a rank holds only its view's worth. Returns (bytes, the intervals counted).
    """
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                   for t in tensors if t is not None and t.numel() > 0)
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    total = sum(hi - lo for lo, hi in merged)
    for lo, hi in exclude or []:
        total -= sum(max(0, min(hi, b) - max(lo, a)) for a, b in merged)
    return total, merged


def held_bytes(engine) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer states this rank holds (call after backward).

    Parameters: the model's weights as stored here (ZeRO-3: this rank's partition, ``ds_tensor``).
    Gradients: the model's .grad plus the ZeRO optimizer's gradient partitions and buffers.
    Optimizer states: the inner optimizer's state (Adam's moments) plus fp32 master weights that are
    distinct from the model's weights. Offloaded tensors count too: the split by device is in
    ``*_gpu`` keys.
    """
    model, opt = engine.module, engine.optimizer
    params = [getattr(p, "ds_tensor", None) if hasattr(p, "ds_tensor") else p.data for p in model.parameters()]
    param_bytes, param_keys = _unique_bytes(params)
    grads = [p.grad for p in model.parameters()]
    for name in ("grads_in_partition", "grad_partitions_flat_buffer", "averaged_gradients"):
        grads += list(_tensors(getattr(opt, name, None)))
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat"):
        grads += [t.grad for t in _tensors(getattr(opt, name, None))]
    grad_bytes, _ = _unique_bytes(grads, exclude=param_keys)
    inner = getattr(opt, "optimizer", opt)
    masters = [p for group in getattr(inner, "param_groups", []) for p in group["params"]]
    # ZeRO-3 hands the inner optimizer one sub-group at a time and empties its param_groups after
    # the step: its fp32 master partitions live in fp32_partitioned_groups_flat.
    masters += list(_tensors(getattr(opt, "fp32_partitioned_groups_flat", None)))
    states = list(_tensors(list(getattr(inner, "state", {}).values())))
    opt_bytes, _ = _unique_bytes(masters + states, exclude=param_keys)
    gpu = lambda ts: sum(t.numel() * t.element_size() for t in ts if t is not None and t.is_cuda)
    return {"params_bytes": param_bytes, "grads_bytes": grad_bytes, "optimizer_bytes": opt_bytes,
            "params_gpu_bytes": gpu(params), "optimizer_gpu_bytes": gpu(masters + states)}


# ---- where a process's host RAM goes -------------------------------------------------------------
#: Where a process's host RAM goes: its resident set size (RSS) sampled by a background thread and
#: attributed to the phase the process is in (imports, model construction, ``deepspeed.initialize``,
#: forward and backward, the optimizer step). The runner records one trace per run; notebook 06
#: shows it for the largest models, where host RAM is the wall.
#:
#: A sampler can miss a short spike (its thread waits for the GIL on a busy 2-core machine), so at
#: every phase switch the trace also reads the kernel's high-water mark of the process's RSS
#: (``getrusage``'s ``ru_maxrss``): when it rose during the phase being left, the new high was that
#: phase's, and its peak is exact. (A process started from a bigger one begins with its parent's RSS
#: as its mark, so this helps only once the process passes it.)


def high_water_bytes() -> int:
    """The most RSS this process has held so far, as the kernel counts it (``ru_maxrss``: KiB on
    Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass
class Phase:
    """One phase: RSS when it first began, the highest RSS seen while in it, how often it began,
    and the highest allocated GPU memory in it."""

    name: str
    start_bytes: int
    peak_bytes: int
    entries: int = 1
    gpu_peak_bytes: int | None = None  # torch's peak allocated GPU bytes in it (None: no CUDA)


#: The environment variable naming the file a worker's PhaseTrace keeps its current phase in.
PHASE_FILE_ENV = "KIT_PHASE_FILE"


class PhaseTrace:
    """Peak RSS per named phase, and peak allocated GPU memory per phase where CUDA is in use.
    ``enter(name)`` switches phase (a phase entered again, like one training step's forward and
    backward after another, keeps one peak); ``stop()`` returns them in the order they first
    began. The trace owns torch's peak counters while it runs: it resets them at each switch, so
    read a run's GPU peak from :attr:`gpu_high` (the largest of the phases closed so far), not
    from torch."""

    def __init__(self, interval_s: float = 0.02, marker: str | os.PathLike | None = None):
        import psutil

        self._marker = marker  # a file that holds the current phase's name (read after a kill)
        self._process = psutil.Process()
        self._interval = interval_s
        self._phases: dict[str, Phase] = {}
        self._current: Phase | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample_forever, daemon=True)
        self._high_water = high_water_bytes()  # at the current phase's start
        self.samples = 0  # how many times the sampling thread has read RSS so far
        # On Linux a process started by fork and exec inherits its parent's RSS at the fork as its
        # first high-water mark: only a mark above this one is the process's own.
        self.inherited_high_water = self._high_water
        self.gpu_high = 0  # peak allocated GPU bytes over the phases closed so far
        self.gpu_reserved_high = 0

    def _sample(self) -> int:
        rss = self._process.memory_info().rss
        with self._lock:
            if self._current is not None:
                self._current.peak_bytes = max(self._current.peak_bytes, rss)
        return rss

    def _sample_forever(self) -> None:
        while not self._done.wait(self._interval):
            self._sample()
            self.samples += 1

    def _close_current(self) -> None:
        """Sample the last moments of the phase being left; where the kernel's high-water mark rose
        during it, that high was this phase's."""
        self._sample()
        high = high_water_bytes()
        gpu = self._gpu_peak_since_last(counted=self._current is not None)
        with self._lock:
            if self._current is not None and high > self._high_water:
                self._current.peak_bytes = max(self._current.peak_bytes, high)
            if self._current is not None and gpu is not None:
                self._current.gpu_peak_bytes = max(self._current.gpu_peak_bytes or 0, gpu)
            self._high_water = high

    def _gpu_peak_since_last(self, counted: bool) -> int | None:
        """torch's peak allocated GPU bytes since the last switch (then reset), or None where this
        process has not started CUDA (or CUDA cannot answer, after an error of its own). Before
        the first phase (``counted`` false) the counters are only reset: a peak from before the
        trace began is not its."""
        torch = sys.modules.get("torch")
        try:
            if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
                return None
            peak = torch.cuda.max_memory_allocated()
            reserved = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
        except RuntimeError:  # a CUDA error must not hide the run's own
            return None
        if counted:
            self.gpu_high = max(self.gpu_high, peak)
            self.gpu_reserved_high = max(self.gpu_reserved_high, reserved)
        return peak

    def enter(self, name: str) -> None:
        """From now on, RSS counts towards ``name``."""
        self._close_current()
        if self._marker:
            try:
                Path(self._marker).write_text(name)
            except OSError:
                pass
        rss = self._process.memory_info().rss
        with self._lock:
            phase = self._phases.get(name)
            if phase is None:
                phase = self._phases[name] = Phase(name, rss, rss, 0)
            phase.entries += 1
            phase.peak_bytes = max(phase.peak_bytes, rss)
            self._current = phase
        if not self._thread.is_alive() and not self._done.is_set():
            self._thread.start()

    def stop(self) -> list[dict]:
        """End the trace; the phases as dicts (name, start_bytes, peak_bytes, entries,
        gpu_peak_bytes)."""
        self._close_current()
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            return [asdict(p) for p in self._phases.values()]
