"""DeepSpeed configs: build from plain choices, explain in words, save and load, presets; notebook
05's stage and offload rows (:func:`lesson_row_configs`, :data:`STAGE_ROWS`, :func:`for_row`) and ZeRO-Infinity's
config sized for a model and a RAM budget (:func:`zero_infinity`). Checking lives in
helpers.config_check (``check``, ``Problem`` and ``ConfigError`` are used from here too).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from helpers import env as kit_env
from helpers import memory, taught
from helpers.config_check import (OFFLOAD_DEVICES, PIN_MEMORY_MIN_RAM, PRECISIONS,  # noqa: F401 (re-exported)
                                  ConfigError, Problem, check)
from helpers.show import Table

def _config_dir() -> Path:
    """configs/ of the repository; after ``pip install .`` the copy installed as helpers.configs."""
    here = kit_env.REPO_ROOT / "configs"
    return here if here.is_dir() else Path(__file__).resolve().parent / "configs"


CONFIG_DIR = _config_dir()


#: Peak Adam learning rates by model size, from GPT-3's table (Brown et al. 2020, Table 2.1): larger
#: models need smaller rates. Below 125M parameters the kit uses 1e-3 (tiny models, few steps).
LEARNING_RATES = ((125e6, 1e-3), (350e6, 6e-4), (760e6, 3e-4), (1.3e9, 2.5e-4), (2.7e9, 2e-4),
                  (float("inf"), 1.6e-4))


def learning_rate_for(n_params: int) -> float:
    """The peak learning rate for a model of ``n_params`` parameters (see LEARNING_RATES)."""
    return next(lr for limit, lr in LEARNING_RATES if n_params < limit)


#: fp16's first loss scale, as a power of 2, for the kit's short measured runs (the matrix of
#: notebooks 03 and 05, the faster-offload variants, notebook 06's ladder, the memory grid), where
#: DeepSpeed's usual 2**16 overflowed on the first steps and an overflowing step is skipped.
#: Measured in T4 emulation: 2 of 5 steps skipped at GPT-2 1.5B and 3 of 5 at 2.7B (whose loss then
#: never fell; its scale settled at 2**14, the first that held); with Llama-shaped models (SmolLM2
#: 360M, Qwen2.5 0.5B, Llama 3.2 1B) ZeRO skipped its first 2 of 3-4 steps while stage 0's FP16
#: optimizer skipped none, so their losses parted. 2**12 leaves a margin. Runs of thousands of
#: steps may keep DeepSpeed's 16 (``build``'s default): the scale adapts within the first steps.
SHORT_RUN_SCALE_POWER = 12


def build(stage: int = 2, offload_optimizer: str = "none", offload_param: str = "none", precision: str = "auto",
          micro_batch: int = 4, grad_accum: int = 1, world_size: int = 1, grad_clip: float = 1.0,
          optimizer: str = "AdamW", lr: float = 3e-4, weight_decay: float = 0.0, trainer: bool = True,
          nvme_path: str | os.PathLike | None = None, overlap_comm: bool | None = None,
          contiguous_gradients: bool = True, reduce_bucket_size: int = 50_000_000,
          allgather_bucket_size: int = 50_000_000, prefetch_bucket_size: int = 20_000_000,
          param_persistence_threshold: int = 100_000, max_live_parameters: int = 100_000_000,
          max_reuse_distance: int | None = None, sub_group_size: int = 100_000_000,
          pin_memory: bool | None = None, largest_param_numel: int | None = None, warmup_steps: int = 10,
          environment: kit_env.Environment | None = None, initial_scale_power: int = 16) -> dict:
    """A DeepSpeed config from plain choices. (Long on purpose: one readable recipe, key by key, of
    the config the kit builds; splitting it would hide which choice sets which key.)

    ``trainer=True`` writes "auto" where the Hugging Face Trainer fills values in from its
    TrainingArguments (batch sizes, learning rate, clipping, precision); ``trainer=False`` writes
    numbers for ``deepspeed.initialize``. ``precision="auto"`` picks bf16 from capability 8.0, fp16
    on older GPUs (a T4) and fp32 on the CPU. Bucket sizes default small (T4-sized), not DeepSpeed's
    5e8-element defaults. With parameters on NVMe, ``max_reuse_distance`` defaults to 0: a
    parameter kept for reuse keeps its swap buffer, and a small model then runs out of buffers
    ("Not enough buffers 0 for swapping 1", seen on GPT-2 124M with 5 buffers). Engine configs
    warm the learning rate up linearly from lr/10 over ``warmup_steps`` (DeepSpeed's WarmupLR): at a
    constant 3e-4 from the first step, GPT-2 124M's loss jumped from 6.6 to 15.4 at step 5 (fp32,
    CPU, stage 0, and fp16 on a GPU under ZeRO-2), and at 1e-4 from 5.9 to 12.9 at step 8.
    """
    if max_reuse_distance is None:
        max_reuse_distance = 0 if offload_param == "nvme" else 100_000_000
    if stage not in (0, 1, 2, 3):
        raise ConfigError(f"stage must be 0, 1, 2 or 3, not {stage!r}")
    for name, value in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
        if value not in OFFLOAD_DEVICES:
            raise ConfigError(f"{name} must be one of {', '.join(OFFLOAD_DEVICES)}, not {value!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "auto" and not trainer:
        environment = environment or kit_env.describe()
        precision = environment.precision
    if pin_memory is None:
        environment = environment or kit_env.describe()
        pin_memory = environment.ram_budget_bytes >= PIN_MEMORY_MIN_RAM
    auto = "auto" if trainer else None
    config: dict = {
        "train_batch_size": auto or micro_batch * grad_accum * world_size,
        "train_micro_batch_size_per_gpu": auto or micro_batch,
        "gradient_accumulation_steps": auto or grad_accum,
        "gradient_clipping": auto or grad_clip,
        "optimizer": {"type": optimizer, "params": {
            "lr": auto or lr, "betas": auto or [0.9, 0.999], "eps": auto or 1e-8,
            "weight_decay": auto or weight_decay}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if not trainer and warmup_steps > 0:  # the Trainer makes its own scheduler from TrainingArguments
        config["scheduler"] = {"type": "WarmupLR", "params": {
            "warmup_min_lr": lr / 10, "warmup_max_lr": lr, "warmup_num_steps": int(warmup_steps),
            "warmup_type": "linear"}}
    if precision == "auto":  # Trainer mode: TrainingArguments' --fp16 / --bf16 decide
        config["fp16"] = {"enabled": "auto", "loss_scale": 0, "initial_scale_power": initial_scale_power, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
        config["bf16"] = {"enabled": "auto"}
    elif precision == "fp16":  # an explicit choice stays explicit, in Trainer mode too
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": initial_scale_power,
                          "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    elif precision == "bf16":
        config["bf16"] = {"enabled": True}
    zero: dict = {"stage": stage}
    if stage >= 1:
        zero.update(contiguous_gradients=contiguous_gradients, reduce_bucket_size=int(reduce_bucket_size),
                    allgather_bucket_size=int(allgather_bucket_size),
                    overlap_comm=(world_size > 1) if overlap_comm is None else overlap_comm)
    if stage == 3:
        zero.pop("allgather_bucket_size")
        zero.update(stage3_prefetch_bucket_size=int(prefetch_bucket_size),
                    stage3_param_persistence_threshold=int(param_persistence_threshold),
                    stage3_max_live_parameters=int(max_live_parameters),
                    stage3_max_reuse_distance=int(max_reuse_distance), sub_group_size=int(sub_group_size),
                    stage3_gather_16bit_weights_on_model_save=True)
    path = str(nvme_path or kit_env.default_offload_dir())
    if offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": offload_optimizer, "pin_memory": pin_memory}
        if offload_optimizer == "nvme":
            zero["offload_optimizer"].update(nvme_path=path, buffer_count=4)
    if offload_param != "none":
        zero["offload_param"] = {"device": offload_param, "pin_memory": pin_memory}
        if offload_param == "nvme":
            size = int(1.05 * largest_param_numel) if largest_param_numel else 100_000_000
            zero["offload_param"].update(nvme_path=path, buffer_count=5, buffer_size=size, max_in_cpu=0)
    if "nvme" in (offload_optimizer, offload_param):
        config["aio"] = {"block_size": 1_048_576, "queue_depth": 16, "single_submit": False,
                         "overlap_events": True, "intra_op_parallelism": 2}  # "thread_count" before DeepSpeed 0.15
    config["zero_optimization"] = zero
    return config


_EXPLAIN = {
    "train_batch_size": "samples per optimizer step over all GPUs = micro batch x accumulation x GPUs",
    "train_micro_batch_size_per_gpu": "samples per forward/backward on one GPU: activation memory grows with it",
    "gradient_accumulation_steps": "micro batches summed before a step: a bigger effective batch, no extra memory",
    "gradient_clipping": "caps the gradient norm: guards fp16 runs against spikes",
    "optimizer": "AdamW keeps 2 fp32 moments per parameter (8 bytes) plus an fp32 master copy (4 bytes)",
    "fp16": "half-precision weights and activations (2 bytes), dynamic loss scaling against underflow; the T4's choice",
    "bf16": "bfloat16: fp32's range in 2 bytes, no loss scaling; needs capability >= 8.0",
    "zero_optimization.stage": "0: every GPU holds everything; 1: optimizer states partitioned; 2: + gradients; 3: + parameters",
    "zero_optimization.offload_optimizer": "optimizer states (12 bytes/param) and the Adam step move to host RAM or NVMe: "
                                           "much less GPU memory, slower steps",
    "zero_optimization.offload_param": "stage 3 only: parameters live in host RAM or NVMe and are fetched layer by layer",
    "zero_optimization.overlap_comm": "overlaps gradient reduction with backward: faster with several GPUs, more buffer memory",
    "zero_optimization.contiguous_gradients": "copies gradients into one buffer as they are produced: less fragmentation",
    "zero_optimization.reduce_bucket_size": "elements reduced at a time: bigger is faster across GPUs, costs 2 bytes each on the GPU",
    "zero_optimization.allgather_bucket_size": "elements gathered at a time after the step (stages 1-2)",
    "zero_optimization.stage3_prefetch_bucket_size": "parameters fetched ahead of use (stage 3): more speed, more memory",
    "zero_optimization.stage3_param_persistence_threshold": "parameters smaller than this stay whole on every GPU (stage 3)",
    "zero_optimization.stage3_max_live_parameters": "ceiling on gathered parameters held at once (stage 3)",
    "zero_optimization.stage3_max_reuse_distance": "keep a gathered parameter if it is reused within this many (stage 3)",
    "zero_optimization.sub_group_size": "parameters per optimizer step chunk: smaller chunks, smaller NVMe/CPU buffers",
    "aio": "libaio settings for NVMe offload: block size, queue depth, threads",
}


def explain(config: dict) -> Table:
    """What each setting in ``config`` does to memory and speed, one row per setting present."""
    rows = []
    zero = config.get("zero_optimization", {})
    for key, text in _EXPLAIN.items():
        if key.startswith("zero_optimization."):
            sub = key.split(".", 1)[1]
            if sub in zero:
                rows.append((key, json.dumps(zero[sub]), text))
        elif key in config:
            value = config[key]
            shown = value if not isinstance(value, dict) or key == "aio" else {
                k: v for k, v in value.items() if k in ("enabled", "type")}
            rows.append((key, json.dumps(shown), text))
    return Table(["setting", "value", "what it does"], rows, title="What this config does")


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def save(config: dict, name: str, folder: str | os.PathLike | None = None) -> Path:
    """Write ``config`` as ``configs/<name>.json`` (pretty JSON) and return the path."""
    stem = name[:-5] if name.endswith(".json") else name
    if not _NAME.match(stem):
        raise ConfigError(f"config name {name!r} must be letters, digits, '.', '_' or '-' (no folders)")
    path = Path(folder or CONFIG_DIR) / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def load(path: str | os.PathLike, for_trainer: bool | None = None) -> dict:
    """Read a config; refuse it, naming every error, if :func:`check` finds errors.

    ``for_trainer=None`` accepts "auto" values (a Trainer config); False refuses them.
    """
    path = Path(path)
    if not path.exists() and not path.suffix and (CONFIG_DIR / f"{path}.json").exists():
        path = CONFIG_DIR / f"{path}.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no config at {path}: the presets are {', '.join(p.stem for p in sorted(CONFIG_DIR.glob('*.json')))}")
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from None
    errors = [p for p in check(config, for_trainer=True if for_trainer is None else for_trainer) if p.level == "error"]
    if errors:
        raise ConfigError(f"{path.name} has {len(errors)} error(s):\n" + "\n".join(f"- {p}" for p in errors))
    return config


def presets() -> dict[str, dict]:
    """Every preset in configs/, by name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(CONFIG_DIR.glob("*.json"))}


