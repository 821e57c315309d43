"""DeepSpeed configs: build from plain choices, check with DeepSpeed's own classes plus what they
miss, explain in words, save and load.

DeepSpeed's pydantic models reject unknown keys inside ``zero_optimization`` but let top-level
typos (``"fp_16"``) pass silently, never check that batch sizes agree, and know nothing about the
hardware. :func:`check` covers those, with the key path, a message a newcomer understands, and the
fix.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from helpers import env as kit_env
from helpers.tables import Table

CONFIG_DIR = kit_env.REPO_ROOT / "configs"
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
PRECISIONS = ("auto", "fp16", "bf16", "fp32")
#: pin_memory speeds offload transfers but locks host RAM: only with this much RAM or more.
PIN_MEMORY_MIN_RAM = 24 * kit_env.GB


class ConfigError(ValueError):
    """A config with errors; the message lists each with its fix."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


@dataclass
class Problem:
    """One thing wrong (error) or risky (warning) in a config."""

    level: str
    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.level} at {self.path}: {self.message} Fix: {self.fix}"


def build(stage: int = 2, offload_optimizer: str = "none", offload_param: str = "none", precision: str = "auto",
          micro_batch: int = 4, grad_accum: int = 1, world_size: int = 1, grad_clip: float = 1.0,
          optimizer: str = "AdamW", lr: float = 3e-4, weight_decay: float = 0.0, trainer: bool = True,
          nvme_path: str | os.PathLike | None = None, overlap_comm: bool | None = None,
          contiguous_gradients: bool = True, reduce_bucket_size: int = 50_000_000,
          allgather_bucket_size: int = 50_000_000, prefetch_bucket_size: int = 20_000_000,
          param_persistence_threshold: int = 100_000, max_live_parameters: int = 100_000_000,
          max_reuse_distance: int | None = None, sub_group_size: int = 100_000_000,
          pin_memory: bool | None = None, largest_param_numel: int | None = None, warmup_steps: int = 10,
          environment: kit_env.Environment | None = None) -> dict:
    """A DeepSpeed config from plain choices.

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
        config["fp16"] = {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
        config["bf16"] = {"enabled": "auto"}
    elif precision == "fp16":  # an explicit choice stays explicit, in Trainer mode too
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
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
                         "overlap_events": True, "thread_count": 2}
    config["zero_optimization"] = zero
    return config


# ---- known keys, from DeepSpeed's own config classes ----------------------------------------------------


def _fields(model) -> set[str]:
    keys = set()
    for name, info in model.model_fields.items():
        keys.add(name)
        if info.alias:
            keys.add(info.alias)
    return keys


def known_keys() -> dict[str, set[str]]:
    """Allowed keys per section, read from DeepSpeed's pydantic models and constants."""
    import deepspeed.runtime.constants as constants
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                       DeepSpeedZeroOffloadParamConfig)

    top = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z0-9_]+", v)}
    top |= {"zero_optimization", "fp16", "bf16", "aio", "activation_checkpointing", "flops_profiler", "tensorboard",
            "wandb", "csv_monitor", "comms_logger", "compression_training", "data_efficiency", "checkpoint",
            "autotuning", "elasticity", "nebula", "amp", "torch_autocast", "monitor_config", "pipeline"}
    return {
        "": top,
        "zero_optimization": _fields(DeepSpeedZeroConfig),
        "zero_optimization.offload_optimizer": _fields(DeepSpeedZeroOffloadOptimizerConfig),
        "zero_optimization.offload_param": _fields(DeepSpeedZeroOffloadParamConfig),
        "fp16": _fields(DeepSpeedFP16Config),
        "bf16": _fields(DeepSpeedBF16Config),
        "aio": {"block_size", "queue_depth", "thread_count", "intra_op_parallelism", "single_submit",
                "overlap_events", "use_gds"},
        "optimizer": {"type", "params"},
        "scheduler": {"type", "params"},
    }


def _unknown_keys(config: dict, known: dict[str, set[str]]) -> list[Problem]:
    out = []

    def visit(section: dict, prefix: str) -> None:
        allowed = known.get(prefix)
        if allowed is None:
            return
        for key, value in section.items():
            path = f"{prefix}.{key}" if prefix else key
            if key not in allowed:
                guess = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
                hint = f"did you mean '{guess[0]}'?" if guess else "see DeepSpeed's config docs for the allowed keys"
                where = "DeepSpeed ignores unknown top-level keys silently" if not prefix else "DeepSpeed rejects it"
                out.append(Problem("error", path, f"unknown key '{key}' ({where}).",
                                   f"{hint} Rename or remove '{path}'."))
            elif isinstance(value, dict):
                visit(value, path)

    visit(config, "")
    return out


def _autos(value, path: str = "") -> list[str]:
    if value == "auto":
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _autos(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _autos(v, f"{path}[{i}]")]
    return []


def _enabled(section) -> bool:
    """True when a precision section is switched on for sure ("auto" is the Trainer's to decide)."""
    return isinstance(section, dict) and section.get("enabled") is True


