"""Check a DeepSpeed config before any engine starts: every value DeepSpeed would reject, named at
its key with the fix, and the settings it would silently ignore, as warnings.

:func:`check` asks DeepSpeed itself what a config may hold: it runs DeepSpeedConfig's section readers
on a dict that notes each key they look up (the known keys and their defaults), validates each
section with the pydantic model DeepSpeed builds from it (types, ranges, choices), applies DeepSpeed's
own batch-size rules, and finally lets DeepSpeedConfig parse what is left. On top of that come the
constraints DeepSpeed enforces only in code (:func:`_rules`, each citing where DeepSpeed fails), the
combinations it refuses at ``deepspeed.initialize``, the settings it silently ignores in the chosen
stage (warnings), top-level typos (``"fp_16"``, which DeepSpeed drops silently) and the hardware.
Each problem names the key path, says what happens, and gives the fix.
"""

from __future__ import annotations

import collections.abc
import contextlib
import copy
import difflib
import enum
import functools
import json
import logging
import math
import re
import types
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from helpers import env as kit_env


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


# ---- what DeepSpeed reads, asked of DeepSpeed itself ----------------------------------------------------
#
# DeepSpeedConfig._initialize_params reads the config through small reader functions: some hand a section to a
# pydantic model (DeepSpeedZeroConfig, DeepSpeedFP16Config, ...), others look keys up one by one with a default
# (get_aio_config, DeepSpeedFlopsProfilerConfig, ...). Running those readers on a dict that notes every lookup
# tells which keys DeepSpeed reads, with their defaults, and a probe key that a model refuses names the model that
# validates each section. Nothing here is a hand-written list of keys, except the reads the probe cannot see:

_PROBE = "__kit_probe__"
_NO_DEFAULT = object()  # a key DeepSpeed only tests for ("key in section") or indexes without a default

#: Reads the probe cannot see: outside DeepSpeedConfig._initialize_params, or only when another key is set.
_READ_ELSEWHERE: dict[str, dict] = {
    "": {"sequence_parallel_size": 1,   # deepspeed/__init__.py initialize() and DeepSpeedConfig.__init__
         "data_parallel_size": 1},      # deepspeed/__init__.py initialize(): builds the device mesh with it
    "optimizer": {"params": {}},        # runtime/config.py get_optimizer_params: read only when "type" is set
    "scheduler": {"params": {}},        # runtime/config.py get_scheduler_params: read only when "type" is set
    "pipeline": {"use_reentrant": True},  # runtime/pipe/engine.py PipelineEngine.__init__
}
#: Keys DeepSpeed renamed: it no longer reads the old name and says nothing.
_RENAMED = {"aio.thread_count": "intra_op_parallelism"}  # runtime/swap_tensor/constants.py (AIO_INTRA_OP_PARALLELISM)


