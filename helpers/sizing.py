"""Any model's memory per ZeRO stage and offload, with the verdict for this machine, beside the
estimators people already use. The model is built on the meta device from its config alone: no
weights are downloaded or created.

    python -m helpers sizing --model gpt2-355m --micro-batch 4 --seq-len 512 --grad-ckpt
    python -m helpers sizing --model ./my-model-folder --micro-batch 8 --seq-len 1024 --emulate t4

``--model`` takes a kit shape (helpers.models.MODEL_SHAPES), a local folder with a config.json
(a ``save_pretrained`` folder), or a Hub name (its config.json only; offline, one line says so).
Only decoder-only causal LMs are sized; anything else, a broken config.json, a sequence past the
model's positions or more ranks on a host than it has GPUs ends in one line, exit status 2.
``--compare`` adds DeepSpeed's and Accelerate's own estimates beside the kit's.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from helpers import config, measurements, memory, models, show
from helpers import env as kit_env
from helpers.show import Table, MISSING, gib


class SizingError(ValueError):
    """A model that cannot be sized here, with what to do instead (one line)."""


@dataclass
class Sized:
    """One row of the matrix for one model: its config, estimate and verdicts."""

    label: str
    config: dict
    estimate: memory.Estimate
    verdicts: dict[str, memory.PlaceVerdict]
    #: what one host needs per place: the GPU's for one rank, host RAM and NVMe for its ranks
    needs: dict[str, int] = field(default_factory=dict)

    @property
    def overall(self) -> str:
        return memory.worst_verdict([v.word for v in self.verdicts.values()])


def resolve(name: str):
    """(ModelInfo, transformers config) for a kit shape, a local model folder or a Hub name; a
    SizingError (one line: what is wrong, and the fix) for anything that is not a causal LM."""
    if name in models.MODEL_SHAPES:
        hf = models.model_config(name)
        return memory.ModelInfo.from_config(hf, name=name), hf
    path = Path(name).expanduser()
    if path.is_dir():
        hf = _folder_config(path)
    elif path.exists():
        raise SizingError("a file, not a folder: give the folder that holds config.json")
    elif _looks_like_a_path(name):
        raise SizingError("no such folder: give a folder with config.json (a save_pretrained "
                          "folder), a kit shape or a Hub name")
    else:
        hf = _hub_config(name)
    refuse_non_causal(hf)
    if why := architecture_problem(hf.to_dict()):
        raise SizingError(why)
    if getattr(hf, "num_attention_heads", None) is None:
        kind = getattr(hf, "model_type", "this model")
        raise SizingError(f"{kind} has no attention heads (no num_attention_heads): the kit's "
                          "estimate counts a transformer's attention; it does not size state-space "
                          "models such as Mamba")
    try:
        info = memory.ModelInfo.from_config(hf, name=str(name))
    except Exception as err:  # noqa: BLE001 - whatever transformers raises building the model
        raise SizingError(f"transformers cannot build its causal LM ({type(err).__name__}: "
                          f"{_first_line(err)}): check config.json's architecture fields") from None
    return info, hf


def _first_line(err: Exception, width: int = 160) -> str:
    """The first line of ``err`` or of the error it was raised from (transformers wraps a config
    field's error in huggingface_hub's validation errors), cut at a whole word."""
    while err.__cause__ is not None:
        err = err.__cause__
    line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return show.clip(line, width)


#: Fields a causal LM's config.json needs as whole numbers >= 1 (where it has them).
_WHOLE_FIELDS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                 "num_key_value_heads", "n_embd", "n_head", "n_layer")


def architecture_problem(fields: Mapping) -> str | None:
    """What makes a config's architecture unbuildable, in one line with the fix (a field that is
    not a whole number >= 1, a hidden size its heads do not divide, key/value heads that do not
    divide the heads: each group of query heads shares one), or None."""
    for key in _WHOLE_FIELDS:
        value = fields.get(key)
        if key not in fields or (value is None and key == "num_key_value_heads"):  # null: one each
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return (f'its config.json has "{key}": {json.dumps(value)}, not a whole number >= 1: '
                    "fix that field")
    heads, hidden = fields.get("num_attention_heads"), fields.get("hidden_size")
    if heads and hidden and fields.get("head_dim") is None and hidden % heads:
        return (f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}: each head "
                "takes an equal share; fix one of them (or give head_dim)")
    kv = fields.get("num_key_value_heads")
    if heads and kv and heads % kv:
        return (f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}: each "
                "key/value head serves an equal group of query heads, so no model of this config "
                "runs; fix one of them")
    return None


def _custom_code(model_type: str, auto_map) -> str:
    """The refusal for a config that needs code transformers does not ship."""
    where = f" (auto_map: {next(iter(auto_map.values()))})" if isinstance(auto_map, dict) and auto_map else ""
    return (f"model_type {model_type!r} needs the model's own code{where}, which transformers "
            "does not ship: the sizer runs no code from a model's folder or the Hub "
            "(trust_remote_code); size a built-in architecture of the same shape instead (its "
            'config.json with "model_type": "llama", "qwen2", ...)')


def _looks_like_a_path(name: str) -> bool:
    """True for what can only be a folder (a Hub name is "owner/name"): absolute, ./ ../ ~, or
    more than one slash."""
    return Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1


def _folder_config(path: Path):
    """The transformers config in a model folder, its config.json read first so that a broken
    file is named as such."""
    from transformers import AutoConfig

    file = path / "config.json"
    if not file.is_file():
        raise SizingError("a folder without config.json: give a save_pretrained folder")
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        where = f"line {err.lineno}, column {err.colno}: {err.msg}" if isinstance(
            err, json.JSONDecodeError) else "not UTF-8 text"
        raise SizingError(f"its config.json is not valid JSON ({where}): fix the file, or write "
                          "it again with save_pretrained") from None
    if not isinstance(data, dict) or not data.get("model_type"):
        raise SizingError('its config.json has no "model_type": add the architecture\'s name '
                          '(e.g. "model_type": "llama"), as save_pretrained writes it')
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if data["model_type"] not in CONFIG_MAPPING_NAMES and data.get("auto_map"):
        raise SizingError(_custom_code(data["model_type"], data["auto_map"]))
    if why := architecture_problem(data):
        raise SizingError(why)
    try:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - whatever transformers raises reading the fields
        raise SizingError(f"transformers cannot read its config.json ({_first_line(err)}): check "
                          f"model_type {data['model_type']!r} and its fields") from None


def _hub_config(name: str):
    from transformers import AutoConfig

    if not models.hub_reachable():
        raise SizingError(
            "not a kit shape or a local folder, and the Hugging Face Hub cannot be "
            f"reached: give a kit shape ({', '.join(list(models.MODEL_SHAPES)[2:6])}, ...) or a "
            f"folder with config.json"
        )
    try:  # trust_remote_code=False: refused at once, never a hidden "run the custom code?" prompt
        return AutoConfig.from_pretrained(name, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - whatever transformers raises reading the fields
        if "custom code" in str(err) or "trust_remote_code" in str(err):
            raise SizingError(_custom_code(name, None)) from None
        if isinstance(err, OSError):
            raise SizingError(f"no config.json on the Hub ({_first_line(err)})") from None
        raise SizingError(f"transformers cannot read its config.json ({_first_line(err)}): "
                          "check its fields") from None


def refuse_non_causal(hf) -> None:
    """A SizingError for a model that is not a decoder-only causal LM: an encoder-decoder (T5), an
    encoder (BERT: transformers builds a causal head for it only with ``is_decoder``), or a
    model_type with no causal LM in transformers. The kit's estimate is a causal LM's."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = getattr(hf, "model_type", "") or "this model"
    fix = "the kit sizes decoder-only causal LMs (Llama, Qwen, Mistral, GPT-2, ...)"
    if getattr(hf, "is_encoder_decoder", False):
        raise SizingError(f"{kind} is an encoder-decoder model: {fix}; give one of those")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise SizingError(f"{kind} has no causal LM in transformers (AutoModelForCausalLM): {fix}")
    if kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(hf, "is_decoder", False):
        raise SizingError(f"{kind} is an encoder (a masked LM), not a causal LM: {fix}; to size "
                          'its causal head, set "is_decoder": true in config.json')