def for_engine(config: dict, micro_batch: int, grad_accum: int = 1, world_size: int = 1, lr: float = 3e-4,
               grad_clip: float = 1.0, precision: str | None = None) -> dict:
    """A Trainer-style config with its "auto" values filled with numbers, for deepspeed.initialize."""
    filled = json.loads(json.dumps(config))
    numbers = {"train_batch_size": micro_batch * grad_accum * world_size, "train_micro_batch_size_per_gpu": micro_batch,
               "gradient_accumulation_steps": grad_accum, "gradient_clipping": grad_clip}
    for key, value in numbers.items():
        if filled.get(key) == "auto":
            filled[key] = value
    params = filled.get("optimizer", {}).get("params", {})
    for key, value in {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}.items():
        if params.get(key) == "auto":
            params[key] = value
    for section in ("fp16", "bf16"):
        if filled.get(section, {}).get("enabled") == "auto":
            filled[section]["enabled"] = (precision or kit_env.describe().precision) == section
    return filled


def t4_profile(environment: kit_env.Environment) -> kit_env.Environment:
    """This environment as a free Colab T4 would report it (capability 7.5, fp16, the T4's GPU cap,
    Colab's RAM less the VM's own use and a typical kernel's, a fresh runtime's free disk)."""
    import dataclasses

    t4 = kit_env.EMULATIONS["t4"]
    return dataclasses.replace(environment, gpu_name=environment.gpu_name or "Tesla T4 (profile)", gpu_count=1,
                               capability=t4.capability, native_bf16=False, precision="fp16",
                               vram_total_bytes=t4.gpu_cap_bytes, ram_budget_bytes=t4.ram_budget_bytes,
                               notebook_ram_bytes=t4.notebook_ram_bytes,
                               kernel_rss_bytes=t4.kernel_rss_bytes, emulation=t4,
                               disk_free_bytes=t4.disk_free_bytes)