class _Reads(dict):
    """A dict that notes every key DeepSpeed's config readers look up in it, with the default they use."""

    def __init__(self, data=(), log: dict | None = None, path: str = ""):
        super().__init__(data)
        self.log = {} if log is None else log
        self.path = path

    def _note(self, key, default=_NO_DEFAULT) -> None:
        seen = self.log.setdefault(self.path, {})
        if key != _PROBE and (default is not _NO_DEFAULT or key not in seen):
            seen[key] = default

    def get(self, key, default=None):
        self._note(key, default)
        if not super().__contains__(key) and isinstance(default, dict):  # a sub-section: note the reads in it too
            return _Reads(default, self.log, f"{self.path}.{key}" if self.path else key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self._note(key)
        return super().__contains__(key)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def keys(self):
        return collections.abc.KeysView(self)  # "key in section.keys()" goes through __contains__


@contextlib.contextmanager
def _quiet():
    """Silence DeepSpeed's logger while the kit runs its readers (they warn about deprecated keys)."""
    from deepspeed.utils import logger

    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _deepspeed_warnings():
    """Collect what DeepSpeed's logger warns (a list of messages) instead of printing it."""
    from deepspeed.utils import logger

    said: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    level, handlers, propagate = logger.level, list(logger.handlers), logger.propagate
    collect = Collect(logging.WARNING)
    logger.handlers, logger.propagate = [collect], False
    logger.setLevel(logging.WARNING)
    try:
        yield said
    finally:
        logger.handlers, logger.propagate = handlers, propagate
        logger.setLevel(level)


def _read_with(data: dict) -> Exception | None:
    """Run DeepSpeedConfig's readers on ``data`` (no batch rules, no torch.distributed); their error, if any."""
    from deepspeed.runtime.config import DeepSpeedConfig

    reader = DeepSpeedConfig.__new__(DeepSpeedConfig)
    vars(reader).update(_param_dict=data, global_rank=0, world_size=1)  # what __init__ would set
    try:
        with _quiet():
            reader._initialize_params(data)
            reader._do_warning_check()
    except Exception as err:  # noqa: BLE001 - any failure is DeepSpeed refusing what it was given
        return err
    return None


def _model_in(err: Exception | None):
    """The DeepSpeed pydantic model whose validation raised ``err`` (read from the traceback), or None."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel
    from pydantic import ValidationError

    if not isinstance(err, ValidationError):
        return None
    found, tb = None, err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is DeepSpeedConfigModel.__init__.__code__:
            found = type(tb.tb_frame.f_locals.get("self"))
        tb = tb.tb_next
    return found


@dataclass(frozen=True)
class _Schema:
    """What DeepSpeed reads. Paths are dotted key paths ("zero_optimization.offload_optimizer")."""

    top: dict      # top-level key -> DeepSpeed's default (_NO_DEFAULT when it only tests for the key)
    readers: dict  # section read key by key -> {key: default}
    models: dict   # section validated by a pydantic model -> (model DeepSpeed builds, the section's path in it)
    removed: dict  # key DeepSpeed now refuses -> DeepSpeed's message


def _probe_section(path: str, readers: dict, models: dict) -> None:
    """Hand DeepSpeed's readers a dict at ``path``; note the model that refuses the probe key, or the keys read."""
    log: dict = {}
    data: dict = _Reads({_PROBE: True}, log, path)
    for key in reversed(path.split(".")):
        data = {key: data}
    err = _read_with(data)
    model = _model_in(err)
    if model is not None:
        loc = next((e["loc"] for e in err.errors() if e["loc"] and e["loc"][-1] == _PROBE), None)
        if loc is not None:
            models[path] = (model, tuple(loc[:-1]))
            return
    for where, keys in log.items():
        if (where == path or where.startswith(path + ".")) and keys:
            readers.setdefault(where, {}).update(keys)


@functools.lru_cache(maxsize=1)
def _schema() -> _Schema:
    """Ask DeepSpeed what it reads (cached: about a hundred runs of its readers, a fraction of a second)."""
    import deepspeed.runtime.config as ds_config

    log: dict = {}
    err = _read_with(_Reads({_PROBE: True}, log))
    top = dict(log.pop("", {}))
    if err is not None or "zero_optimization" not in top:  # DeepSpeed changed how it reads its config
        raise RuntimeError(f"cannot ask DeepSpeed which config keys it reads ({err!r}): is this DeepSpeed 0.19?")
    readers: dict = {where: keys for where, keys in log.items() if keys}
    models: dict = {}
    for key in top:
        _probe_section(key, readers, models)
    for section in [s for s in readers if "." not in s]:  # sub-sections read without a {} default
        for key, default in list(readers[section].items()):
            if (default is None or default is _NO_DEFAULT) and f"{section}.{key}" not in readers:
                _probe_section(f"{section}.{key}", readers, models)
    readers.setdefault("pipeline", {}).update(ds_config.get_pipeline_config({}))  # it copies the section whole
    for where, keys in _READ_ELSEWHERE.items():
        (top if not where else readers.setdefault(where, {})).update(keys)
    for path in models:
        readers.pop(path, None)
    removed = dict(getattr(ds_config, "_REMOVED_TOP_LEVEL_CONFIG_KEYS", {}))
    removed |= {f"zero_optimization.{k}": m for k, m in getattr(ds_config, "_REMOVED_ZERO_CONFIG_KEYS", {}).items()}
    return _Schema(top, readers, models, removed)


# ---- pydantic models: their fields, and what they allow -----------------------------------------------------


@functools.lru_cache(maxsize=None)
def _field_map(model) -> dict:
    """Each field of a pydantic model by name and by alias."""
    out = {}
    for name, info in model.model_fields.items():
        out[name] = info
        if info.alias:
            out[info.alias] = info
    return out


def _fields(model) -> set[str]:
    return set(_field_map(model))


def _unwrap(annotation) -> tuple[object, bool]:
    """``Optional[X]`` -> (X, True); anything else -> (annotation, False)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = tuple(a for a in args if a is not type(None))
        return (rest[0] if len(rest) == 1 else typing.Union[rest]), True
    return annotation, False


def _submodel(info):
    """The pydantic model a field holds (``offload_optimizer`` -> DeepSpeedZeroOffloadOptimizerConfig), or None."""
    from pydantic import BaseModel

    inner = _unwrap(info.annotation)[0] if info is not None else None
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _section_model(section: str):
    """The pydantic model that validates ``section`` (the monitor model's "tensorboard" field, ...)."""
    model, inside = _schema().models[section]
    for key in inside:
        model = _submodel(_field_map(model)[key])
    return model


def _walk(model, keys: list) -> tuple[object, object]:
    """Follow ``keys`` down nested models: (the model holding the last key, that key's field), or (None, None).
    List indices are skipped (the field is the list's)."""
    info = None
    keys = [k for k in keys if isinstance(k, str)]
    for i, key in enumerate(keys):
        info = _field_map(model).get(key) if model is not None else None
        if info is None or i == len(keys) - 1:
            return model, info
        model = _submodel(info)
    return model, info


def _field(path: str):
    """DeepSpeed's pydantic field for a key path, or None where no model declares it."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        section = ".".join(parts[:cut])
        if section in _schema().models:
            return _walk(_section_model(section), parts[cut:])[1]
    return None


def _bounds(info) -> str:
    """A field's declared bounds in words: ">= 0", "> 0", "between 0.0 and 1.0"."""
    limits = {k: getattr(m, k) for m in info.metadata for k in ("ge", "gt", "le", "lt") if hasattr(m, k)}
    low = next((f"{'>=' if k == 'ge' else '>'} {limits[k]}" for k in ("ge", "gt") if k in limits), "")
    high = next((f"{'<=' if k == 'le' else '<'} {limits[k]}" for k in ("le", "lt") if k in limits), "")
    if "ge" in limits and "le" in limits:
        return f"between {limits['ge']} and {limits['le']}"
    return " and ".join(b for b in (low, high) if b)


def _fix_for(info) -> str:
    """A concrete fix from a pydantic field's type and bounds: "Use a whole number >= 0."."""
    inner, nullable = _unwrap(info.annotation)
    null = ", or null" if nullable else ""
    choices = None
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        choices = list(dict.fromkeys(m.value for m in inner))
    elif typing.get_origin(inner) is typing.Literal:
        choices = list(typing.get_args(inner))
    if choices is not None:
        return f"Choose one of: {', '.join(str(c) for c in choices)}{null}."
    kinds = {bool: "true or false", int: "a whole number", float: "a number", str: "a string (in quotes)",
             Path: "a path (a string)", list: "a list", dict: "an object ({...})"}
    base = typing.get_origin(inner) or inner
    if base in (typing.Union, types.UnionType):
        text = " or ".join(kinds.get(a, getattr(a, "__name__", str(a))) for a in typing.get_args(inner))
    else:
        text = kinds.get(base) or ("an object ({...})" if _submodel(info) else f"a value of type {inner}")
    bounds = _bounds(info)
    return f"Use {text}{' ' + bounds if bounds else ''}{null}."


# ---- what DeepSpeed enforces in code, not in a model --------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    """What DeepSpeed accepts at a key that no pydantic model declares, and where it fails otherwise.

    ``parse``: DeepSpeedConfig itself raises (tests/test_config_check.py checks those against DeepSpeed); otherwise
    ``fails`` says where DeepSpeed fails (errors) or what it does instead (warnings).
    """

    kind: str                 # "int", "number", "bool", "str", "choice" or "names" (a list of strings)
    low: float | None = None  # the smallest value allowed
    above: bool = False       # ``low`` itself is refused too
    choices: tuple = ()
    fold: bool = False        # choices compared case-insensitively
    null: bool = False        # null allowed
    level: str = "error"
    fails: str = ""
    parse: bool = False
    infinite: bool = False    # float("inf") allowed too (the number never reached)
    exact: bool = False       # "int": only an int (C++ takes it); else a whole float (1e5) too

    def allows(self, value) -> bool:
        if value is None:
            return self.null
        if self.infinite and isinstance(value, float) and value == math.inf:
            return True
        if self.kind == "bool":
            return isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))
        if self.kind in ("int", "number"):
            # Python arithmetic runs a whole float as its int (global_steps % 1e5): JSON writers
            # and Python's 1e5 give one; only a value handed to C++ must be an int
            whole = isinstance(value, float) and value.is_integer() and not self.exact
            ok = (isinstance(value, int) or whole) if self.kind == "int" else isinstance(value, (int, float))
            if not ok or isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
                return False
            return self.low is None or (value > self.low if self.above else value >= self.low)
        if self.kind == "str":
            return isinstance(value, str)
        if self.kind == "names" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return True
        fold = (lambda s: s.lower()) if self.fold else (lambda s: s)
        return isinstance(value, str) and fold(value) in {fold(c) for c in self.choices}

    def wanted(self) -> str:
        """What the key takes, in words: "a whole number >= 1", "one of: fp16, bf16, fp32"."""
        if self.kind in ("int", "number"):
            bound = f" {'>' if self.above else '>='} {self.low:g}" if self.low is not None else ""
            text = ("a whole number" if self.kind == "int" else "a number") + bound
            text += " written without a decimal point" if self.exact else ""
            text += " (or infinity)" if self.infinite else ""
        elif self.kind == "choice":
            text = "one of: " + ", ".join(self.choices)
        elif self.kind == "names":
            text = "a list of strings" + "".join(f' or "{c}"' for c in self.choices)
        else:
            text = {"bool": "true or false", "str": "a string (in quotes)"}[self.kind]
        return text + (", or null" if self.null else "")

    def fix(self) -> str:
        return f"Choose {self.wanted()}." if self.kind == "choice" else f"Use {self.wanted()}."


@functools.lru_cache(maxsize=1)
def _rules() -> dict[str, _Rule]:
    """Constraints DeepSpeed enforces in code but does not declare in a pydantic model, by key path.

    Choices are read from DeepSpeed's own constants; the bounds come from reading the code that fails (cited).
    """
    import deepspeed.runtime.config as rc
    import deepspeed.runtime.model_checkpointing.config as ckpt
    from deepspeed.runtime import constants
    from deepspeed.utils.logging import log_levels

    dtypes = tuple(v for member in rc.DtypeEnum for v in member._all_values if isinstance(v, str))
    batch = _Rule("int", 1, null=True, parse=True, fails="DeepSpeedConfig._batch_assertion asserts it is > 0")
    comm = _Rule("choice", choices=("fp16", "bf16", "fp32"), fold=True, null=True, parse=True,
                 fails="get_communication_data_type (runtime/config.py) raises ValueError")
    dtype = _Rule("choice", choices=dtypes, null=True,
                  fails="deepspeed.initialize resolves it with DtypeEnum (engine.py), which raises ValueError")
    aio_int = _Rule("int", 1, exact=True,
                    fails="the NVMe swappers (of parameters and of optimizer states) hand it to the C++ "
                          "aio handle, which takes an int, or divide by it, when they start")
    aio_bool = _Rule("bool", fails="the C++ aio handle (ops/csrc/aio) takes a bool and refuses anything else")
    pipe_bool = _Rule("bool", level="warning", fails="with a PipelineModule, PipelineEngine asserts it is a bool")
    return {
        "train_batch_size": batch, "train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": batch,
        "steps_per_print": _Rule("int", 1, null=True, infinite=True,  # Accelerate's: never print
                                 fails="the engine computes global_steps % steps_per_print after "
                                       "every step (0 divides by zero)"),
        "gradient_clipping": _Rule("number", 0, fails="the engine compares it with 0.0 at every step; below 0, ZeRO "
                                                      "1-3 skip clipping but SuperOffload clips to a negative norm"),
        "gradient_predivide_factor": _Rule("number", 0, above=True, fails="the gradient all-reduce multiplies by "
                                                                          "1 / gradient_predivide_factor"),
        "communication_data_type": comm, "seq_parallel_communication_data_type": comm,
        "gradient_allreduce_op": _Rule("choice", choices=tuple(constants.GRADIENT_ALLREDUCE_OP_SUPPORTED), fold=True,
                                       parse=True, fails="get_gradient_allreduce_op raises ValueError"),
        "log_level": _Rule("choice", choices=tuple(log_levels), fold=True, null=True,
                           fails="deepspeed.initialize calls set_log_level_from_string, which raises ValueError"),
        "sequence_parallel_size": _Rule("int", 1, fails="deepspeed.initialize divides the world size by it"),
        "data_parallel_size": _Rule("int", 1, fails="deepspeed.initialize builds its device mesh from it"),
        "fp16.hysteresis": _Rule("int", 1, fails="with dynamic loss scaling the scaler (fp16/loss_scaler.py "
                                                 "update_scale) never lowers the scale after an overflow, and every "
                                                 "later step is skipped"),
        "fp16.initial_scale_power": _Rule("int", 0, level="warning",
                                          fails="DeepSpeed accepts it, but a loss scale 2^power below 1 shrinks fp16 "
                                                "gradients toward underflow instead of protecting them"),
        "checkpoint.tag_validation": _Rule("choice", choices=tuple(constants.CHECKPOINT_TAG_VALIDATION_MODES),
                                           fold=True, parse=True,
                                           fails="get_checkpoint_tag_validation_mode raises DeepSpeedConfigError"),
        "checkpoint.parallel_write.pipeline_stage": _Rule(
            "bool", parse=True, fails="get_checkpoint_parallel_write_pipeline raises DeepSpeedConfigError"),
        "checkpoint.writer.type": _Rule("choice", choices=tuple(ckpt.CHECKPOINT_WRITER_TYPES), fold=True, parse=True,
                                        fails="get_checkpoint_writer_config asserts it"),
        "checkpoint.writer.data_parallel": _Rule("choice", choices=tuple(ckpt.CHECKPOINT_DATA_PARALLEL_UNITS),
                                                 fold=True, null=True, parse=True,
                                                 fails="get_checkpoint_writer_config asserts it"),
        "data_types.grad_accum_dtype": dtype, "data_types.param_dtype": dtype, "data_types.buffer_dtype": dtype,
        "data_types.keep_in_fp32_modules": _Rule("names", choices=("auto",), parse=True,
                                                 fails="DeepSpeedConfig raises DeepSpeedConfigError"),
        "torch_autocast.dtype": _Rule("choice", choices=dtypes, parse=True,
                                      fails="get_torch_autocast_dtype raises ValueError"),
        "torch_autocast.lower_precision_safe_modules": _Rule(
            "names", parse=True, fails="get_lower_precision_safe_modules raises ValueError"),
        "aio.block_size": aio_int, "aio.queue_depth": aio_int, "aio.intra_op_parallelism": aio_int,
        "aio.single_submit": aio_bool, "aio.overlap_events": aio_bool,
        "pipeline.pipe_partitioned": pipe_bool, "pipeline.grad_partitioned": pipe_bool,
    }


#: Keys DeepSpeed reads without checking, whose whole-float value (3.0) fails where it is used;
#: elsewhere a whole float runs as its int (tests/test_config_check.py asks DeepSpeed, key by key).
_WHOLE_FLOAT_FAILS = {
    "flops_profiler.top_modules": "the flops profiler slices its list of modules with it, and a "
                                  "float slice raises TypeError when the profile prints",
    "flops_profiler.module_depth": "the flops profiler walks range(module_depth) when the profile "
                                   "prints (-1 means every depth), and range() of a float raises "
                                   "TypeError",
}


def _default_rule(default, path: str = "") -> _Rule | None:
    """For a key DeepSpeed reads without checking: its default's type, as a warning."""
    unchecked = f"DeepSpeed reads it without checking (its default is {default!r})"
    if path in _WHOLE_FLOAT_FAILS:
        return _Rule("int", level="warning", null=True, exact=True, fails=_WHOLE_FLOAT_FAILS[path])
    if isinstance(default, bool):
        return _Rule("bool", level="warning", fails="DeepSpeed only tests it for truth: any non-empty string, "
                                                    '"false" too, counts as true')
    if isinstance(default, (int, float)):
        return _Rule("int" if isinstance(default, int) else "number", level="warning", null=True, fails=unchecked)
    if isinstance(default, str) and default != "auto":  # "auto" defaults also take numbers (pipeline.stages)
        return _Rule("str", level="warning", null=True, fails=unchecked)
    return None


def _leaves(config: dict, parsed: dict) -> list[tuple[str, object, object]]:
    """(path, value, default) for each key DeepSpeed reads without a model (top level included), and for the rules
    inside model sections the value as the model parsed it (2.0 -> 2; skipped where the model refused the section)."""
    schema = _schema()
    out = [(k, v, schema.top[k]) for k, v in config.items() if k in schema.top and k not in schema.models]
    for section, keys in schema.readers.items():
        node = _get(config, section)
        if isinstance(node, dict):
            out += [(f"{section}.{k}", v, keys[k]) for k, v in node.items() if k in keys]
    for path in _rules():
        section, _, key = path.rpartition(".")
        if section in parsed and isinstance(_get(config, section), dict) and key in _get(config, section):
            out.append((path, _value_of(parsed[section], key), None))
    return [(p, v, d) for p, v, d in out if v is not _ABSENT and not (isinstance(v, dict) and _is_section(p))]


def _rule_problems(config: dict, parsed: dict, autos: list[str]) -> list[Problem]:
    """Values outside what DeepSpeed's code accepts, where no model checks them (rules, else the default's type)."""
    out = []
    aio_used = _aio_used(config)
    for path, value, default in _leaves(config, parsed):
        rule = _rules().get(path) or _default_rule(default, path)
        if rule is None or rule.allows(value) or not _applies(path, config, autos):
            continue
        level, why = rule.level, rule.fails
        if path.startswith("aio.") and not aio_used:
            level = "warning"
            why = f"nothing reads the aio section here (no NVMe offload, no checkpoint writer), but {why}"
        elif level == "error" and rule.parse and (err := _refusal(path, value, config)):
            # the failure DeepSpeed really raises for this value (False.upper() is no
            # DeepSpeedConfigError), not the one its code raises for most bad values
            why = (f"DeepSpeed refuses it as it reads the config: {type(err).__name__} "
                   f"({_one_line(err)})")
        elif level == "error":
            where = "DeepSpeed refuses it as it reads the config" if rule.parse else "DeepSpeed does not declare this"
            why = f"{where}; {why}"
        out.append(Problem(level, path, f"{json.dumps(value)} is not {rule.wanted()}: {why}.", rule.fix()))
    return out


def _refusal(path: str, value, config: dict) -> Exception | None:
    """The error DeepSpeedConfig raises for ``value`` at ``path`` (its readers on that key alone;
    for a batch size, its batch rules on the config's three), or None."""
    if path not in _BATCH:
        return _read_with(_nested(path, value))
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        with _quiet():
            DeepSpeedConfig({k: config[k] for k in _BATCH if k in config})
    except Exception as err:  # noqa: BLE001 - any failure is DeepSpeed refusing the value
        return err
    return None


def _nested(path: str, value) -> dict:
    """``{"a": {"b": value}}`` for the path "a.b"."""
    out: dict = {}
    node = out
    *sections, key = path.split(".")
    for section in sections:
        node = node.setdefault(section, {})
    node[key] = value
    return out


def _one_line(err: Exception, width: int = 160) -> str:
    """An exception's first line, whole words, at most ``width`` characters."""
    line = (str(err).strip().splitlines() or [""])[0]
    return line if len(line) <= width else line[:width].rsplit(" ", 1)[0] + " ..."


def _applies(path: str, config: dict, autos: list[str]) -> bool:
    """False where a rule does not apply to this config (hysteresis only matters with dynamic loss scaling)."""
    if path == "fp16.hysteresis":
        fp16 = config.get("fp16") if isinstance(config.get("fp16"), dict) else {}
        on = fp16.get("enabled") is True or "fp16.enabled" in autos
        return on and fp16.get("loss_scale", 0) == 0
    return True


def _aio_used(config: dict) -> bool:
    """True when DeepSpeed reads the aio section: NVMe offload, or the checkpoint writer (fast_checkpoint_engine)."""
    zero = config.get("zero_optimization") if isinstance(config.get("zero_optimization"), dict) else {}
    nvme = any(isinstance(zero.get(k), dict) and zero[k].get("device") == "nvme"
               for k in ("offload_optimizer", "offload_param"))
    return nvme or isinstance(_get(config, "checkpoint.writer"), dict)


# ---- key paths ----------------------------------------------------------------------------------------------

_ABSENT = object()


def _get(config: dict, path: str, default=_ABSENT):
    """The value at a dotted key path, or ``default``."""
    node = config
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def _without(config: dict, paths) -> dict:
    """A deep copy of ``config`` without the given key paths (list indices cut the path there)."""
    out = copy.deepcopy(config)
    for path in paths:
        keys = path.split("[")[0].split(".")
        parent = _get(out, ".".join(keys[:-1])) if len(keys) > 1 else out
        if isinstance(parent, dict):
            parent.pop(keys[-1], None)
    return out


def _join(path: str, keys) -> str:
    for key in keys:
        path = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
    return path


def _is_section(path: str) -> bool:
    """True where DeepSpeed expects an object: a section a model validates or a reader reads key by key."""
    return path in _schema().models or path in _schema().readers


def _value_of(obj, key: str):
    """A parsed model's value for ``key`` (a field name or its alias)."""
    for name, info in type(obj).model_fields.items():
        if key in (name, info.alias):
            return getattr(obj, name)
    return _ABSENT


def _spelling(key: str) -> str:
    """``key`` without case and separators: "FP16", "Fp-16" and "fp_16" all read "fp16"."""
    return re.sub(r"[-_\s]", "", key.lower())


def _swapped(a: str, b: str) -> bool:
    """``b`` is ``a`` with two neighbouring letters swapped ("iao" for "aio")."""
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return (len(a) == len(b) and len(diff) == 2 and diff[1] == diff[0] + 1
            and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])


def _closest(key: str, allowed) -> str | None:
    """The allowed key ``key`` is most likely a typo of, or None: the same key in another case or
    with other separators ("BF16", "zero-optimization") or two letters swapped, else the closest
    in lower case."""
    others = sorted(a for a in allowed if a != key)
    same = [a for a in others if _spelling(a) == _spelling(key) or _swapped(a, key)]
    if same:
        return same[0]
    lowered = {a.lower(): a for a in others}
    guess = difflib.get_close_matches(key.lower(), sorted(lowered), n=1, cutoff=0.75)
    return lowered[guess[0]] if guess else None


def _suggest(key: str, allowed) -> str:
    """ "did you mean 'fp16'?" for a likely typo of an allowed key, else "". """
    guess = _closest(key, allowed)
    return f"did you mean '{guess}'?" if guess else ""


def known_keys() -> dict[str, set[str]]:
    """Allowed keys per section ("" is the top level), asked of DeepSpeed: the keys its readers look up and the
    fields (and aliases) of the pydantic models it validates sections with, nested sections included."""
    schema = _schema()
    out = {"": set(schema.top), **{path: set(keys) for path, keys in schema.readers.items()}}

    def add(path: str, model) -> None:
        out[path] = _fields(model)
        for key, info in _field_map(model).items():
            if _submodel(info) is not None:
                add(f"{path}.{key}", _submodel(info))

    for section in schema.models:
        add(section, _section_model(section))
    return out


# ---- "auto" ---------------------------------------------------------------------------------------------------


def _autos(value, path: str = "") -> list[str]:
    """Paths holding "auto" as a placeholder for the Hugging Face Trainer (not where "auto" is DeepSpeed's own)."""
    if value == "auto":
        return [] if _own_auto(path) else [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _autos(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _autos(v, f"{path}[{i}]")]
    return []


def _own_auto(path: str) -> bool:
    """True where "auto" is DeepSpeed's own default (pipeline.stages, zenflow's intervals, keep_in_fp32_modules)."""
    section, _, key = path.rpartition(".")
    if _schema().readers.get(section, {}).get(key) == "auto":
        return True
    info = _field(path)
    return info is not None and info.default == "auto"


#: Where the Hugging Face Trainer (transformers' HfTrainerDeepSpeedConfig) or Accelerate's
#: DeepSpeedPlugin and ``Accelerator.prepare`` put a value in place of "auto". Any other "auto"
#: stays in the config DeepSpeed gets.
FILLED_AUTOS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "gradient_clipping", "fp16.enabled", "bf16.enabled",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps",
    "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr",
    "scheduler.params.warmup_num_steps", "scheduler.params.total_num_steps",
    "zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold", "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.nvme_path",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
})
#: A key the Trainer fills only under its other spelling.
_FILLED_SPELLING = {
    "zero_optimization.prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "zero_optimization.param_persistence_threshold": "stage3_param_persistence_threshold",
}