def seq_len_problem(info: memory.ModelInfo, seq_len: int) -> str | None:
    """Why ``seq_len`` is past the model's positions (with the fix), or None when it is not."""
    if info.max_positions and seq_len > info.max_positions:
        return (f"past the model's {info.max_positions:,} positions (max_position_embeddings in "
                f"its config): use --seq-len {info.max_positions} or less")
    return None


def ranks_on_host(environment: kit_env.Environment, world_size: int,
                  ranks_per_host: int | None = None) -> int:
    """How many of ``world_size`` ranks share one host's RAM and disk: as given, else one per GPU
    of this machine (a T4 profile has one), or all of them on a machine without a GPU."""
    if ranks_per_host:
        return ranks_per_host
    gpus = environment.gpu_count if environment.has_gpu else world_size
    return max(1, min(world_size, gpus))


def limits(environment: kit_env.Environment) -> dict[str, int | None]:
    """This machine's limits: GPU memory (None without a GPU), the RAM budget, the offload disk."""
    gpu = environment.vram_total_bytes if environment.has_gpu else None
    return {"gpu": gpu, "cpu": environment.ram_budget_bytes, "nvme": environment.disk_free_bytes}


#: The last rows of :func:`size`: how notebook 06 trains its biggest models (no host-built model),
#: everything on NVMe, or the optimizer only with the fp16 weights kept on the GPU (06's default).
ZERO_INIT_NVME = "stage 3 + NVMe offload under zero.Init"
ZERO_INIT_NVME_OPTIMIZER = "stage 3 + NVMe optimizer, weights on GPU, under zero.Init"