# ---- the stage and offload rows, and ZeRO-Infinity's config --------------------------------------

def lesson_row_configs(micro_batch: int, precision: str,
                       offload_dir: str | os.PathLike = "offload") -> dict[str, dict]:
    """Notebook 05's row configs, label: engine config, built by its lesson cell's own functions
    (:func:`taught.stage0_config`, :func:`taught.zero_rows`, :func:`taught.row_config`): what its
    matrix and ``python -m helpers matrix`` run."""
    base = taught.stage0_config(micro_batch, precision)
    return {label: taught.row_config(base, zero)
            for label, zero in taught.zero_rows(str(offload_dir)).items()}


def row_choice(zero: dict) -> dict:
    """The :func:`build` arguments a ``zero_optimization`` block asks for, as :data:`STAGE_ROWS`
    writes them: its stage, and the device of each offload that is not ``"none"``."""
    choice = {"stage": int(zero.get("stage", 0))}
    for key in ("offload_optimizer", "offload_param"):
        device = (zero.get(key) or {}).get("device", "none")
        if device != "none":
            choice[key] = device
    return choice


#: Notebook 05's rows as :func:`build` arguments, read from its lesson cell's ``zero_rows`` (their
#: stage and offload devices; :func:`for_row` adds the kit's tuning): the rows notebook 03's sizing
#: table, the ZeRO picture of notebook 04, the memory grid and the calibration tool predict.
STAGE_ROWS: list[tuple[str, dict]] = [(label, row_choice(zero))
                                      for label, zero in taught.zero_rows("offload").items()]