def _split_autos(placeholders: list[str], for_trainer: bool) -> tuple[list[str], list[str]]:
    """(placeholders someone fills in, "auto" values DeepSpeed's models drop for their defaults).

    DeepSpeed's config models drop every "auto" before validating (config_utils.py,
    DeepSpeedConfigModel): in a section a model validates, an "auto" nobody fills becomes
    DeepSpeed's default. For the Trainer (and Accelerate) the paths of :data:`FILLED_AUTOS` are
    filled first."""
    dropped = [a for a in placeholders
               if _field(a) is not None and not (for_trainer and a in FILLED_AUTOS)]
    return [a for a in placeholders if a not in dropped], dropped


def _shown_default(path: str) -> str:
    """The default DeepSpeed's model uses at ``path``, as a message shows it (50,000,000)."""
    default = _field(path).get_default(call_default_factory=True)
    if isinstance(default, int) and not isinstance(default, bool):
        return f"{default:,}"
    return json.dumps(getattr(default, "value", default), default=str)


def _auto_problems(autos: list[str], dropped: list[str], for_trainer: bool) -> list[Problem]:
    """Errors for "auto" that reaches DeepSpeed as a string; warnings for "auto" that DeepSpeed
    drops, naming the default it uses instead."""
    out = []
    who = ("the Trainer and Accelerate fill only the keys they know, not this one" if for_trainer
           else "nothing fills it for deepspeed.initialize")
    for path in dropped:
        other = _FILLED_SPELLING.get(path) if for_trainer else None
        fix = (f"Spell it '{other}' (the key the Trainer fills), or write the value you want."
               if other else "Write the value you want, or remove the key to keep the default.")
        out.append(Problem("warning", path, f"'auto' here stays 'auto' ({who}): DeepSpeed drops it "
                           f"and uses its default, {_shown_default(path)}.", fix))
    if autos and not for_trainer:
        return [Problem("error", autos[0], f"'auto' in {len(autos)} place(s) "
                        f"({', '.join(autos[:4])}): only the Hugging Face Trainer fills 'auto' in.",
                        "Use numbers for deepspeed.initialize "
                        "(helpers.config.build(trainer=False)), or pass the config to "
                        "TrainingArguments(deepspeed=...).")] + out
    for path in [a for a in autos if a not in FILLED_AUTOS]:
        out.append(Problem("error", path, "neither the Trainer nor Accelerate fills 'auto' here: "
                           "DeepSpeed gets the string 'auto' where it needs a value.",
                           "Write the value you want."))
    return out