def size(
    info: memory.ModelInfo,
    environment: kit_env.Environment,
    micro_batch: int,
    seq_len: int,
    grad_ckpt: bool = True,
    world_size: int = 1,
    ranks_per_host: int | None = None,
    frozen_embeddings: bool = False,
    save_in_shards: bool = False,
) -> list[Sized]:
    """Every row of the stage and offload matrix for this model (built on the host, then
    partitioned), then ZeRO-3 + NVMe with the model built under ``deepspeed.zero.Init`` and
    notebook 06's sizing, the weights on NVMe too (:data:`ZERO_INIT_NVME`) or kept on the GPU
    (:data:`ZERO_INIT_NVME_OPTIMIZER`): config, estimate, verdicts. The GPU verdict is one rank's;
    host RAM and NVMe add up the ranks on one host (:func:`ranks_on_host`).
    ``frozen_embeddings``: every row with the input embedding (and a head tied to it) frozen, as
    notebook 06 trains a 3B model within free Colab's RAM (:func:`memory.estimate`).
    ``save_in_shards``: a save after training, in notebook 06's shards
    (:data:`memory.SAVE_SHARD_BYTES`), counted in host RAM where it is the peak."""
    ranks = ranks_on_host(environment, world_size, ranks_per_host)
    rows = [
        (label, config.for_row(choice, info, environment, micro_batch, world_size), False)
        for label, choice in config.STAGE_ROWS
    ]
    for label, offload_param in ((ZERO_INIT_NVME, "nvme"), (ZERO_INIT_NVME_OPTIMIZER, "none")):
        nvme = config.zero_infinity(info, environment, micro_batch, kit_env.default_offload_dir(),
                                    world_size=world_size, offload_param=offload_param,
                                    frozen_embeddings=frozen_embeddings)
        rows.append((label, nvme, True))
    out = []
    for label, ds, zero_init in rows:
        est = memory.estimate(
            info,
            ds,
            world_size=world_size,
            micro_batch=micro_batch,
            seq_len=seq_len,
            grad_ckpt=grad_ckpt,
            on_gpu=environment.has_gpu,
            zero_init=zero_init,
            frozen_embeddings=frozen_embeddings,
            save_shard_bytes=memory.SAVE_SHARD_BYTES if save_in_shards else 0,
        )
        needs = {p: est.total(p) * (1 if p == "gpu" else ranks) for p in memory.PLACES}
        out.append(Sized(label, ds, est, memory.verdicts(needs, limits(environment)), needs))
    return out