def overlaid(base: dict, over: dict) -> dict:
    """A copy of ``base`` with every key of ``over`` set on it: nested blocks merged key by key,
    ``over``'s value kept wherever both set one (a learner's config over the kit's tuning)."""
    out = json.loads(json.dumps(base))
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = overlaid(out[key], value) if both else json.loads(json.dumps(value))
    return out


#: How many optimizer sub-groups the stage rows cut the model into: a quarter of it (notebook 06's
#: ZeRO-Infinity function, ``taught.zero_infinity_config``, takes a 32nd by the same rule, where a
#: sub-group's fp32 weights, gradients and moments pass through host RAM together).
ROW_SUB_GROUPS = 4


def sub_group_size(n_params: int, groups: int) -> int:
    """The optimizer's sub-group size, in elements: 1/``groups`` of the model, at least 1e6 and at
    most 1e8. A parameter is never split: the embedding, one parameter, stays a group of its own."""
    return int(min(100_000_000, max(1_000_000, n_params // groups)))


def for_row(choice: dict, model: memory.ModelInfo, environment: kit_env.Environment | None,
            micro_batch: int, world_size: int = 1, **overrides) -> dict:
    """The engine config one stage row runs (and is predicted) with: the row's stage and
    offload, NVMe buffers that hold the model's largest parameter, optimizer sub-groups of a quarter
    of the model (:func:`sub_group_size`), fp16's short-run loss scale. Notebooks 03 and 05, the ZeRO
    picture and the calibration tool all build their rows here, so a prediction and a run always
    describe the same config."""
    settings = dict(micro_batch=micro_batch, world_size=world_size, trainer=False, environment=environment,
                    largest_param_numel=model.largest_param_numel,
                    sub_group_size=sub_group_size(model.n_params, ROW_SUB_GROUPS),
                    initial_scale_power=SHORT_RUN_SCALE_POWER)
    return build(**choice, **{**settings, **overrides})


def tuned_row(written: dict, model: memory.ModelInfo, environment: kit_env.Environment | None,
              micro_batch: int, world_size: int = 1) -> dict:
    """The config a row of notebook 05 runs with: ``written`` (a learner's engine config) as it is,
    over the kit's tuning for its stage and offload (:func:`for_row`), which fills only the keys it
    leaves unset. Where ``written`` sets its micro batch or accumulation but no train_batch_size,
    the total follows them on ``world_size`` ranks, as DeepSpeed's would."""
    choice = row_choice(written.get("zero_optimization", {}))
    ds = overlaid(for_row(choice, model, environment, micro_batch, world_size), written)
    if ({"train_micro_batch_size_per_gpu", "gradient_accumulation_steps"} & set(written)
            and "train_batch_size" not in written):
        micro, accumulation = ds["train_micro_batch_size_per_gpu"], ds.get("gradient_accumulation_steps", 1)
        ds["train_batch_size"] = (micro * accumulation * world_size
                                  if isinstance(micro, int) and isinstance(accumulation, int) else "auto")
    return ds


#: The width whose GPT-3 rate a short run keeps as it is (GPT-2 small's); wider ones scale down.
REFERENCE_WIDTH = 768


def short_run_schedule(model: memory.ModelInfo, steps: int) -> dict:
    """A short run's learning rate (notebook 06's ladder), warmed up over the whole run from a tenth
    of its peak.

    The peak is GPT-3's rate for the model's size (:func:`learning_rate_for`) times
    (REFERENCE_WIDTH / hidden)**2 for models wider than GPT-2 small. GPT-3's rates assume batches
    of 0.5-1M tokens and thousands of warmup steps; the ladder takes 5 steps of 2,048 tokens, where
    Adam's first steps move every weight by about the rate. Measured at 1.5B (T4 emulation): a step
    at 2e-5 took the loss from 11.17 to 7.11, one at about 9e-5 raised it from 7.05 to 8.49. The
    scaled peaks are 1.7e-4 at 355M, 4.6e-5 at 1.5B and 1.8e-5 at 2.7B; 124M keeps 1e-3."""
    width = min(1.0, REFERENCE_WIDTH / model.hidden) ** 2
    return {"lr": learning_rate_for(model.n_params) * width, "warmup_steps": max(1, steps),
            "initial_scale_power": SHORT_RUN_SCALE_POWER}


def zero_infinity(model: memory.ModelInfo, environment: kit_env.Environment, micro_batch: int,
                  nvme_path: str | os.PathLike, steps: int = 10, world_size: int = 1,
                  offload_param: str = "nvme", frozen_embeddings: bool = False) -> dict:
    """Notebook 06's ZeRO-Infinity config (its lesson function, :func:`taught.zero_infinity_config`)
    for a model the kit knows by its :class:`~helpers.memory.ModelInfo`: the optimizer on NVMe, and
    the weights too (``offload_param="nvme"``) or kept on the GPU (``"none"``), in the machine's
    precision, with :func:`short_run_schedule`'s learning rate, and page-locked buffers only where
    the RAM budget is roomy (``PIN_MEMORY_MIN_RAM``). With ``frozen_embeddings`` (the input
    embedding does not train) the optimizer's sub-groups close at the largest tensor that
    trains, as the lesson's fine-tune sizes them."""
    if offload_param not in ("nvme", "none"):
        raise ConfigError(f"offload_param must be nvme or none, not {offload_param!r}")
    schedule = short_run_schedule(model, steps)
    return taught.zero_infinity_config(
        model.n_params, model.largest_param_numel, micro_batch, 1, schedule["lr"],
        schedule["warmup_steps"], environment.precision, offload="nvme",
        offload_params=offload_param == "nvme", nvme_path=nvme_path,
        pin_memory=environment.ram_budget_bytes >= PIN_MEMORY_MIN_RAM, world_size=world_size,
        largest_trained=memory.without_embedding(model).largest_param_numel if frozen_embeddings else None)