# ---- keys DeepSpeed does not read --------------------------------------------------------------------------------


def _key_problems(config: dict) -> list[Problem]:
    """Unknown, removed and renamed keys; sections that are not objects. Unknown keys inside model sections are
    left to the model (extra="forbid": errors); in sections read key by key they are warnings."""
    schema, known, out = _schema(), known_keys(), []
    for key, value in config.items():
        if key in schema.removed:
            out.append(Problem("error", key, f"DeepSpeed refuses '{key}': {schema.removed[key]}", f"Remove '{key}'."))
        elif key not in known[""]:
            out.append(_unknown(key, key, known[""], top=True, value=value))
        elif key == "zero_optimization" and isinstance(value, bool):
            out.append(Problem("warning", key, "a true/false zero_optimization is DeepSpeed's deprecated format: "
                               "true means stage 1 (read_zero_config_deprecated).",
                               'Write "zero_optimization": {"stage": 1} (or the stage you want).'))
        elif _is_section(key) and value is not None and not isinstance(value, dict):
            out.append(Problem("error", key, f"'{key}' must be an object, not {json.dumps(value)}: DeepSpeed reads "
                               "keys inside it.", f'Write "{key}": {{...}} with its keys, or remove it.'))
    for path in schema.readers:  # inside model sections the model reports unknown keys
        node = _get(config, path)
        for key in node if isinstance(node, dict) else ():
            sub = f"{path}.{key}"
            if sub in _RENAMED:
                out.append(Problem("warning", sub, f"DeepSpeed renamed '{key}' to '{_RENAMED[sub]}' and no longer "
                                   "reads the old name: this value is ignored.", f"Rename it '{_RENAMED[sub]}'."))
            elif key not in known[path]:
                out.append(_unknown(sub, key, known[path], top=False))
    zero = config.get("zero_optimization")
    for key in zero if isinstance(zero, dict) else ():
        if f"zero_optimization.{key}" in schema.removed:
            path = f"zero_optimization.{key}"
            out.append(Problem("error", path, f"DeepSpeed refuses it: {schema.removed[path]}", f"Remove '{path}'."))
    return out


#: Sections whose values DeepSpeed passes on as keyword arguments from "params" only.
_PARAMS_SECTIONS = ("optimizer", "scheduler")


def _home_of(path: str, key: str) -> tuple[str, bool] | None:
    """Where an unknown ``key`` at ``path`` belongs, when it is a known key one level off: (the
    section it goes in, "" for the top level, and False), inside "params" (``optimizer.lr``) or in
    another section (``overlap_comm`` at the top level); (the section, True) for the section its
    name starts (``csv`` for ``csv_monitor``); None when it is no known key."""
    parent = path.rpartition(".")[0]
    if parent in _PARAMS_SECTIONS:
        return f"{parent}.params", False
    known = known_keys()
    homes = sorted((section for section, keys in known.items() if key in keys and section != parent),
                   key=lambda section: (not section.startswith(f"{parent}."), section.count("."), section))
    if homes:
        return homes[0], False
    started = [k for k in known.get(parent, ()) if k.startswith(f"{key}_") and _is_section(_join(parent, [k]))]
    return (_join(parent, [started[0]]), True) if len(started) == 1 else None


def _misplaced(path: str, key: str, refused: bool = False) -> Problem | None:
    """An error for a known key in the wrong place: DeepSpeed ignores it there (``refused``: its
    model rejects it), so the setting meant is not applied; the fix says where it goes."""
    home = _home_of(path, key)
    if home is None:
        return None
    section, renamed = home
    does = "rejects it" if refused else "ignores it"
    if renamed:
        return Problem("error", path, f"unknown key '{key}': DeepSpeed {does}, and the section "
                       f"'{section}' is not applied.", f"Rename '{path}' to '{section}'.")
    into = f'"{section}"' if section else "the top level"
    return Problem("error", path, f"'{key}' is not read here: it belongs in {into}, and DeepSpeed "
                   f"{does} where it stands.", f"Move '{key}' into {into}.")


def _unknown(path: str, key: str, allowed, top: bool, value=None) -> Problem:
    """An unknown key: at the top level an error when it looks like a typo (DeepSpeed would drop the section
    silently), else a warning, as in sections DeepSpeed reads key by key (it ignores what it does not look up).

    No typo: a key starting with "_" (a comment, by JSON habit), or an object where the key it
    resembles takes a single value (another tool's section, such as ``sequence_parallel`` beside
    ``sequence_parallel_size``)."""
    hint, meant = _suggest(key, allowed), _closest(key, allowed)
    comment = key.startswith("_")
    if not comment and not hint and (misplaced := _misplaced(path, key)):
        return misplaced
    if top and meant and (comment or (isinstance(value, dict) and not _is_section(meant))):
        why = "a leading '_' marks a comment" if comment else f"'{meant}' takes a single value"
        return Problem("warning", path, f"unknown key '{key}': DeepSpeed ignores it (no typo of "
                       f"'{meant}': {why}).",
                       f"Nothing to do if another tool reads it; else remove '{path}'.")
    level = "error" if top and hint else "warning"
    where = "DeepSpeed ignores unknown keys silently" + (": the section you meant is not applied" if hint else "")
    return Problem(level, path, f"unknown key '{key}' ({where}).",
                   f"{hint or 'See DeepSpeed config docs for the allowed keys.'} Rename or remove '{path}'.")


# ---- sections DeepSpeed validates with pydantic models -----------------------------------------------------------


#: Model validators whose message names no key: (model, message) -> the keys it is about.
_VALIDATOR_KEYS = {  # zero/config.py offload_ratio_check
    ("DeepSpeedZeroConfig", "Partial offloading only supported for ZeRO Stage 3"): ["offload_optimizer", "ratio"]}


def _model_problems(config: dict) -> tuple[dict, list[Problem], list[Problem]]:
    """Validate each section with the model DeepSpeed uses for it, as DeepSpeed calls it.

    Returns (parsed models by section, problems, section-level problems the model could not pin to a key; those
    are kept only when nothing more precise explains them).
    """
    parsed, out, vague = {}, [], []
    for section, (model, inside) in _schema().models.items():
        value = _get(config, section)
        if not isinstance(value, dict):
            continue
        data = value
        for key in reversed(inside):
            data = {key: data}
        try:
            with _quiet():
                result = model(**data)
        except Exception as err:  # noqa: BLE001 - ValidationError, or an assertion in DeepSpeed's own checks
            for problem, exact in _explain_refusal(section, value, _section_model(section), inside, err):
                (out if exact else vague).append(problem)
            continue
        for key in inside:
            result = getattr(result, key)
        parsed[section] = result
    return parsed, out, vague


def _explain_refusal(section: str, value: dict, model, inside: tuple, err: Exception) -> list[tuple[Problem, bool]]:
    """Problems (each with whether it names the exact key) for a model's refusal of a section."""
    from pydantic import ValidationError

    if not isinstance(err, ValidationError):  # an assertion or TypeError in DeepSpeed's own checks
        keys = _named(str(err), model, value)
        return [(Problem("error", _join(section, keys), f"DeepSpeed refuses this: {err}",
                         "Change or remove the key the message names."), False)]
    out = []
    for e in err.errors():
        keys = _present(value, list(e["loc"])[len(inside):], model)
        path = _join(section, keys)
        if e["type"] == "extra_forbidden":
            owner = _walk(model, keys[:-1])[1] if keys[:-1] else None
            out.append((_forbidden(path, str(keys[-1]), _submodel(owner) if owner is not None else model), True))
            continue
        msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ").rstrip(".")
        validator = e["type"] in ("value_error", "assertion_error")
        node = _at(value, keys)
        exact = bool(keys)
        if validator and isinstance(node, dict):  # a model-level validator: find the key its message names
            owner = _submodel(_walk(model, keys)[1]) if keys else model
            named = _named(msg, owner, node) or _VALIDATOR_KEYS.get((getattr(owner, "__name__", ""), msg), [])
            named = named if _at(node, named) is not _ABSENT else []
            keys, node, exact = keys + named, _at(node, named), bool(named)
            path = _join(section, keys)
        info = _walk(model, keys)[1] if keys else None
        shown = f"DeepSpeed rejects {json.dumps(node, default=str)}" if node is not _ABSENT and not isinstance(
            node, dict) else "DeepSpeed rejects this"
        fix = (f"Follow DeepSpeed's rule: {msg}." if validator or info is None else _fix_for(info))
        out.append((Problem("error", path, f"{shown}: {msg}.", fix), exact))
    return out


def _forbidden(path: str, key: str, model) -> Problem:
    """A key a model (extra="forbid") refuses: unknown, or a second spelling of a field (name and alias both set)."""
    info = _field_map(model).get(key)
    if info is not None:
        other = info.alias if key != info.alias else _name_of(model, info)
        return Problem("error", path, f"'{key}' and '{other}' are the same setting, given twice: DeepSpeed reads "
                       f"'{info.alias}' and rejects the other.", f"Keep one of them (remove '{key}').")
    hint = _suggest(key, _fields(model))
    if not hint and (misplaced := _misplaced(path, key, refused=True)):
        return misplaced
    hint = hint or "See DeepSpeed's config docs for the allowed keys."
    return Problem("error", path, f"unknown key '{key}' (DeepSpeed rejects it).", f"{hint} Rename or remove '{path}'.")


def _at(value, keys: list):
    """The value under a list of keys and list indices, or _ABSENT."""
    for key in keys:
        ok = isinstance(value, dict) and key in value if isinstance(key, str) else (
            isinstance(value, list) and key < len(value))
        if not ok:
            return _ABSENT
        value = value[key]
    return value