def check(config: dict, hardware: kit_env.Environment | None = None, model=None, for_trainer: bool = True,
          world_size: int = 1) -> list[Problem]:
    """Every problem in ``config``: DeepSpeed's own validation plus what it misses.

    ``hardware`` (an Environment) enables the hardware checks (bf16 capability, RAM for pinned
    memory); ``model`` (a ModelInfo from helpers.memory, or None) enables the NVMe buffer check.
    """
    from pydantic import ValidationError

    problems = _unknown_keys(config, known_keys())
    zero = config.get("zero_optimization", {}) or {}
    if isinstance(zero, dict):
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        clean = {k: v for k, v in zero.items() if not any(p.path == f"zero_optimization.{k}" for p in problems)}
        try:
            DeepSpeedZeroConfig(**clean)
        except ValidationError as err:
            for e in err.errors():
                path = "zero_optimization." + ".".join(str(x) for x in e["loc"])
                problems.append(Problem("error", path, f"DeepSpeed rejects this value: {e['msg']}.",
                                        "Use a value of the documented type."))
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    autos = _autos(config)
    if autos and not for_trainer:
        problems.append(Problem("error", autos[0], f"'auto' in {len(autos)} place(s) ({', '.join(autos[:4])}): only "
                                "the Hugging Face Trainer fills 'auto' in.",
                                "Use numbers for deepspeed.initialize (helpers.config.build(trainer=False)), "
                                "or pass the config to TrainingArguments(deepspeed=...)."))
    sizes = [config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")]
    if all(isinstance(s, int) for s in sizes):
        total, micro, accum = sizes
        if total != micro * accum * world_size:
            problems.append(Problem("error", "train_batch_size",
                                    f"train_batch_size is {total}, but micro batch {micro} x accumulation {accum} x "
                                    f"{world_size} GPU(s) = {micro * accum * world_size}.",
                                    f"Set train_batch_size to {micro * accum * world_size}, or drop it and let "
                                    "DeepSpeed derive it."))
    for key in ("offload_param",):
        device = (zero.get(key) or {}).get("device", "none") if isinstance(zero, dict) else "none"
        if device != "none" and stage != 3:
            problems.append(Problem("error", f"zero_optimization.{key}.device",
                                    f"parameter offload needs ZeRO stage 3 (this config is stage {stage}): "
                                    "DeepSpeed ignores it below 3.",
                                    'Set "stage": 3, or offload only the optimizer ("offload_optimizer").'))
    for key in ("offload_optimizer", "offload_param"):
        section = (zero.get(key) or {}) if isinstance(zero, dict) else {}
        if section.get("device") == "nvme":
            path = section.get("nvme_path")
            if not path:
                problems.append(Problem("error", f"zero_optimization.{key}.nvme_path", "NVMe offload has no nvme_path.",
                                        "Set nvme_path to a folder on a fast local disk (e.g. /content/offload on Colab)."))
            elif not _writable(path):
                problems.append(Problem("error", f"zero_optimization.{key}.nvme_path",
                                        f"nvme_path {path!r} cannot be created or written.",
                                        "Point it at a writable folder on a local disk."))
            if hardware is not None and not _libaio():
                problems.append(Problem("error", f"zero_optimization.{key}.device",
                                        "NVMe offload needs DeepSpeed's async_io op, and libaio is missing here.",
                                        "apt-get install -y libaio-dev (notebook 02 explains), or offload to cpu."))
    if _enabled(config.get("fp16")) and _enabled(config.get("bf16")):
        problems.append(Problem("error", "bf16.enabled", "fp16 and bf16 are both enabled.",
                                "Enable one: bf16 on capability >= 8.0, fp16 on older GPUs such as the T4."))
    if hardware is not None:
        bf16 = config.get("bf16", {})
        if _enabled(bf16) and not kit_env.native_bf16(hardware.capability):
            where = f"capability {hardware.capability[0]}.{hardware.capability[1]}" if hardware.capability else "the CPU"
            problems.append(Problem("error", "bf16.enabled", f"bf16 on {where}: no native bf16 (it needs 8.0, an Ampere "
                                    "GPU or newer); a T4 would emulate it slowly or fail.",
                                    'Use "fp16": {"enabled": true} and remove bf16 (build(precision="fp16")).'))
        pinned = [k for k in ("offload_optimizer", "offload_param") if (zero.get(k) or {}).get("pin_memory")]
        if pinned and hardware.ram_budget_bytes < PIN_MEMORY_MIN_RAM:
            problems.append(Problem("warning", f"zero_optimization.{pinned[0]}.pin_memory",
                                    f"pinned (page-locked) host memory with only {hardware.ram_budget_bytes / kit_env.GB:.1f} GB "
                                    "of RAM: pinned pages cannot be swapped, and Colab kills the kernel when RAM runs out.",
                                    'Set "pin_memory": false (slower transfers, safer).'))
    if model is not None:
        param = zero.get("offload_param") or {}
        if param.get("device") == "nvme":
            size = int(param.get("buffer_size", 100_000_000))
            if size < model.largest_param_numel:
                problems.append(Problem("error", "zero_optimization.offload_param.buffer_size",
                                        f"buffer_size {size:,} is smaller than the model's largest parameter "
                                        f"({model.largest_param_numel:,} elements): DeepSpeed fails with "
                                        "'Not enough buffers 0 for swapping 1'.",
                                        f"Set buffer_size to at least {int(1.05 * model.largest_param_numel):,} "
                                        "(build(largest_param_numel=...) does it)."))
    return problems


def _writable(path: str) -> bool:
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        probe = Path(path) / ".kit_write_probe"
        probe.write_text("ok")
        probe.unlink()
        return True
    except OSError:
        return False


def _libaio() -> bool:
    from helpers import doctor

    return doctor.libaio_available()


def problems_table(problems: list[Problem]) -> Table:
    rows = [(p.level, p.path, p.message, p.fix) for p in problems] or [("ok", "-", "no problems found", "-")]
    return Table(["level", "key", "problem", "fix"], rows, title="Config check")


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


# ---- the mistakes notebook 03 demonstrates ------------------------------------------------------------


@dataclass
class Mistake:
    """A broken config, the key where check() must report it, and what check() said."""

    name: str
    config: dict
    expected_path: str
    problems: list
    caught: bool


def t4_profile(environment: kit_env.Environment) -> kit_env.Environment:
    """This environment as a free Colab T4 would report it (capability 7.5, fp16, 12.7 GB of RAM)."""
    import dataclasses

    t4 = kit_env.EMULATIONS["t4"]
    return dataclasses.replace(environment, gpu_name=environment.gpu_name or "Tesla T4 (profile)", gpu_count=1,
                               capability=t4.capability, native_bf16=False, precision="fp16",
                               vram_total_bytes=t4.gpu_bytes, ram_budget_bytes=t4.ram_budget_bytes, emulation=t4)


def mistakes(base: dict, environment: kit_env.Environment) -> list[Mistake]:
    """Ten common mistakes applied to ``base`` (an engine-mode config), each checked."""
    from helpers import memory

    t4 = t4_profile(environment)
    xl = memory.ModelInfo.gpt2("gpt2-1.5b")

    def variant(change) -> dict:
        c = json.loads(json.dumps(base))
        change(c)
        return c

    micro = base["train_micro_batch_size_per_gpu"]
    cases = [
        ("typo at the top level", variant(lambda c: c.update(fp_16={"enabled": True})), "fp_16", {}),
        ("typo inside zero_optimization", variant(lambda c: c["zero_optimization"].update(overlap_com=True)),
         "zero_optimization.overlap_com", {}),
        ("batch sizes disagree", variant(lambda c: c.update(train_batch_size=micro * 2 + 1)), "train_batch_size", {}),
        ('"auto" without the Trainer', variant(lambda c: c.update(gradient_clipping="auto")), "gradient_clipping",
         {"for_trainer": False}),
        ("parameter offload below stage 3", variant(lambda c: c["zero_optimization"].update(
            stage=2, offload_param={"device": "cpu"})), "zero_optimization.offload_param.device", {}),
        ("bf16 on a T4", variant(lambda c: (c.pop("fp16", None), c.update(bf16={"enabled": True}))), "bf16.enabled",
         {"hardware": t4}),
        ("fp16 and bf16 both on", variant(lambda c: c.update(fp16={"enabled": True}, bf16={"enabled": True})),
         "bf16.enabled", {}),
        ("NVMe offload without a path", variant(lambda c: c["zero_optimization"].update(
            offload_optimizer={"device": "nvme"})), "zero_optimization.offload_optimizer.nvme_path", {}),
        ("NVMe buffers smaller than GPT-2 XL's largest tensor", variant(lambda c: c["zero_optimization"].update(
            stage=3, offload_param={"device": "nvme", "nvme_path": str(kit_env.default_offload_dir()),
                                    "buffer_size": 10_000_000, "buffer_count": 5})),
         "zero_optimization.offload_param.buffer_size", {"model": xl}),
        ("pinned memory with Colab's 12.7 GB", variant(lambda c: c["zero_optimization"].update(
            offload_optimizer={"device": "cpu", "pin_memory": True})),
         "zero_optimization.offload_optimizer.pin_memory", {"hardware": t4}),
    ]
    out = []
    for name, broken, path, kwargs in cases:
        found = check(broken, for_trainer=kwargs.pop("for_trainer", True), **kwargs)
        out.append(Mistake(name, broken, path, found, any(p.path == path for p in found)))
    return out


def mistakes_table(cases: list[Mistake]) -> Table:
    rows = []
    for m in cases:
        hit = next((p for p in m.problems if p.path == m.expected_path), None)
        rows.append((m.name, m.expected_path, "yes" if m.caught else "NO", hit.message if hit else "-",
                     hit.fix if hit else "-"))
    return Table(["mistake", "key", "caught", "what check() says", "fix"], rows, title="Mistakes, caught")