def size_table(
    info: memory.ModelInfo,
    environment: kit_env.Environment,
    micro_batch: int,
    seq_len: int,
    grad_ckpt: bool = True,
    world_size: int = 1,
    ranks_per_host: int | None = None,
    frozen_embeddings: bool = False,
    save_in_shards: bool = False,
) -> Table:
    """Predicted GPU / host / disk GiB per stage and offload, each place's verdict and when the GPU
    peaks: what ``python -m helpers sizing`` prints and notebook 03 shows. Host and NVMe figures
    are one host's (all its ranks); ``frozen_embeddings`` and ``save_in_shards`` as in :func:`size`."""
    rows = []
    ranks = ranks_on_host(environment, world_size, ranks_per_host)
    for s in size(info, environment, micro_batch, seq_len, grad_ckpt, world_size, ranks,
                  frozen_embeddings, save_in_shards):
        word = {p: v.word for p, v in s.verdicts.items()}
        est = s.estimate
        rows.append(
            (
                s.label,
                gib(est.total("gpu")) if environment.has_gpu else MISSING,
                gib(s.needs["cpu"]),
                gib(s.needs["nvme"]) if s.needs["nvme"] else MISSING,
                word.get("gpu", MISSING),
                word.get("cpu", MISSING),
                word.get("nvme", MISSING),
                s.overall,
                est.phase.get("gpu" if environment.has_gpu else "cpu", MISSING),
            )
        )
    lim = limits(environment)
    gpu = (
        f"GPU {lim['gpu'] / 2**30:.1f} GiB, " if lim["gpu"] else "no GPU (everything in host RAM), "
    )
    hosts = f", {ranks} per host" if world_size > 1 else ""
    trained = memory.without_embedding(info).n_params
    frozen = (f", the input embedding frozen ({trained / 1e6:,.0f}M of them train)"
              if frozen_embeddings else "")
    title = (
        f"{info.name}: {info.n_params / 1e6:,.0f}M parameters ({info.n_params:,}, as a model "
        f"card counts them){frozen} at {micro_batch} x {seq_len}"
        f"{', checkpointing' if grad_ckpt else ''}"
        f"{', then a save in shards' if save_in_shards else ''}, {world_size} rank(s){hosts}; {gpu}RAM budget "
        f"{lim['cpu'] / 1e9:.1f} GB; 'tight' = within {memory.VERDICT_MARGIN:.0%} of the limit"
    )
    return Table(
        [
            "config",
            "GPU GiB",
            "host GiB",
            "NVMe GiB",
            "GPU",
            "host RAM",
            "NVMe disk",
            "verdict",
            "peak at",
        ],
        rows,
        title=title,
    )


# ---- the estimators people use -------------------------------------------------------------------