def _present(value, loc: list, model) -> list:
    """The leading part of a pydantic error location that names keys present in ``value`` (spelled as the user
    spelled them: a field's name or its alias)."""
    keys, node = [], value
    for part in loc:
        if isinstance(node, list) and isinstance(part, int) and part < len(node):
            keys.append(part)
            node, model = node[part], None
            continue
        if not isinstance(node, dict):
            break
        info = _field_map(model).get(part) if model is not None else None
        spelled = next((k for k in (part, getattr(info, "alias", None), _name_of(model, info)) if k in node), None)
        if spelled is None:
            break
        keys.append(spelled)
        node, model = node[spelled], _submodel(info)
    return keys


def _name_of(model, info) -> str | None:
    return next((n for n, i in model.model_fields.items() if i is info), None) if model is not None else None


def _named(message: str, model, node) -> list[str]:
    """The key of ``node`` that a validator's message names first (a whole-word match), as a one-key list."""
    if model is None or not isinstance(node, dict):
        return []
    found = {m.start(): k for k in node if k in _field_map(model)
             for m in [re.search(rf"\b{re.escape(k)}\b", message)] if m}
    return [found[min(found)]] if found else []


# ---- batch sizes, by DeepSpeed's own rules -----------------------------------------------------------------

_BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _batch_problems(config: dict, for_trainer: bool, world_size: int | None) -> list[Problem]:
    """Run DeepSpeed's batch rules (DeepSpeedConfig._set_batch_related_parameters derives a missing size with
    whole-number division, then _batch_assertion checks total = micro x accumulation x data-parallel GPUs).

    ``world_size`` None: the fewest GPUs the config runs on (1, or sequence_parallel_size)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    sp = config.get("sequence_parallel_size", 1)
    sp = sp if _Rule("int", 1).allows(sp) else 1  # the value rules report a bad one
    if world_size is None:
        world_size = sp
    elif world_size % sp:  # deepspeed.initialize builds a (data x sequence parallel) device mesh
        return [Problem("error", "sequence_parallel_size", f"{world_size} GPU(s) cannot be split "
                        f"into groups of sequence_parallel_size {sp}: deepspeed.initialize builds "
                        "its device mesh from world size / sequence_parallel_size.",
                        f"Run on a multiple of {sp} GPUs, or set sequence_parallel_size to a "
                        f"divisor of {world_size}.")]
    given = {k: config.get(k) for k in _BATCH}
    if any(v == "auto" for v in given.values()) or (for_trainer and all(v is None for v in given.values())):
        return []  # the Trainer fills them from TrainingArguments
    if not all(v is None or _Rule("int", 1).allows(v) for v in given.values()):
        return []  # the value rules report these
    dp = world_size // sp  # as DeepSpeedConfig.__init__: world size / sequence_parallel_size
    sizes = SimpleNamespace(**given, world_size=dp)
    try:
        DeepSpeedConfig._set_batch_related_parameters(sizes)
        DeepSpeedConfig._batch_assertion(sizes)
        return []
    except AssertionError as err:
        if given["train_batch_size"] is None and given["train_micro_batch_size_per_gpu"] is None:
            return [Problem("error", "train_micro_batch_size_per_gpu", f"DeepSpeed needs a batch size: {err}.",
                            "Set train_micro_batch_size_per_gpu (and gradient_accumulation_steps).")]
        total, micro, accum = (getattr(sizes, k) for k in _BATCH)
        derived = [k for k in _BATCH if given[k] is None]
        note = f" (DeepSpeed derived {' and '.join(derived)} by whole-number division)" if derived else ""
        gpus = f"{dp:g} data-parallel GPU(s)"
        good = micro * max(accum, 1) * dp
        return [Problem("error", "train_batch_size",
                        f"train_batch_size is {total}, but micro batch {micro} x accumulation {accum} x {gpus} = "
                        f"{micro * accum * dp:g}{note}.",
                        f"Set train_batch_size to {good:g}, or drop it and let DeepSpeed derive it.")]


# ---- settings that cannot work together ----------------------------------------------------------------------


def _stage(config: dict, parsed: dict, autos: list[str]) -> int | None:
    """The ZeRO stage DeepSpeed will use, or None when unknown ("auto", or the section was refused)."""
    if "zero_optimization.stage" in autos or not isinstance(config.get("zero_optimization", {}), dict):
        return None
    zero = parsed.get("zero_optimization")
    return int(zero.stage) if zero is not None else None


def trained_precision(config: dict, autos: list[str]) -> str | None:
    """"fp16", "bf16" or "fp32" as DeepSpeed will train, or None while the Trainer decides ("auto")."""
    if "fp16.enabled" in autos or "bf16.enabled" in autos:
        return None
    bf16 = config.get("bf16", config.get("bfloat16"))
    return "fp16" if _enabled(config.get("fp16")) else "bf16" if _enabled(bf16) else "fp32"


def _enabled(section) -> bool:
    """True when a precision section is switched on for sure ("auto" is the Trainer's to decide)."""
    return isinstance(section, dict) and section.get("enabled") is True


def _combination_problems(config: dict, parsed: dict, autos: list[str]) -> list[Problem]:
    """Values each fine alone that DeepSpeed refuses together (at parse or at initialize), each cited."""
    out = []
    stage, precision = _stage(config, parsed, autos), trained_precision(config, autos)
    zero = parsed.get("zero_optimization")
    if _enabled(config.get("fp16")) and _enabled(config.get("bf16")):  # runtime/config.py _initialize_params
        out.append(Problem("error", "bf16.enabled", "fp16 and bf16 are both enabled.",
                           "Enable one: bf16 on capability >= 8.0, fp16 on older GPUs such as the T4."))
    op = str(config.get("gradient_allreduce_op", "mean")).lower()
    why = [w for w, on in (("ZeRO stage 3", stage == 3), ("ZenFlow", zero is not None and zero.zenflow is not None),
                           ("DeepCompile", _get(config, "compile.deepcompile") is True)) if on]
    if op == "sum" and why:  # runtime/config.py _do_error_check
        out.append(Problem("error", "gradient_allreduce_op", f"gradient_allreduce_op 'sum' is not supported with "
                           f"{why[0]}: DeepSpeedConfig raises ValueError.", 'Use "mean" (the default).'))
    if zero is not None and stage is not None:
        out += _zero_combinations(config, zero, stage)
    out += _precision_combinations(config, stage, precision)
    if config.get("managed_gradient_accumulation") is False and stage is not None:  # engine.py __init__ asserts
        if zero is not None and zero.overlap_comm and stage < 2:
            out.append(Problem("error", "managed_gradient_accumulation", "managed_gradient_accumulation=false "
                               f"with overlap_comm needs ZeRO stage 2 or 3 (this is stage {stage}): deepspeed."
                               "initialize fails.", 'Set "overlap_comm": false, or remove managed_gradient_accumulation.'))
    return out


def _zero_combinations(config: dict, zero, stage: int) -> list[Problem]:
    """ZeRO settings DeepSpeed refuses in this stage or with these devices."""
    out = []
    offload = zero.offload_optimizer
    if offload is not None and offload.ratio < 1.0:
        if stage != 3:  # zero/config.py offload_ratio_check
            out.append(Problem("error", "zero_optimization.offload_optimizer.ratio", f"partial optimizer offload "
                               f"(ratio {offload.ratio}) needs ZeRO stage 3; DeepSpeed refuses it at stage {stage}.",
                               'Remove "ratio" (offload all of it), or use stage 3.'))
        elif offload.device == "nvme":  # zero/stage3.py: NVMe swapping ignores the GPU/CPU split (DeepSpeed issue 4872)
            out.append(Problem("error", "zero_optimization.offload_optimizer.ratio", "partial offload (ratio < 1) is "
                               "written for CPU offload: with NVMe, stage3.py swaps sub-groups the ratio meant to "
                               "keep on the GPU, and training fails (DeepSpeed issue 4872).",
                               'Remove "ratio" with NVMe, or offload to "cpu".'))
    if zero.legacy_stage1 and stage >= 1:  # engine.py _configure_zero_optimizer raises
        out.append(Problem("error", "zero_optimization.legacy_stage1", "legacy_stage1 was removed in DeepSpeed "
                           "0.5.9: deepspeed.initialize raises.", 'Remove "legacy_stage1".'))
    if stage in (1, 2) and zero.allgather_bucket_size % 2:  # zero/stage_1_and_2.py asserts a multiple of 2
        out.append(Problem("error", "zero_optimization.allgather_bucket_size", f"allgather_bucket_size "
                           f"{zero.allgather_bucket_size} is odd: the stage 1-2 optimizer asserts a multiple of 2 "
                           "(4-byte alignment) at initialize. DeepSpeed's model does not declare this.",
                           f"Use an even number, e.g. {zero.allgather_bucket_size + 1}."))
    if stage == 2 and zero.reduce_scatter:  # zero/stage_1_and_2.py asserts with reduce scatter
        factor = config.get("gradient_predivide_factor", 1.0)
        if isinstance(factor, (int, float)) and factor != 1.0:
            out.append(Problem("error", "gradient_predivide_factor", "gradient_predivide_factor != 1.0 is not "
                               "supported by ZeRO stage 2 with reduce_scatter: the optimizer asserts at initialize.",
                               'Remove gradient_predivide_factor, or set "reduce_scatter": false.'))
        if config.get("prescale_gradients") is True:
            out.append(Problem("error", "prescale_gradients", "prescale_gradients is not supported by ZeRO stage 2 "
                               "with reduce_scatter: the optimizer asserts at initialize.",
                               'Set "prescale_gradients": false, or "reduce_scatter": false.'))
    return out


def _precision_combinations(config: dict, stage: int | None, precision: str | None) -> list[Problem]:
    """Master-weight and data-type settings that need a ZeRO stage, an offload or a matching precision."""
    out, zero = [], config.get("zero_optimization") if isinstance(config.get("zero_optimization"), dict) else {}
    device = _get(zero, "offload_optimizer.device", "none")
    for key in ("fp16.fp16_master_weights_and_grads", "bf16.bf16_master_weights_and_grads"):
        if _get(config, key) is not True or stage is None:
            continue
        if stage == 0:  # runtime/config.py _do_error_check
            out.append(Problem("error", key, "master weights in 16 bits need ZeRO stage 1, 2 or 3.",
                               'Set a ZeRO stage >= 1, or remove it.'))
        elif stage == 3 and device == "nvme" and key.startswith("fp16"):  # measured, not read
            out.append(Problem("error", key, "fp16 master weights with the optimizer on NVMe stopped with "
                               "an AssertionError in the first optimizer step (DeepSpeed 0.19.8, a "
                               "Llama-3.2-3B-shaped run in T4 emulation, twice): only CPU offload runs it.",
                               'Use "offload_optimizer": {"device": "cpu"}, or remove it and keep NVMe.'))
        elif device not in (("cpu", "nvme") if stage == 3 else ("cpu",)) and not (
                key.startswith("bf16") and _get(config, "bf16.bf16_optimizer_states") is True):
            out.append(Problem("error", key, "16-bit master weights need the optimizer offloaded with "
                               "DeepSpeedCPUAdam (base_optimizer.py _configure_master_weights asserts); here it is "
                               f"on '{device}'.",
                               'Add "offload_optimizer": {"device": "cpu"} to zero_optimization, or remove it.'))
    if precision is not None:
        for key in ("grad_accum_dtype", "param_dtype"):
            wanted = _dtype_name(_get(config, f"data_types.{key}", None))
            if wanted is None or wanted == precision:
                continue
            if key == "param_dtype":  # engine.py _assert_valid_mixed_precision_config
                out.append(Problem("error", "data_types.param_dtype", f"param_dtype {wanted} conflicts with the "
                                   f"precision ({precision}): deepspeed.initialize asserts they match.",
                                   f'Use "{precision}", or remove param_dtype.'))
            elif stage == 0:  # engine.py _do_optimizer_sanity_check: no ZeRO, mixed dtypes
                out.append(Problem("error", "data_types.grad_accum_dtype", f"accumulating {precision} gradients in "
                                   f"{wanted} needs ZeRO (stage >= 1): without it deepspeed.initialize raises "
                                   "NotImplementedError.", "Use ZeRO stage 1 or more, or remove grad_accum_dtype."))
    return out


def _dtype_name(value) -> str | None:
    """"fp16", "bf16", "fp32" (or "int8") for a DtypeEnum spelling such as "bfloat16"; None if unset or unknown."""
    from deepspeed.runtime.config import DtypeEnum

    try:
        return DtypeEnum(value).name if value is not None else None
    except ValueError:
        return None


# ---- settings DeepSpeed accepts but ignores or reinterprets --------------------------------------------------


@functools.lru_cache(maxsize=1)
def _stage_keys() -> dict[str, tuple[str, ...]]:
    """ZeRO keys only some stages read, from engine.py _configure_zero_optimizer's argument lists: the stage 1-2
    optimizer (DeepSpeedZeroOptimizer) and the stage 3 ones (DeepSpeedZeroOptimizer_Stage3, DeepSpeedZeRoOffload).
    The stage3_* keys come from DeepSpeedZeroConfig's aliases."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    stage3 = [k for n, i in DeepSpeedZeroConfig.model_fields.items() for k in (n, i.alias or "")
              if (i.alias or n).startswith("stage3_")]
    stage3 += ["sub_group_size", "zero_hpz_partition_size", "zero_quantized_weights",
               "zero_quantized_nontrainable_weights"]
    stage12 = ("allgather_bucket_size", "round_robin_gradients", "use_multi_rank_bucket_allreduce",
               "parameter_alignment", "ignore_unused_parameters")
    zero_only = ("overlap_comm", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size")
    return {"stage3": tuple(k for k in stage3 if k), "stage12": stage12, "zero": zero_only}


def _ignored_problems(config: dict, parsed: dict, autos: list[str], for_trainer: bool) -> list[Problem]:
    """Warnings for settings DeepSpeed accepts but then ignores or reinterprets, saying what really happens."""
    out = []
    zero = config.get("zero_optimization") if isinstance(config.get("zero_optimization"), dict) else {}
    stage = _stage(config, parsed, autos)
    if stage is not None:
        out += _stage_warnings(zero, stage)
        if stage == 0 and config.get("zero_allow_untested_optimizer") is True:  # engine.py _do_optimizer_sanity_check
            out.append(Problem("warning", "zero_allow_untested_optimizer", "only read when ZeRO is on (stage >= 1): "
                               "ignored at stage 0.", "Remove it, or set a ZeRO stage."))
    out += _deprecated_warnings(zero)
    if _get(config, "fp16.auto_cast") is True and not _enabled(config.get("fp16")) and "fp16.enabled" not in autos:
        out.append(Problem("warning", "fp16.auto_cast", "fp16 is off, but DeepSpeed still casts float inputs to fp16 "
                           "(engine.py checks only auto_cast before _cast_inputs_half): they meet fp32/bf16 weights.",
                           'Set "auto_cast": false, or enable fp16.'))
    if isinstance(config.get("bf16"), dict) and "bfloat16" in config:  # precision_config.py get_bfloat16_config
        out.append(Problem("warning", "bfloat16", '"bfloat16" is the old name of "bf16": with both present, '
                           "DeepSpeed reads only bf16.", 'Remove "bfloat16" (keep its keys in "bf16").'))
    if for_trainer and isinstance(config.get("activation_checkpointing"), dict):
        out.append(Problem("warning", "activation_checkpointing", "the Hugging Face Trainer never calls "
                           "deepspeed.checkpointing.configure(): this section has no effect on its models.",
                           "Use TrainingArguments(activation_checkpointing=True) (gradient_checkpointing before "
                           "transformers 5) and remove the section."))
    if zero.get("allgather_partitions") is False:  # engine.py zero_allgather_partitions(): nothing calls it
        out.append(Problem("warning", "zero_optimization.allgather_partitions", "DeepSpeed no longer uses "
                           "allgather_partitions: it always all-gathers, false does not switch to broadcasts.",
                           'Remove "allgather_partitions".'))
    return out


def _stage_warnings(zero: dict, stage: int) -> list[Problem]:
    """ZeRO keys set to a non-default value in a stage that never reads them."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    keys, out = _stage_keys(), []
    for key, value in zero.items():
        info = _field_map(DeepSpeedZeroConfig).get(key)
        if info is None or key == "stage" or value == "auto" or value == info.default:
            continue
        path = f"zero_optimization.{key}"
        if stage == 0 and key == "offload_optimizer" and isinstance(value, dict) and value.get("device") != "none":
            out.append(Problem("warning", path, "ZeRO is off at stage 0, so nothing is offloaded, yet DeepSpeed "
                               "still builds its CPU optimizer (engine.py get_optimizer_configuration) for the "
                               "parameters wherever they are.", "Use stage 1 or more to offload, or remove it."))
        elif stage == 0 and key in keys["zero"] + keys["stage12"] + keys["stage3"]:
            out.append(Problem("warning", path, f"ZeRO is off at stage 0: DeepSpeed ignores {key}.",
                               "Remove it, or set a ZeRO stage that uses it."))
        elif stage in (1, 2) and key == "offload_optimizer" and isinstance(value, dict) and (
                value.get("device") == "nvme"):  # stage_1_and_2.py: any device but none is the CPU
            out.append(Problem("warning", f"{path}.device", f"ZeRO stage {stage} has no NVMe "
                               "offload: its optimizer treats any offload device as the CPU "
                               "(stage_1_and_2.py sets cpu_offload), so the optimizer states stay "
                               "in host RAM and nvme_path is never used.",
                               'Write "device": "cpu" (what runs), or use stage 3 for NVMe.'))
        elif stage in (1, 2) and key in keys["stage3"]:
            out.append(Problem("warning", path, f"{key} is read only by ZeRO stage 3: ignored at stage {stage}.",
                               'Remove it, or set "stage": 3.'))
        elif stage == 3 and key in keys["stage12"]:
            out.append(Problem("warning", path, f"{key} is read only by ZeRO stages 1-2: ignored at stage 3.",
                               "Remove it (stage 3 uses stage3_prefetch_bucket_size and reduce_bucket_size)."))
        elif stage == 3 and key == "elastic_checkpoint" and value:  # zero/config.py elastic_checkpoint_deprecated
            out.append(Problem("warning", path, "ZeRO-3 elastic checkpointing is no longer supported: DeepSpeed only "
                               "logs a warning.", "Remove it; use Universal Checkpointing to change the GPU count."))
    return out


def _deprecated_warnings(zero: dict) -> list[Problem]:
    """Deprecated ZeRO keys (declared so in DeepSpeedZeroConfig): what DeepSpeed does with each."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    out = []
    for key, value in zero.items():
        extra = getattr(_field_map(DeepSpeedZeroConfig).get(key), "json_schema_extra", None) or {}
        if not extra.get("deprecated"):
            continue
        new = extra.get("new_param", "")
        moves = new and extra.get("set_new_param", True)
        path = f"zero_optimization.{key}"
        if moves and new.split(".")[0] in zero:
            out.append(Problem("error", path, f"deprecated '{key}' and its replacement '{new}' are both set: "
                               "DeepSpeed asserts (config_utils.py _process_deprecated_field).", f"Remove '{key}'."))
            continue
        what = f"DeepSpeed moves its value to '{new}'" if moves else "DeepSpeed ignores it (it only logs a warning)"
        out.append(Problem("warning", path, f"'{key}' is deprecated: {what}.",
                           f"Use '{new}' instead." if new else f"Remove '{key}'."))
    return out


# ---- the optimizer and the scheduler DeepSpeed builds from the config ------------------------------------------


@functools.lru_cache(maxsize=1)
def _optimizer_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(DeepSpeed's optimizer names, matched case-insensitively; torch.optim class names, matched exactly): the two
    ways engine.py _configure_basic_optimizer finds the optimizer named by "type"."""
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    base = torch.optim.Optimizer
    torch_names = tuple(n for n, c in vars(torch.optim).items() if isinstance(c, type) and issubclass(c, base)
                        and c is not base)
    return tuple(DEEPSPEED_OPTIMIZERS), torch_names


@functools.lru_cache(maxsize=1)
def _scheduler_names() -> tuple[str, ...]:
    """Schedulers engine.py _scheduler_from_config accepts: DeepSpeed's lr_schedules, then torch's."""
    import torch
    from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES

    base = torch.optim.lr_scheduler.LRScheduler
    torch_names = [n for n, c in vars(torch.optim.lr_scheduler).items()
                   if isinstance(c, type) and issubclass(c, base) and c is not base and not n.startswith("_")]
    return tuple(VALID_LR_SCHEDULES) + tuple(torch_names)


def _optimizer_problems(config: dict, autos: list[str]) -> list[Problem]:
    """The optimizer DeepSpeed builds from "optimizer" (engine.py _configure_basic_optimizer) must exist and take
    the params; a torch.optim optimizer is built here on a dummy tensor to see whether it does."""
    section = config.get("optimizer")
    if not isinstance(section, dict):
        return []
    name, params = section.get("type"), section.get("params", {})
    if name is None:  # runtime/config.py get_optimizer_name
        return [Problem("warning", "optimizer", 'the optimizer section has no "type": DeepSpeed ignores it and '
                        "uses the optimizer your code passes.", 'Add "type": "AdamW", or remove the section.')]
    ours, theirs = _optimizer_names()
    if not isinstance(name, str) or (name.lower() not in ours and name not in theirs):
        hint = _suggest(str(name), ours + theirs)
        return [Problem("error", "optimizer.type", f"DeepSpeed knows no optimizer {json.dumps(name)}: "
                        "deepspeed.initialize fails (getattr(torch.optim, type)).",
                        f"{hint + ' ' if hint else ''}Choose one of: {', '.join(ours + theirs)}.")]
    if not isinstance(params, dict):
        return [Problem("error", "optimizer.params", "optimizer.params must be an object: DeepSpeed passes it as "
                        "keyword arguments.", 'Write "params": {"lr": 0.0003, ...}.')]
    if "max_grad_norm" in params:  # engine.py _configure_basic_optimizer raises ValueError
        return [Problem("error", "optimizer.params.max_grad_norm", "DeepSpeed refuses max_grad_norm as an optimizer "
                        "parameter: deepspeed.initialize raises ValueError.",
                        'Remove it and set "gradient_clipping" at the top level.')]
    out = [Problem("error", f"optimizer.params.{k}", f"{k} must be a number, not {json.dumps(params[k])}: the "
                   "optimizer fails at its first step.", "Use a number.") for k in ("lr", "eps", "weight_decay")
           if k in params and f"optimizer.params.{k}" not in autos and not _Rule("number").allows(params[k])]
    if name.lower() not in ours and not out and not any(a.startswith("optimizer.") for a in autos):
        out += _built("optimizer.params", lambda torch, p: getattr(torch.optim, name)([p], **params), params)
    if name.lower() in ours:
        out += _deepspeed_optimizer_problems(config, name.lower(), params)
    if name.lower() == "adamw" and params.get("adam_w_mode", True) is False:
        out.append(Problem("warning", "optimizer.params.adam_w_mode", '"type": "AdamW" builds AdamW '
                           "whatever adam_w_mode says (engine.py: effective_adam_w_mode = name == "
                           "'adamw' or adam_w_mode): weight decay stays decoupled, not Adam's L2.",
                           'For Adam with L2 weight decay write "type": "Adam" with "adam_w_mode": '
                           "false; else remove adam_w_mode."))
    return out + _untested_problems(config, name)


#: Keys engine.py pops from optimizer.params before it builds an Adam (get_optimizer_configuration).
_ADAM_POPPED = ("adam_w_mode", "torch_adam", "fp32_optimizer_states")


def _cpu_optimizer(config: dict) -> bool:
    """engine.py zero_use_cpu_optimizer: the optimizer is offloaded (to "cpu" or "nvme")."""
    zero = config.get("zero_optimization")
    device = _get(zero, "offload_optimizer.device", "none") if isinstance(zero, dict) else "none"
    return device in ("cpu", "nvme")


def _deepspeed_class(config: dict, name: str, params: dict):
    """(the class engine.py _configure_basic_optimizer builds for DeepSpeed's optimizer ``name``,
    the keyword arguments it adds, the parameters it passes on), or None where the kit does not
    follow it (mup's optimizers, Muon)."""
    import torch
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam, ZenFlowCPUAdam
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion

    cpu = _cpu_optimizer(config)
    if name in ("adam", "adamw"):
        rest = {k: v for k, v in params.items() if k not in _ADAM_POPPED}
        w_mode = name == "adamw" or params.get("adam_w_mode", True)
        if params.get("torch_adam"):
            rest.pop("foreach", None)
            return (torch.optim.AdamW if w_mode else torch.optim.Adam), {"foreach": None}, rest
        if cpu:
            zenflow = isinstance(_get(config, "zero_optimization.zenflow", None), dict)
            return (ZenFlowCPUAdam if zenflow else DeepSpeedCPUAdam), {"adamw_mode": w_mode}, rest
        return FusedAdam, {"adam_w_mode": w_mode}, rest
    table = {"adagrad": DeepSpeedCPUAdagrad if cpu else torch.optim.Adagrad, "lamb": FusedLamb,
             "lion": DeepSpeedCPULion if cpu else FusedLion}
    return (table[name], {}, dict(params)) if name in table else None


def _deepspeed_optimizer_problems(config: dict, name: str, params: dict) -> list[Problem]:
    """Parameters DeepSpeed's own optimizers refuse, found without building them (that compiles
    their ops): keyword arguments their __init__ does not take, the AMSGrad variant that
    FusedAdam, DeepSpeedCPUAdam and FusedLamb refuse, betas that are not a pair (they unpack
    two)."""
    import inspect

    from deepspeed.ops.adam import ZenFlowCPUAdam

    built = _deepspeed_class(config, name, params)
    if built is None:
        return []
    cls, extra, rest = built
    target = cls.__mro__[1] if cls is ZenFlowCPUAdam else cls  # it passes **kwargs on
    signature = inspect.signature(target.__init__)
    taken = [k for k in signature.parameters if k not in ("self", "params", "model_params")]
    builds = f"{cls.__name__}, the optimizer DeepSpeed builds for '{name}' here,"
    out = []
    for key in rest:
        path = f"optimizer.params.{key}"
        if key in extra:
            out.append(Problem("error", path, f"DeepSpeed passes {key} to {cls.__name__} itself, "
                               "so it arrives twice: deepspeed.initialize raises TypeError.",
                               f"Remove '{key}' (DeepSpeed sets it; adam_w_mode is the key it "
                               "reads)."))
        elif key not in taken:
            out.append(Problem("error", path, f"{builds} takes no '{key}': deepspeed.initialize "
                               "raises TypeError.",
                               f"Remove '{key}'; it takes {', '.join(taken)}."))
    if rest.get("amsgrad") and cls.__module__.startswith("deepspeed"):
        out.append(Problem("error", "optimizer.params.amsgrad", f"{builds} does not support the "
                           "AMSGrad variant: it raises RuntimeError.",
                           'Remove "amsgrad", or add "torch_adam": true to use torch\'s Adam.'))
    betas = rest.get("betas")
    pair = isinstance(betas, (list, tuple)) and len(betas) == 2
    if "betas" in rest and not (pair and all(_Rule("number").allows(b) for b in betas)):
        out.append(Problem("error", "optimizer.params.betas", f"betas {json.dumps(betas)} is not a "
                           f"pair of numbers: {cls.__name__} unpacks two at its first step and "
                           "fails.", 'Use "betas": [0.9, 0.999].'))
    return out


def _untested_problems(config: dict, name) -> list[Problem]:
    """ZeRO (stage >= 1) with an optimizer DeepSpeed has not tested with it (engine.py
    _do_optimizer_sanity_check asserts, unless zero_allow_untested_optimizer is true)."""
    import torch
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    zero = config.get("zero_optimization")
    stage = _stage_number(zero.get("stage", 0)) if isinstance(zero, dict) else int(zero is True)
    allowed = config.get("zero_allow_untested_optimizer") is True
    if not stage or allowed or not isinstance(name, str):
        return []
    if name.lower() in ("muon", "muadam", "muadamw", "musgd"):
        return []  # Muon joins DeepSpeed's list once imported; mup's are not followed here
    if name.lower() in _optimizer_names()[0]:
        built = _deepspeed_class(config, name.lower(), config["optimizer"].get("params") or {})
        cls = built[0] if built else None
    else:
        cls = getattr(torch.optim, name, None)
    if cls is None or cls in ZERO_SUPPORTED_OPTIMIZERS:
        return []
    return [Problem("error", "optimizer.type", f"ZeRO stage {stage} with {cls.__name__} (what "
                    f"DeepSpeed builds for {json.dumps(name)}), an optimizer DeepSpeed has not "
                    "tested with ZeRO: deepspeed.initialize asserts.",
                    'Add "zero_allow_untested_optimizer": true, or use Adam/AdamW.')]


def _stage_number(value) -> int | None:
    """A ZeRO stage as DeepSpeed's model reads it (3, "3", 3.0 -> 3), or None when it is none."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number == value or str(number) == str(value).strip() else None


def _scheduler_problems(config: dict, autos: list[str]) -> list[Problem]:
    """The scheduler DeepSpeed builds from "scheduler" (engine.py _scheduler_from_config) must exist, and accept
    the params: it is built here on a dummy optimizer, as DeepSpeed builds it (unless a value is "auto")."""
    section = config.get("scheduler")
    if not isinstance(section, dict):
        return []
    name = section.get("type")
    if name is None:  # runtime/config.py get_scheduler_name
        return [Problem("warning", "scheduler", 'the scheduler section has no "type": DeepSpeed ignores it.',
                        'Add "type": "WarmupLR", or remove the section.')]
    names = _scheduler_names()
    if name not in names:
        hint = _suggest(str(name), names)
        return [Problem("error", "scheduler.type", f"DeepSpeed knows no LR scheduler {json.dumps(name)}: "
                        "deepspeed.initialize asserts.", f"{hint + ' ' if hint else ''}Choose one of: "
                        f"{', '.join(names)}.")]
    if "params" not in section:  # engine.py: scheduler(optimizer, **None)
        return [Problem("error", "scheduler.params", "the scheduler has no params: DeepSpeed calls it with "
                        "**params and fails.", 'Add "params": {...} (at least {}).')]
    params = section["params"]
    if any(a.startswith("scheduler.") for a in autos) or not isinstance(params, dict):
        return [] if isinstance(params, dict) else [Problem("error", "scheduler.params", "scheduler.params must be "
                                                            "an object.", 'Write "params": {...}.')]

    def build(torch, param):
        from deepspeed.runtime import lr_schedules

        cls = getattr(lr_schedules, name, None) or getattr(torch.optim.lr_scheduler, name)
        return cls(torch.optim.SGD([param], lr=0.1), **params)

    return _built("scheduler.params", build, params)


def _built(path: str, make, params: dict) -> list[Problem]:
    """Build an optimizer or scheduler on a dummy tensor; its error, at the parameter it names, as a Problem."""
    import torch

    def at(message: str) -> str:  # the parameter a message names
        words = [a or b for a, b in re.findall(r"'(\w+)'|\b([a-z]\w*_\w+)\b", message)]
        words = [w for w in words if not w.startswith("_")]
        named = [w for w in words if w in params] or words
        return f"{path}.{named[0]}" if named else path

    try:
        with _deepspeed_warnings() as said, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make(torch, torch.zeros(1, requires_grad=True))
    except Exception as err:  # noqa: BLE001 - whatever DeepSpeed or torch raise when they build it
        return [Problem("error", at(str(err)),
                        f"building it as deepspeed.initialize does fails: {type(err).__name__}: {err}",
                        "Fix, add or remove the parameter the message names.")]
    # A value DeepSpeed reads without refusing it, but warns about (an unknown warmup_type runs
    # as "log"): it runs, not as written. Warnings that name no parameter given are its own.
    return [Problem("warning", at(message), f"DeepSpeed builds it but warns: {message.strip()}",
                    "Use a value DeepSpeed knows, as its warning says, or remove the parameter.")
            for message in said if any(re.search(rf"\b{re.escape(k)}\b", message) for k in params)]


# ---- DeepSpeedConfig itself, as the last word ----------------------------------------------------------------


def _parse_error(config: dict) -> Exception | None:
    """DeepSpeedConfig's own error for ``config``, or None (batch sizes made neutral: they are checked above)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    trial = {k: v for k, v in copy.deepcopy(config).items() if k != "train_batch_size"}
    trial.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
    try:
        with _quiet():
            DeepSpeedConfig(trial)
    except Exception as err:  # noqa: BLE001 - anything DeepSpeedConfig raises is a refusal
        return err
    return None


def _parse_problems(config: dict, found: list[Problem]) -> list[Problem]:
    """Whatever DeepSpeedConfig still refuses once the errors found so far are taken out, at the key whose removal
    makes it parse (found by taking keys out one at a time)."""
    trial = _without(config, [p.path for p in found if p.level == "error"])
    err = _parse_error(trial)
    if err is None:
        return []
    path = _culprit(trial)
    rule = _rules().get(path) or _default_rule(_schema().top.get(path))
    fix = rule.fix() if rule else f"Change or remove '{path}' as the message says." if path else "See the message."
    return [Problem("error", path or "(config)", f"DeepSpeedConfig refuses it: {type(err).__name__}: {err}", fix)]


def _culprit(root: dict, path: str = "") -> str:
    """The deepest key whose removal lets DeepSpeedConfig parse ``root``."""
    node = _get(root, path) if path else root
    for key in node if isinstance(node, dict) else ():
        sub = f"{path}.{key}" if path else key
        if _parse_error(_without(root, [sub])) is None:
            return _culprit(root, sub) if isinstance(node[key], dict) and node[key] else sub
    return path


# ---- the check ---------------------------------------------------------------------------------------------------


def check(config: dict, hardware: kit_env.Environment | None = None, model=None, for_trainer: bool = True,
          world_size: int | None = None) -> list[Problem]:
    """Every problem in ``config``, errors first: what DeepSpeed would refuse, and what it would ignore.

    Errors are what DeepSpeed rejects when it parses the config or at ``deepspeed.initialize`` / the first step:
    values its pydantic models refuse (each section validated with the model DeepSpeed uses for it), values its
    code refuses where no model declares them (:func:`_rules`: "DeepSpeed does not declare this; it fails at
    ..."), batch sizes that break DeepSpeed's own batch rules, combinations it refuses, unknown keys where DeepSpeed
    forbids them, and top-level typos that would silently drop a section. Whatever DeepSpeedConfig still refuses
    after that is reported too. Warnings are settings DeepSpeed accepts but ignores or reinterprets (a ZeRO key the
    chosen stage never reads, a deprecated key, an unknown key in a section it reads key by key).

    "auto" is accepted with ``for_trainer=True`` (the Hugging Face Trainer fills it) and reported otherwise.
    ``hardware`` (an Environment) enables the checks about this machine (bf16 capability, RAM for pinned memory,
    libaio and a writable nvme_path); ``model`` (a ModelInfo from helpers.memory) the NVMe buffer check.
    ``world_size`` is the number of GPUs (divided by sequence_parallel_size, as DeepSpeed does);
    None: the fewest the config runs on (one, or sequence_parallel_size GPUs).
    """
    if not isinstance(config, dict):
        return [Problem("error", "(config)", "a DeepSpeed config is a JSON object.", "Write {...} with its keys.")]
    placeholders = _autos(config)
    autos, dropped = _split_autos(placeholders, for_trainer)
    clean = _without(config, placeholders)
    problems = _auto_problems(autos, dropped, for_trainer) + _key_problems(clean)
    parsed, found, vague = _model_problems(clean)
    problems += found + _rule_problems(clean, parsed, autos) + _batch_problems(config, for_trainer, world_size)
    problems += _combination_problems(clean, parsed, autos) + _optimizer_problems(clean, autos)
    problems += _scheduler_problems(clean, autos) + _ignored_problems(clean, parsed, autos, for_trainer)
    problems += _machine_problems(config, hardware, model)
    problems += _parse_problems(clean, problems + vague)
    return _tidy(problems, vague)


def _tidy(problems: list[Problem], vague: list[Problem]) -> list[Problem]:
    """One problem per level and key (the first); no warning where the same key has an error; a section-level
    error a model could not pin to a key only when no error inside that section explains it; errors first."""
    errors = [p.path for p in problems if p.level == "error"]
    problems = problems + [v for v in vague if not any(e.startswith(v.path + ".") for e in errors)]
    first: dict = {}
    for p in problems:
        first.setdefault((p.level, p.path), p)
    kept = [p for p in first.values() if not (p.level == "warning" and ("error", p.path) in first)]
    return [p for p in kept if p.level == "error"] + [p for p in kept if p.level != "error"]


def _machine_problems(config: dict, hardware: kit_env.Environment | None, model) -> list[Problem]:
    """What depends on this machine or this model: parameter offload below stage 3 (kept an error: the kit's
    form refuses it), NVMe paths and libaio, bf16 support, pinned memory, NVMe buffer sizes."""
    out = []
    zero = config.get("zero_optimization") if isinstance(config.get("zero_optimization"), dict) else {}
    stage = _stage_number(zero.get("stage", 0))  # None: "auto", or a value the model refuses
    param = zero.get("offload_param") if isinstance(zero.get("offload_param"), dict) else {}
    if param.get("device", "none") not in ("none", "auto") and stage is not None and stage != 3:
        out.append(Problem("error", "zero_optimization.offload_param.device",
                           f"parameter offload needs ZeRO stage 3 (this config is stage {stage}): "
                           "DeepSpeed ignores it below 3.",
                           'Set "stage": 3, or offload only the optimizer ("offload_optimizer").'))
    for key in ("offload_optimizer", "offload_param"):
        section = zero.get(key) if isinstance(zero.get(key), dict) else {}
        below = stage is not None and stage < 3  # stages 0-2 never swap to NVMe (_stage_warnings)
        if section.get("device") == "nvme" and not below:
            out += _nvme_problems(key, section, hardware)
    if hardware is not None:
        out += _hardware_problems(config, zero, hardware)
    if model is not None and param.get("device") == "nvme":
        size = int(param.get("buffer_size", 100_000_000))
        if size < model.largest_param_numel:
            out.append(Problem("error", "zero_optimization.offload_param.buffer_size",
                               f"buffer_size {size:,} is smaller than the model's largest parameter "
                               f"({model.largest_param_numel:,} elements): DeepSpeed fails with "
                               "'Not enough buffers 0 for swapping 1'.",
                               f"Set buffer_size to at least {int(1.05 * model.largest_param_numel):,} "
                               "(build(largest_param_numel=...) does it)."))
    return out


def _nvme_problems(key: str, section: dict, hardware: kit_env.Environment | None) -> list[Problem]:
    path = section.get("nvme_path")
    if not path:  # the swappers join None with file names at initialize
        return [Problem("error", f"zero_optimization.{key}.nvme_path", "NVMe offload has no nvme_path.",
                        "Set nvme_path to a folder on a fast local disk (e.g. /content/offload on Colab).")]
    out = []
    if hardware is not None and not _writable(path):  # only about this machine: a config may be for another
        out.append(Problem("error", f"zero_optimization.{key}.nvme_path", f"nvme_path {path!r} cannot be created or "
                           "written.", "Point it at a writable folder on a local disk."))
    if hardware is not None and not _libaio():
        out.append(Problem("error", f"zero_optimization.{key}.device",
                           "NVMe offload needs DeepSpeed's async_io op, and libaio is missing here.",
                           "apt-get install -y libaio-dev (notebook 02 explains), or offload to cpu."))
    return out


def _hardware_problems(config: dict, zero: dict, hardware: kit_env.Environment) -> list[Problem]:
    out = []
    if _enabled(config.get("bf16")) and not kit_env.native_bf16(hardware.capability):
        where = f"capability {hardware.capability[0]}.{hardware.capability[1]}" if hardware.capability else "the CPU"
        out.append(Problem("error", "bf16.enabled", f"bf16 on {where}: no native bf16 (it needs 8.0, an Ampere "
                           "GPU or newer); a T4 would emulate it slowly or fail.",
                           'Use "fp16": {"enabled": true} and remove bf16 (build(precision="fp16")).'))
    # pin_memory defaults to true since DeepSpeed 0.19.5: an offload section without the key is pinned.
    pinned = [k for k in ("offload_optimizer", "offload_param") if isinstance(zero.get(k), dict)
              and zero[k].get("device", "none") != "none" and zero[k].get("pin_memory", True)]
    if pinned and hardware.ram_budget_bytes < PIN_MEMORY_MIN_RAM:
        out.append(Problem("warning", f"zero_optimization.{pinned[0]}.pin_memory",
                           f"pinned (page-locked) host memory with only {hardware.ram_budget_bytes / kit_env.GB:.1f} "
                           "GB of RAM: pinned pages cannot be swapped, and Colab kills the kernel when RAM runs out.",
                           'Set "pin_memory": false (slower transfers, safer).'))
    return out


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


    return kit_env.libaio_available()
