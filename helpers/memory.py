"""Memory: how many bytes a ZeRO setup needs on the GPU, in host RAM and on NVMe.

:func:`estimate` predicts every place and kind; :func:`cpu_offload_host_bytes` and
:func:`cpu_offload_max_params` answer the question notebook 01's verdict asks ("how large a
model can ZeRO-2 with CPU offload train in this much RAM?") with the same estimate, so the kit
has one host-RAM model, not two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from helpers import claims
from helpers.units import GiB


def cpu_offload_host_bytes(n_params: int, pin_memory: bool = False, on_gpu: bool = True) -> int:
    """Predicted peak host RSS of ZeRO-2 with CPU optimizer offload for ``n_params`` parameters.

    :func:`estimate`'s host total: process base, the fp32 model as first built, the fp32
    gradient partition, fp32 master weights and Adam's moments (about 20 bytes per parameter), plus
    2 more when offload buffers are pinned (DeepSpeed's default since 0.19.5).
    """
    ds = {"fp16": {"enabled": True},
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": pin_memory}}}
    return estimate(ModelInfo.from_count(n_params), ds, on_gpu=on_gpu).total("cpu")


def cpu_offload_max_params(ram_bytes: int, pin_memory: bool = False, on_gpu: bool = True) -> int:
    """The largest parameter count whose ZeRO-2 CPU-offload run fits in ``ram_bytes`` of host RAM."""
    low, high = (cpu_offload_host_bytes(n, pin_memory, on_gpu) for n in (10**9, 2 * 10**9))
    per_param = (high - low) / 10**9  # the host estimate is linear in the parameter count
    base = low - per_param * 10**9
    return max(0, int((ram_bytes - base) / per_param))


# ---- the estimator -------------------------------------------------------------------------------------

#: Bytes per element of half-precision weights/activations, and the fp32 extras of mixed precision.
HALF, FP32 = 2, 4
#: Activation bytes per token per hidden unit of one transformer layer in half precision, without
#: checkpointing (Korthikanti et al. 2022: 34 s b h, attention scores left out since PyTorch's SDPA
#: kernels do not store them). Checked against the GPU measurements in GPU_RUNS.md.
LAYER_ACT_BYTES_PER_TOKEN_HIDDEN = 34
#: Bytes per logit at the loss: fp16 logits, their fp32 upcast in the loss, and both gradients.
LOGIT_BYTES = HALF + FP32 + FP32 + HALF
#: Host RSS of a process that imported torch and DeepSpeed, before any model: CUDA context and
#: libraries on a GPU machine, libraries only on a CPU one.
HOST_BASE_GPU = int(2.1 * GiB)
HOST_BASE_CPU = int(0.45 * GiB)


@dataclass
class ModelInfo:
    """What the estimator needs to know about a model; from_config counts on the meta device.

    The fields after ``name`` describe Llama/Qwen-style blocks (SwiGLU width, grouped-query KV heads,
    tied embeddings); their defaults describe a GPT-2 block, so positional construction keeps working.
    """

    n_params: int
    largest_param_numel: int
    n_layer: int
    hidden: int
    heads: int
    vocab: int
    name: str = ""
    intermediate: int = 0  # MLP width (SwiGLU's gate/up width); 0: GPT-2's 4 x hidden
    kv_heads: int = 0  # key/value heads (fewer than ``heads``: grouped-query attention); 0: as many as heads
    tied: bool = True  # input embedding and output head share one matrix
    family: str = "gpt2"  # the transformers model_type: "gpt2", "llama", "qwen2", ...

    def __post_init__(self):
        self.intermediate = self.intermediate or 4 * self.hidden
        self.kv_heads = self.kv_heads or self.heads

    @classmethod
    def from_config(cls, config, name: str = "") -> "ModelInfo":
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        sizes = [p.numel() for p in model.parameters()]
        hidden, heads = config.hidden_size, config.num_attention_heads
        inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
        return cls(n_params=sum(sizes), largest_param_numel=max(sizes), n_layer=config.num_hidden_layers,
                   hidden=hidden, heads=heads, vocab=config.vocab_size, name=name, intermediate=inner,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   tied=bool(getattr(config, "tie_word_embeddings", True)),
                   family=getattr(config, "model_type", "") or "gpt2")

    @classmethod
    def for_shape(cls, shape: str, vocab_size: int | None = None) -> "ModelInfo":
        """Any shape of helpers.models.MODEL_SHAPES (GPT-2 or Llama/Qwen-style), counted on the meta device."""
        from helpers import models

        return cls.from_config(models.model_config(shape, vocab_size), name=shape)

    @classmethod
    def from_pretrained(cls, name_or_folder: str) -> "ModelInfo":
        """A Hub checkpoint or a local model folder, from its config alone (AutoConfig: config.json,
        offline for a folder), counted on the meta device: no weights are downloaded or loaded."""
        from transformers import AutoConfig

        return cls.from_config(AutoConfig.from_pretrained(name_or_folder), name=str(name_or_folder))

    @classmethod
    def from_count(cls, n_params: int, name: str = "") -> "ModelInfo":
        """A GPT-2-like shape for a bare parameter count (width from 12 h^2 per layer, 48 layers max)."""
        layers = 12 if n_params < 2e8 else 24 if n_params < 5e8 else 36 if n_params < 1e9 else 48
        hidden = int(((n_params - 50257 * 1024) / (12 * layers)) ** 0.5 // 64 * 64) or 64
        return cls(n_params, max(50257 * hidden, 4 * hidden * hidden), layers, hidden, max(1, hidden // 64), 50257, name)


@dataclass
class Estimate:
    """Predicted bytes per place (gpu, cpu, nvme) and kind (params, grads, optimizer, activations, buffers)."""

    parts: dict[str, dict[str, int]] = field(default_factory=dict)

    def total(self, place: str) -> int:
        return sum(self.parts.get(place, {}).values())

    def add(self, place: str, kind: str, nbytes: float) -> None:
        if nbytes:
            self.parts.setdefault(place, {}).setdefault(kind, 0)
            self.parts[place][kind] += int(nbytes)


def _zero(config: dict) -> dict:
    return config.get("zero_optimization", {}) or {}


def _half(config: dict) -> bool:
    return any((config.get(k) or {}).get("enabled") not in (False, None) for k in ("fp16", "bf16"))


def estimate(model: ModelInfo, config: dict, world_size: int = 1, micro_batch: int = 4, seq_len: int = 512,
             grad_ckpt: bool = True, on_gpu: bool = True, zero_init: bool = False) -> Estimate:
    """Predict the peak bytes a training step needs on the GPU, in host RAM and on NVMe. (Long on
    purpose: one term per consumer of memory, in the order a step allocates them.)

    Model states follow the ZeRO paper (mixed-precision Adam: 2 + 2 + 12 bytes per parameter,
    partitioned 12/N at stage 1, 14/N at stage 2, 16/N at stage 3), except that DeepSpeed's stage 1
    partitions gradients as stage 2 does (measured on 2 GPUs). Activations follow
    Korthikanti et al. (34 bytes per token per hidden unit and layer; with checkpointing, one
    layer's input per layer plus one layer recomputed) and the loss's logits. DeepSpeed's buffers
    come from the config's bucket sizes. The optimizer step of stages 0-2 adds temporaries the
    paper leaves out (fp32 gradient copies: the step peaks at 24 bytes per parameter at stage 0 and
    2 + (2 + 18)/N at stages 1-2, measured on GPT-2 124M and 355M with 1 and 2 GPUs, GPU_RUNS.md); the GPU figure is
    the larger of the backward and the step. Host RAM adds the process base and the fp32 model built
    before ``deepspeed.initialize`` (unless ``zero_init`` builds it partitioned).
    """
    zero = _zero(config)
    stage = int(zero.get("stage", 0))
    n = max(1, world_size)
    p = model.n_params
    half = _half(config)
    w = HALF if half else FP32  # bytes of a model weight / gradient element
    master = FP32 if (half or stage >= 1) else 0  # fp32 master copy (DeepSpeed keeps one from stage 1 on, fp32 too)
    opt_cfg, par_cfg = zero.get("offload_optimizer") or {}, (zero.get("offload_param") or {}) if stage == 3 else {}
    host_opt = {"cpu": "cpu", "nvme": "nvme"}.get(opt_cfg.get("device", "none"))
    host_par = {"cpu": "cpu", "nvme": "nvme"}.get(par_cfg.get("device", "none"))
    est = Estimate()
    dev = "gpu" if on_gpu else "cpu"

    # parameters (the training copy: fp16/bf16, or fp32 without mixed precision)
    params_share = p * w / (n if stage == 3 else 1)
    if host_par is None:
        est.add(dev, "params", params_share)
    else:
        est.add(host_par, "params", params_share)
        live = min(p, int(zero.get("stage3_max_live_parameters", 1e9)))
        est.add(dev, "params", min(live, 2 * model.largest_param_numel + int(zero.get("stage3_prefetch_bucket_size", 5e7))) * w)
        if host_par == "nvme":
            est.add("cpu", "buffers", int(par_cfg.get("buffer_count", 5)) * int(par_cfg.get("buffer_size", 1e8)) * w)
    # gradients
    if host_opt:
        est.add("cpu", "grads", p * FP32 / n)  # the fp32 gradient partition CPU Adam reads
    else:
        # DeepSpeed's stage 1 holds only its gradient partition at the peak, like stage 2 (the
        # paper's stage 1 keeps them whole): measured on 2 GPUs, stages 1 and 2 peaked alike.
        est.add(dev, "grads", p * w / (n if stage >= 1 else 1))
    # optimizer states: Adam's two fp32 moments plus the fp32 master weights
    opt = p * (8 + master) / (n if stage >= 1 else 1)
    est.add(host_opt or dev, "optimizer", opt)
    if host_opt == "nvme":
        est.add("cpu", "buffers", int(opt_cfg.get("buffer_count", 4)) * int(zero.get("sub_group_size", 1e9)) * FP32)
    # activations
    tokens = micro_batch * seq_len
    layer = LAYER_ACT_BYTES_PER_TOKEN_HIDDEN * tokens * model.hidden * (w / HALF)
    acts = (model.n_layer * tokens * model.hidden * w + layer) if grad_ckpt else model.n_layer * layer
    est.add(dev, "activations", acts + tokens * model.vocab * LOGIT_BYTES * (w / HALF))
    # DeepSpeed's buffers: gradient reduction and parameter gathering buckets
    if stage in (1, 2):
        est.add(dev, "buffers", int(zero.get("reduce_bucket_size", 5e8)) * w)
    elif stage == 3:
        est.add(dev, "buffers", (int(zero.get("reduce_bucket_size", 5e8)) + int(zero.get("stage3_prefetch_bucket_size", 5e7))) * w)
    # the optimizer step's temporaries (stages 0-2 without offload), when they outgrow the backward
    if not host_opt and stage <= 2 and half:
        # Stage 1 as stage 2: DeepSpeed's stage 1 reduce-scatters the gradients before the step,
        # so at the step it holds its partition only (2 GPUs: both measured at 4.03 GiB, 355M).
        step = 24 * p if stage == 0 else (2 * p + 2 * p / n + 18 * p / n + est.parts.get(dev, {}).get("buffers", 0))
        est.add(dev, "step temporaries", max(0, step - est.total(dev)))
    # host: process base and the model as first built (fp32, whole) before DeepSpeed takes it
    est.add("cpu", "process", HOST_BASE_GPU if on_gpu else HOST_BASE_CPU)
    if not (stage == 3 and zero_init):
        est.add("cpu", "model build", p * FP32)
    if host_opt and opt_cfg.get("pin_memory"):
        est.add("cpu", "buffers", p * HALF / n)  # pinned fp16 transfer buffer
    return est


def fits(est: Estimate, gpu_bytes: int | None, ram_bytes: int, disk_bytes: int | None = None) -> dict[str, bool]:
    """Whether each place's predicted total fits the given limits (None: no such device)."""
    out = {"cpu": est.total("cpu") <= ram_bytes}
    if gpu_bytes is not None:
        out["gpu"] = est.total("gpu") <= gpu_bytes
    if est.total("nvme"):
        out["nvme"] = disk_bytes is None or est.total("nvme") <= disk_bytes
    return out


def gpu_prediction_claim(label: str, predicted: int, measured: int | None, rtol: float = 0.15) -> tuple[str, bool]:
    """(claim, held): the predicted GPU peak is within ``rtol`` of the measured one (no measurement: not held)."""
    shown = "not measured" if measured is None else f"{measured / GiB:.2f} GiB"
    return (f"{label}: predicted GPU memory within {rtol:.0%} of measured ({predicted / GiB:.2f} GiB vs {shown})",
            claims.within(predicted, measured, rtol))


def compare(model: ModelInfo, config: dict, result, environment, micro_batch: int, seq_len: int,
            gpu_rtol: float = 0.15) -> list[tuple[str, bool]]:
    """Claims about a measured run against its prediction: it ran; on a GPU, within ``gpu_rtol``."""
    est = estimate(model, config, micro_batch=micro_batch, seq_len=seq_len, on_gpu=environment.has_gpu)
    out = [(f"the measured run finished ({result.status}{': ' + result.message if result.message else ''})",
            result.status == "ok")]
    if environment.has_gpu:
        out.append(gpu_prediction_claim(result.label, est.total("gpu"), result.peak_gpu_allocated_bytes, gpu_rtol))
    return out