def deepspeed_estimates(
    info: memory.ModelInfo, world_size: int = 1, ranks_per_host: int | None = None
) -> dict[str, tuple[int, int]]:
    """DeepSpeed's own model-state estimators (they return numbers; the ``_all_live`` variants only
    print), per matrix row they cover: {label: (gpu bytes per GPU, host bytes per node)}, called as
    DeepSpeed's ``_all_live`` variants call them: the largest layer is the most parameters one
    module holds itself (stage3.py model_to_params), the ranks are ``ranks_per_host`` GPUs on each
    of enough nodes. DeepSpeed has no stage 0, stage 1 or NVMe rows, counts no activations, and
    adds a 1.5x host buffer factor."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    p, layer = info.n_params, info.largest_module_numel
    per_node = ranks_per_host or world_size
    nodes = {"num_gpus_per_node": per_node, "num_nodes": math.ceil(world_size / per_node)}
    out = {}
    for label, offload in (("stage 2", False), ("stage 2 + CPU offload", True)):
        cpu, gpu = estimate_zero2_model_states_mem_needs(p, cpu_offload=offload, **nodes)
        out[label] = (int(gpu), int(cpu))
    for label, offload in (("stage 3", False), ("stage 3 + CPU offload", True)):
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            p, layer, cpu_offload=offload, cpu_offload_params=offload, zero_init=False, **nodes
        )
        out[label] = (int(gpu), int(cpu))
    return out


ACCELERATE_NOTE = (
    "Accelerate's `accelerate estimate-memory` asks the Hub for the model's metadata "
    "(create_empty_model -> verify_on_hub), so it cannot size a local folder or run offline; "
    "the figure here is its own arithmetic (calculate_maximum_sizes, estimate_training_usage) "
    "on the same meta-device model built in float32, as create_empty_model builds it: fp16 mixed "
    "precision, batch 1, no ZeRO."
)


def accelerate_estimate(hf_config) -> int:
    """Accelerate's "Training using Adam" figure for float16 on a model built from ``hf_config`` on
    the meta device (see :data:`ACCELERATE_NOTE`). The model is built in float32 whatever the
    config's ``torch_dtype``: Accelerate's formula takes fp32 weights (transformers 5 would build
    it in the config's dtype, halving the figure for a bf16 checkpoint)."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from transformers import AutoModelForCausalLM

    with init_empty_weights():  # on a copy: from_config writes the dtype into the config
        model = AutoModelForCausalLM.from_config(copy.deepcopy(hf_config), dtype=torch.float32)
    total, _ = calculate_maximum_sizes(model)
    return int(max(estimate_training_usage(total, "float16").values()))


def _measured(
    info: memory.ModelInfo,
    micro_batch: int,
    seq_len: int,
    grad_ckpt: bool,
    world_size: int,
    rows: list[dict],
) -> dict[str, dict]:
    return {
        r["row"]: r
        for r in rows
        if r["shape"] == info.name
        and r["micro_batch"] == micro_batch
        and r["seq_len"] == seq_len
        and bool(r["grad_ckpt"]) == grad_ckpt
        and r.get("world_size", 1) == world_size
    }


def side_by_side(
    info: memory.ModelInfo,
    hf_config,
    environment: kit_env.Environment,
    micro_batch: int,
    seq_len: int,
    grad_ckpt: bool = True,
    world_size: int = 1,
    rows: list[dict] | None = None,
    ranks_per_host: int | None = None,
) -> Table:
    """For the same model: the kit's prediction, DeepSpeed's estimators, Accelerate's figure and,
    where the stored measurements (helpers/memory_measurements.json) have this case, the
    measurement.
    GPU figures are for a GPU in the kit's precision (a T4 profile when this machine has none)."""
    gpu_env = environment if environment.has_gpu else config.t4_profile(environment)
    ranks = ranks_on_host(gpu_env, world_size, ranks_per_host)
    ds = deepspeed_estimates(info, world_size, ranks)
    acc = accelerate_estimate(hf_config)
    found = _measured(
        info,
        micro_batch,
        seq_len,
        grad_ckpt,
        world_size,
        measurements.load() if rows is None else rows,
    )
    out = []
    for s in size(info, gpu_env, micro_batch, seq_len, grad_ckpt, world_size, ranks):
        m = found.get(s.label, {})
        ds_gpu, ds_cpu = ds.get(s.label, (None, None))
        status = m.get("status", MISSING)
        out.append(
            (
                s.label,
                gib(s.estimate.total("gpu")),
                gib(ds_gpu),
                gib(acc) if s.label == "stage 0" else MISSING,
                gib(m.get("peak_gpu_allocated_bytes")) if status == "ok" else status,
                gib(s.needs["cpu"]),
                gib(ds_cpu),
                gib(m.get("peak_host_rss_bytes")) if not m.get("host_rss_all_ranks") else MISSING,
            )
        )
    return Table(
        [
            "config",
            "kit GPU GiB",
            "DeepSpeed GPU",
            "Accelerate GPU",
            "measured GPU",
            "kit host GiB",
            "DeepSpeed host",
            "measured host",
        ],
        out,
        title=f"{info.name} at {micro_batch} x {seq_len}{', checkpointing' if grad_ckpt else ''}: "
        "four answers to 'how much memory?'",
    )


def plot_side_by_side(table: Table):
    """Grouped bars of the GPU columns of :func:`side_by_side` (GiB; missing figures left out)."""
    import matplotlib.pyplot as plt

    columns = ["kit GPU GiB", "DeepSpeed GPU", "Accelerate GPU", "measured GPU"]
    idx = [table.header.index(c) for c in columns]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.2
    for k, (name, i) in enumerate(zip(columns, idx)):
        xs, ys = [], []
        for j, row in enumerate(table.rows):
            try:
                ys.append(float(row[i]))
                xs.append(j + (k - 1.5) * width)
            except ValueError:
                pass
        ax.bar(xs, ys, width, label=name.replace(" GiB", ""))
    ax.set_xticks(
        range(len(table.rows)), [r[0].replace(" + ", "\n+ ") for r in table.rows], fontsize=8
    )
    ax.set_ylabel("GiB")
    ax.axhline(15, color="grey", linestyle=":", linewidth=1)
    ax.set_title(table.title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---- the command line ----------------------------------------------------------------------------


def machine_for(emulate: str | None) -> kit_env.Environment:
    """This machine as the kit sees it; with ``emulate="t4"`` a T4's limits (on a GPU the cap is
    applied; without one, a T4 profile)."""
    if emulate:
        kit_env.emulate(emulate)
        machine = kit_env.describe()
        if not machine.has_gpu:
            return config.t4_profile(machine)
        # the emulated GPU's cap is applied; the disk is the emulated machine's, not this one's
        return dataclasses.replace(machine, disk_free_bytes=machine.emulation.disk_free_bytes)
    return kit_env.describe()


def verdict_line(machine: kit_env.Environment) -> str:
    """Which machine the verdicts are for, with its limits."""
    lim = limits(machine)
    gpu = f"{machine.gpu_name}, {lim['gpu'] / 2**30:.1f} GiB" if lim["gpu"] else "no GPU"
    emu = f" ({machine.emulation.label} emulation)" if machine.emulation else ""
    return (
        f"verdicts for: {gpu}{emu}; RAM budget {lim['cpu'] / 1e9:.1f} GB; "
        f"{lim['nvme'] / 1e9:,.0f} GB free for NVMe offload at {machine.offload_dir}"
    )


def ranks_problem(
    machine: kit_env.Environment, world_size: int, ranks_per_host: int | None
) -> str | None:
    """Why ``ranks_per_host`` cannot be (more than the world size, or than the host's GPUs, one
    rank each), with the fix; None when it can."""
    if ranks_per_host is None:
        return None
    if ranks_per_host > world_size:
        return f"more than --world-size {world_size}: use at most {world_size}"
    if machine.has_gpu and ranks_per_host > machine.gpu_count:
        hosts = math.ceil(world_size / machine.gpu_count)
        return (f"{machine.gpu_name} has {machine.gpu_count} GPU(s), one rank each: use at most "
                f"{machine.gpu_count} (--world-size {world_size} then runs on {hosts} hosts)")
    return None
