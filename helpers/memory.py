"""Memory: how many bytes a ZeRO setup needs on the GPU, in host RAM and on NVMe.

:func:`estimate` predicts every place and kind at each place's peak, and when in the step the
peak falls; :func:`verdict` (below) turns a figure into "fits" / "tight" / "does not fit";
helpers.measurements checks the estimate against stored runs (the validation half);
``python -m helpers sizing`` sizes any model. :func:`cpu_offload_host_bytes` and
:func:`cpu_offload_max_params` answer the question notebook 01's verdict asks ("how large a
model can ZeRO-2 with CPU offload train in this much RAM?") with the same estimate, so the kit
has one host-RAM model, not two.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from helpers import claims, taught
from helpers.show import GiB


def cpu_offload_host_bytes(n_params: int, pin_memory: bool = False, on_gpu: bool = True) -> int:
    """Predicted peak host RSS of ZeRO-2 with CPU optimizer offload for ``n_params`` parameters.

    :func:`estimate`'s host total: process base, what stays of the fp32 model as first built
    (1.5 bytes per parameter), the fp32 gradient partition, fp32 master weights and Adam's moments
    (16), plus 6 more when offload buffers are pinned (DeepSpeed's default since 0.19.5).
    """
    ds = {
        "fp16": {"enabled": True},
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": pin_memory},
        },
    }
    return estimate(ModelInfo.from_count(n_params), ds, on_gpu=on_gpu).total("cpu")


def cpu_offload_max_params(ram_bytes: int, pin_memory: bool = False, on_gpu: bool = True) -> int:
    """The largest parameter count whose ZeRO-2 CPU-offload run fits in ``ram_bytes`` of RAM."""
    low, high = (cpu_offload_host_bytes(n, pin_memory, on_gpu) for n in (10**9, 2 * 10**9))
    per_param = (high - low) / 10**9  # the host estimate is linear in the parameter count
    base = low - per_param * 10**9
    return max(0, int((ram_bytes - base) / per_param))


# ---- the estimator -------------------------------------------------------------------------------

#: Bytes per element of half-precision weights/activations, and the fp32 extras of mixed precision.
HALF, FP32 = 2, 4
#: The shard a 16-bit save holds in host RAM: notebook 06's save_16bit_in_shards, its default size.
SAVE_SHARD_BYTES = inspect.signature(taught.save_16bit_in_shards).parameters["shard_bytes"].default
#: Bytes per weight of a block's linear layer quantized by bitsandbytes to 4-bit NF4 with double
#: quantization (QLoRA's base): half a byte, one 8-bit scale per 64 weights and one fp32 scale per
#: 256 of those (Dettmers et al., 2023: 0.127 bits a weight).
NF4_BYTES = 0.5 + 1 / 64 + FP32 / (64 * 256)
#: Bytes per parameter of Adam's two moments in bitsandbytes' 8-bit optimizer (one byte each; its
#: blockwise scales are negligible), in place of fp32's 8.
ADAM_8BIT_BYTES = 2
#: Bytes per logit at the loss's peak (the start of backward): transformers' loss upcasts the logits
#: to fp32; log_softmax keeps its fp32 output, and backward adds its fp32 gradient and the gradient
#: of log_softmax's input. (The 774M stage-3 run ran out asking for exactly one fp32 logits tensor.)
LOGIT_BYTES = 3 * FP32
#: Host RSS of a process that imported torch and DeepSpeed, before any model: CUDA context and
#: libraries on a GPU machine, libraries only on a CPU one (fitted on the plain stages' host RSS,
#: GPT-2 124M and 355M, three GPU runs of 2026-11 in docs/gpu_runs.md).
HOST_BASE_GPU = int(1.82 * GiB)
HOST_BASE_CPU = int(0.45 * GiB)
#: What stays of the fp32 model built on the host before ``deepspeed.initialize`` moved it away
#: (bytes per parameter; the allocator does not hand all of it back). Same fit as HOST_BASE_GPU.
HOST_BUILD_BYTES = 1.5
#: Pinned offload buffers, bytes per parameter (measured on GPT-2 355M and 1.56B, pinned ZeRO-2).
HOST_PINNED_BYTES = 6
#: ZeRO-3's ``has_overflow`` runs ``torch.isinf``/``isnan`` over the whole flat fp16 gradient
#: partition (``abs`` of it plus a boolean mask): a transient of about 3 bytes per parameter inside
#: ``engine.step()``, measured on the host with the optimizer offloaded. On the GPU
#: (ZeRO-3 without offload) DeepSpeed's same code runs on the device; the kit's sliced fix
#: (helpers.deepspeed_fixes) only covers host buffers.
OVERFLOW_CHECK_BYTES = 3
#: What ``engine.step()`` adds to host RAM with the optimizer offloaded at ZeRO-3 once the kit's
#: sliced overflow check is in place (bytes per parameter): the step's rise over the end of
#: backward in notebook 06's 2.7B NVMe rung (a fit row), 0.37 and 0.39 (docs/gpu_runs.md, 2026-11-30 and
#: 2026-12-01). Without the fix the whole-buffer check's OVERFLOW_CHECK_BYTES stands in its place. Used
#: with the optimizer in CPU RAM; with the optimizer on NVMe, STEP_SUB_GROUP_BYTES (below).
SLICED_STEP_BYTES = 0.38
#: ...and at least this much: small models' steps rise by a size-independent amount (the fit row
#: SmolLM2-135M-shaped ZeRO-3 + NVMe 2 x 512: 0.25 GiB, 2 bytes per parameter).
SLICED_STEP_FLOOR = int(0.25 * GiB)
#: With the optimizer on NVMe, what ``engine.step()`` adds to host RAM per element of the largest
#: optimizer sub-group: each sub-group is swapped in for its step, with an fp32 copy of its
#: gradient and of its weights beside the swap buffers (4 + 4 bytes). Measured in T4 emulation
#: (docs/gpu_runs.md, 2026-12-02, the step's RSS rise over forward and backward): Qwen2.5-0.5B-shaped 1.09 GB
#: with a 136M-element embedding (8.0 bytes each), TinyLlama-1.1B-shaped 0.52 GB with 65.5M (8.0),
#: GPT-2 124M 0.24-0.31 GB with 38.6M (6.3-8.0). GPT-2's embedding is a fixed share of its size,
#: which is why SLICED_STEP_BYTES per parameter had matched GPT-2 rungs and missed the modern ones.
STEP_SUB_GROUP_BYTES = 8
#: Host RSS that a ZeRO-3 run with offload whose model was built under ``deepspeed.zero.Init``
#: keeps above the process base, its gradients, its step and its swap buffers (it has no
#: host-built model to leave behind): the residual of notebook 06's NVMe rungs at 774M and 2.7B
#: (the ladder's fit rows, docs/gpu_runs.md, 2026-12-01), 0.38 and 0.37 GiB once the optimizer's swap
#: buffers are sized to the largest sub-group, as DeepSpeed sizes them (1.02 GiB before, when
#: they were sized to ``sub_group_size`` and this constant absorbed the difference).
ZERO_INIT_HOST_BYTES = int(0.38 * GiB)
#: Host RSS when the fp32 model has just been built (before ``deepspeed.initialize``): this
#: constant, 4 bytes per parameter, and 4 bytes per element of the output head that transformers
#: allocates before tying it to the input embedding (tied models only). The constant is the
#: residual of the "model built" phase of the grid's fit half (GPT-2 355M, 774M, 1.5B; Llama 1B,
#: tied; TinyLlama 1.1B, untied): 0.83 GiB in each, within 0.01 GiB. For models of 355M and up
#: this moment, not training, is the host's peak when nothing is offloaded.
HOST_BUILD_BASE = int(0.83 * GiB)
#: ZeRO-3 with the optimizer offloaded, the moment a large trained parameter's gradient is made
#: (a tied head's, in the first step of backward) and handed to the host: bytes per element of that
#: parameter beside its gathered weight. Autograd's fp16 gradient is the whole parameter's (2);
#: the fp32 copy DeepSpeed makes for the host is of this rank's partition (stage3.py,
#: ``grad_buffer.to(dtype=master_weights_and_grads_dtype)``: 4 over the ranks).
GRAD_OFFLOAD_BYTES, GRAD_OFFLOAD_PARTITION_BYTES = 2, 4
#: ...and this much more per element of the partition where the model was built outside
#: ``zero.Init`` (measured, not yet traced in DeepSpeed's code: its per-rank scaling is assumed).
#: In T4 emulation (docs/gpu_runs.md, 2026-12-06) a Llama-3.2-1B-shaped model (128k tied
#: vocabulary, 263M-element embedding) built on the host, ZeRO-3 + NVMe at 2 x 512, peaked at
#: 3.75 GB in forward and backward, which the logits (2.4 GB predicted) did not explain: about 10
#: bytes per element in all (3.68 GB predicted with them). Built under zero.Init, the rungs of
#: notebook 06 (GPT-2 2.7B, SmolLM2-1.7B, TinyLlama-1.1B-shaped) bound the hand-off to 7.6 bytes or
#: less. The same Llama at stage 3 + CPU offload, 2 x 1024 (4.01 GB measured) is consistent with it
#: but no test of it: its logits predict the same peak.
GRAD_OFFLOAD_HOST_BUILT_BYTES = 4


def layer_activation_bytes(model: "ModelInfo", tokens: int, w: int = HALF) -> int:
    """Bytes one transformer layer keeps for backward without checkpointing (``w``: bytes of an
    activation element), counted from what autograd saves with PyTorch's SDPA (flash) attention,
    which keeps q, k, v, its output and a per-head fp32 log-sum-exp, never the s x s scores.

    GPT-2: two LayerNorms (input and output each, 2 x 2h), the fused q/k/v projection (3h),
    attention output and its reshaped copy (2h), the MLP's input to ``gelu_new`` and the four
    tensors its Python formula keeps (tanh, 0.5x, 1 + tanh, output): 5 x intermediate.
    Llama/Qwen: RMSNorm upcasts to fp32 and keeps the fp32 input, the cast-back and its output
    (twice), q, k and v after rotary (q + 2 kv, each heads x head_dim wide: grouped-query
    attention keeps fewer k/v heads), attention output and its copy (2 q), SwiGLU's gate, up, SiLU
    output and product: 4 x intermediate. Other families as their config and modules say: a
    LayerNorm keeps its input and output (2h), a plain GELU MLP its input and output (2 x
    intermediate; Pythia, Falcon)."""
    h, inter = model.hidden, model.intermediate
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    lse = FP32 * model.heads
    if model.family == "gpt2":
        per_token = w * (9 * h + 5 * inter) + lse
    else:
        norm = (FP32 + 2 * w) * h if model.rms_norm else 2 * w * h
        mlp = 4 * inter if model.gated_mlp else 2 * inter
        per_token = 2 * norm + w * (2 * h + 3 * q + 2 * kv) + w * mlp + lse
    return int(per_token * tokens)


def activation_bytes(
    model: "ModelInfo", tokens: int, grad_ckpt: bool, w: int = HALF
) -> dict[str, int]:
    """Activation bytes at the two moments that can set the peak, by kind.

    ``"start of backward"``: every layer's saved tensors (with checkpointing: each layer's input
    only) plus the loss's logits (:data:`LOGIT_BYTES`); with checkpointing the recomputed layer
    comes after the logits' buffers are freed, so the larger of the two counts.
    ``"end of backward"``: what remains while the last gradients are made (checkpointed inputs
    and one layer). ``"head's backward"``: the moment the output head's gradients are made, the
    loss's fp32 buffers freed and only the logits' half-precision gradient left of them."""
    layer = layer_activation_bytes(model, tokens, w)
    logits = tokens * model.vocab * LOGIT_BYTES
    head = tokens * model.hidden * (FP32 + 2 * w if model.rms_norm else 2 * w)
    kept = model.n_layer * (tokens * model.hidden * w if grad_ckpt else layer) + head
    at_head = kept + tokens * model.vocab * w
    if grad_ckpt:
        return {"start of backward": kept + max(logits, layer),
                "end of backward": kept - head + layer, "head's backward": at_head}
    return {"start of backward": kept + logits, "end of backward": layer,
            "head's backward": at_head}


def model_states(
    model: "ModelInfo", config: dict, world_size: int = 1, trainable: int | None = None,
    quantized: bool = False, adam_8bit: bool = False,
) -> dict[str, dict[str, int]]:
    """The ZeRO paper's model states per place and kind (params, grads, optimizer), as a rank holds
    them during a step: mixed-precision Adam's 2 + 2 + 12 bytes per parameter, partitioned 12/N at
    stage 1, 14/N at stage 2, 16/N at stage 3, except that DeepSpeed's stage 1 partitions gradients
    as stage 2 does (measured on 2 GPUs). Offloaded states are on "cpu" or "nvme"; an offloaded
    optimizer reads an fp32 gradient partition on the host.

    ``trainable``: how many of the parameters train (LoRA's adapters, the rest frozen; None: all).
    Every parameter keeps its weights; only the trained ones have gradients and optimizer states
    (:func:`lora_bytes_per_param`). ``quantized``: the blocks' linear weights in 4-bit NF4
    (:data:`NF4_BYTES`, QLoRA; the rest as the precision says). ``adam_8bit``: Adam's moments in
    8 bits (:data:`ADAM_8BIT_BYTES`)."""
    zero = _zero(config)
    stage, n, p = int(zero.get("stage", 0)), max(1, world_size), model.n_params
    t = p if trainable is None else trainable
    half = _half(config)
    w = HALF if half else FP32
    master = FP32 if (half or stage >= 1) else 0
    host_opt, host_par = (
        _offload(zero, "offload_optimizer"),
        _offload(zero, "offload_param") if stage == 3 else None,
    )
    out: dict[str, dict[str, int]] = {}

    def put(place: str, kind: str, nbytes: float) -> None:
        if nbytes:
            out.setdefault(place, {})[kind] = out.get(place, {}).get(kind, 0) + int(nbytes)

    linear = linear_params(model) if quantized else 0  # the 4-bit part; the rest as w says
    weights = (p - linear) * w + linear * NF4_BYTES
    put(host_par or "gpu", "params", weights / (n if stage == 3 else 1))
    if host_opt:
        # the fp32 gradient partition the offloaded optimizer reads (swapped out with it to NVMe)
        put(host_opt, "grads", t * FP32 / n)
    else:
        put("gpu", "grads", t * w / (n if stage >= 1 else 1))
    adam = ADAM_8BIT_BYTES if adam_8bit else 8
    put(host_opt or "gpu", "optimizer", t * (adam + master) / (n if stage >= 1 else 1))
    return out


def linear_params(model: "ModelInfo") -> int:
    """The weights of the blocks' linear layers (what QLoRA quantizes and LoRA's
    ``target_modules="all-linear"`` wraps; not the embedding, the head or the norms): inputs x
    outputs per matrix, laid out as :func:`lora_params` lays them."""
    h, i = model.hidden, model.intermediate
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    if model.family == "gpt2":
        per_layer = h * 3 * h + h * h + 2 * h * i
    else:
        per_layer = 2 * h * q + 2 * h * kv + (3 if model.gated_mlp else 2) * h * i
    return per_layer * model.n_layer


def lora_params(model: "ModelInfo", rank: int) -> int:
    """Parameters LoRA adds at ``rank`` to every linear layer of the blocks (PEFT's
    ``target_modules="all-linear"``: not the output head): ``rank`` x (inputs + outputs) per
    matrix. GPT-2: q/k/v fused (h -> 3h), the attention's output (h -> h), the MLP's two
    (h -> i, i -> h). Llama/Qwen-style: q, k, v, o (k and v h -> kv heads x head width), gate, up
    and down."""
    h, i = model.hidden, model.intermediate
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    if model.family == "gpt2":
        per_layer = (h + 3 * h) + (h + h) + (h + i) + (i + h)
    else:
        mlp = 3 * (h + i) if model.gated_mlp else 2 * (h + i)
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + mlp
    return rank * per_layer * model.n_layer


def lora_bytes_per_param(n_params: int, trainable: int, half: bool = True) -> float:
    """Model-state bytes per parameter of the whole model when only ``trainable`` parameters
    train (LoRA): the frozen model's weights in 2 bytes (4 in fp32), the adapters' full
    mixed-precision Adam states (2 weight + 2 gradient + 12 optimizer bytes each)."""
    w = HALF if half else FP32
    return ((n_params - trainable) * w + trainable * (w + w + 8 + FP32)) / n_params


def _offload(zero: dict, key: str) -> str | None:
    return {"cpu": "cpu", "nvme": "nvme"}.get((zero.get(key) or {}).get("device", "none"))


@dataclass
class ModelInfo:
    """What the estimator needs to know about a model; from_config counts on the meta device.

    The fields after ``name`` describe Llama/Qwen-style blocks (SwiGLU width, grouped-query KV
    heads, tied embeddings) and what other families differ in (a head width of its own, a plain
    GELU MLP, LayerNorm); their defaults describe a GPT-2 block (and, past the family, a
    Llama-style one), so positional construction keeps working.
    """

    n_params: int
    largest_param_numel: int
    n_layer: int
    hidden: int
    heads: int
    vocab: int
    name: str = ""
    intermediate: int = 0  # MLP width (SwiGLU's gate/up width); 0: GPT-2's 4 x hidden
    kv_heads: int = (
        0  # key/value heads (fewer than ``heads``: grouped-query attention); 0: as many as heads
    )
    tied: bool = True  # input embedding and output head share one matrix
    family: str = "gpt2"  # the transformers model_type: "gpt2", "llama", "qwen2", ...
    head_dim: int = 0  # width of one attention head; 0: hidden / heads (Qwen3, Gemma set their own)
    gated_mlp: bool | None = None  # SwiGLU-style gate and up (None: every family but GPT-2's)
    rms_norm: bool | None = None  # RMSNorm, not LayerNorm (None: every family but GPT-2's)
    largest_module_numel: int = 0  # the most parameters one module holds itself; 0: the largest
    max_positions: int = 0  # the longest sequence the model takes (0: no limit known)
    #: every parameter's element count, in ``model.parameters()`` order (the order ZeRO-3 groups
    #: them into optimizer sub-groups); empty for a bare count
    param_numels: tuple[int, ...] = ()

    def __post_init__(self):
        self.intermediate = self.intermediate or 4 * self.hidden
        self.kv_heads = self.kv_heads or self.heads
        self.head_dim = self.head_dim or self.hidden // self.heads
        llama_like = self.family != "gpt2"
        self.gated_mlp = llama_like if self.gated_mlp is None else self.gated_mlp
        self.rms_norm = llama_like if self.rms_norm is None else self.rms_norm
        self.largest_module_numel = self.largest_module_numel or self.largest_param_numel

    @property
    def gathered_floor(self) -> int:
        """Elements ZeRO-3 holds gathered at the least, whatever stage3_max_live_parameters says: a
        parameter is gathered whole (a fused MoE expert tensor), and so is the output head while
        the logits are made."""
        return max(self.largest_param_numel, self.vocab * self.hidden)

    @classmethod
    def from_config(cls, config, name: str = "") -> "ModelInfo":
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        sizes = [p.numel() for p in model.parameters()]
        modules = [sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()]
        names = [n for n, _ in model.named_parameters()]
        hidden, heads = config.hidden_size, config.num_attention_heads
        family = getattr(config, "model_type", "") or "gpt2"
        inner = (
            getattr(config, "intermediate_size", None)
            or getattr(config, "n_inner", None)
            or getattr(config, "ffn_hidden_size", None)  # Falcon
            or 4 * hidden
        )
        return cls(
            n_params=sum(sizes),
            largest_param_numel=max(sizes),
            n_layer=config.num_hidden_layers,
            hidden=hidden,
            heads=heads,
            vocab=config.vocab_size,
            name=name,
            intermediate=inner,
            kv_heads=_kv_heads(config, heads),
            tied=bool(getattr(config, "tie_word_embeddings", True)),
            family=family,
            head_dim=getattr(config, "head_dim", None) or hidden // heads,
            gated_mlp=any(k in n for n in names for k in ("gate_proj", "gate_up_proj", ".w3.")),
            rms_norm=any("RMSNorm" in type(m).__name__ for m in model.modules()),
            largest_module_numel=max(modules),
            max_positions=(getattr(config, "max_position_embeddings", None)
                           or getattr(config, "n_positions", None) or 0),
            param_numels=tuple(sizes),
        )

    @classmethod
    def for_shape(cls, shape: str, vocab_size: int | None = None) -> "ModelInfo":
        """Any shape of helpers.models.MODEL_SHAPES (GPT-2 or Llama/Qwen-style), counted on the
        meta device."""
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
        """A GPT-2-like shape for a bare parameter count (width from 12 h^2 per layer, 48 layers
        max)."""
        layers = 12 if n_params < 2e8 else 24 if n_params < 5e8 else 36 if n_params < 1e9 else 48
        hidden = int(((n_params - 50257 * 1024) / (12 * layers)) ** 0.5 // 64 * 64) or 64
        return cls(
            n_params,
            max(50257 * hidden, 4 * hidden * hidden),
            layers,
            hidden,
            max(1, hidden // 64),
            50257,
            name,
        )


def largest_sub_group_numel(model: ModelInfo, sub_group_size: int, world_size: int = 1) -> int:
    """The most elements one ZeRO-3 optimizer sub-group holds on a rank, as DeepSpeed 0.19 groups
    them (stage3.py, ``_create_fp16_sub_groups``): parameters in order, each rank's partition of
    each, a sub-group closed once it reaches ``sub_group_size``. A parameter is never split, so a
    sub-group holds at least the largest one (a big vocabulary's embedding). DeepSpeed sizes the
    NVMe optimizer's swap buffers to it. Without the parameter list (a bare count): the bound
    ``sub_group_size`` + the largest partition."""
    n = max(1, world_size)
    parts = [-(-numel // n) for numel in model.param_numels]
    if not parts:
        return min(model.n_params, sub_group_size + -(-model.largest_param_numel // n))
    if sub_group_size >= sum(parts):
        return sum(parts)
    largest = current = 0
    for numel in parts:
        current += numel
        if current >= sub_group_size:
            largest, current = max(largest, current), 0
    return max(largest, current)


def embedding_numel(model: ModelInfo) -> int:
    """Elements of the model's input embedding, vocabulary x width (a head tied to it is the same
    tensor): what freezing it takes out of training."""
    return model.vocab * model.hidden


def without_embedding(model: ModelInfo) -> ModelInfo:
    """The part of ``model`` that trains with its input embedding frozen (a head tied to it goes
    with it): its parameters less the embedding's vocabulary x width, and the parameter list ZeRO-3
    groups into optimizer sub-groups without it (where it had one)."""
    import dataclasses

    embedding = embedding_numel(model)
    numels = list(model.param_numels)
    if embedding in numels:
        numels.remove(embedding)
    largest = max(numels, default=max(model.intermediate, model.hidden) * model.hidden)
    return dataclasses.replace(model, n_params=model.n_params - embedding, largest_param_numel=largest,
                               largest_module_numel=0, param_numels=tuple(numels))


def _kv_heads(config, heads: int) -> int:
    """Key/value heads as each family's config spells them: ``num_key_value_heads`` (Llama, Qwen),
    ``num_kv_heads`` (Falcon's new architecture), one for Falcon's older multi-query models."""
    if getattr(config, "model_type", "") == "falcon" and not config.new_decoder_architecture:
        return 1 if config.multi_query else heads
    spelled = getattr(config, "num_key_value_heads", None) or getattr(config, "num_kv_heads", None)
    return spelled or heads


@dataclass
class Estimate:
    """Predicted bytes per place (gpu, cpu, nvme) and kind (params, grads, optimizer, activations,
    buffers, ...) at each place's peak, and when in the step that peak falls (``phase``)."""

    parts: dict[str, dict[str, int]] = field(default_factory=dict)
    phase: dict[str, str] = field(default_factory=dict)

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


def _gpu_phases(
    model: ModelInfo,
    config: dict,
    states: dict,
    world_size: int,
    micro_batch: int,
    seq_len: int,
    grad_ckpt: bool,
    w: int,
    zero_init: bool = False,
    trainable: int | None = None,
    largest_trained: int | None = None,
    adam_8bit: bool = False,
) -> dict[str, dict[str, int]]:
    """The device's bytes at each moment that can set the peak, by kind (see :func:`estimate`).
    ``largest_trained``: elements of the largest parameter that trains (None: the model's
    largest). ``adam_8bit``: Adam's moments in 8 bits (:data:`ADAM_8BIT_BYTES`)."""
    zero = _zero(config)
    stage, n, p = int(zero.get("stage", 0)), max(1, world_size), model.n_params
    t = p if trainable is None else trainable
    on = states.get("gpu", {})
    # gradients appear during backward, except stage 3's fp16 partition, which persists between
    # steps (GPT-2 774M at stage 3 ran out with 13.21 GiB in use: its 1.44 GiB of fp16 gradients
    # are needed to account for it)
    resident = {k: v for k, v in on.items() if k != "grads" or stage == 3}
    if stage in (1, 2):
        resident["buffers"] = int(zero.get("reduce_bucket_size", 5e8)) * w
    elif stage == 3:
        buckets = int(zero.get("reduce_bucket_size", 5e8)) + int(
            zero.get("stage3_prefetch_bucket_size", 5e7)
        )
        resident["buffers"] = buckets * w
        # gathered (live) parameters: at most stage3_max_live_parameters plus one prefetch bucket
        live = int(zero.get("stage3_max_live_parameters", 1e9)) + int(
            zero.get("stage3_prefetch_bucket_size", 5e7)
        )
        if _offload(zero, "offload_param"):
            live = min(
                live,
                2 * model.largest_param_numel + int(zero.get("stage3_prefetch_bucket_size", 5e7)),
            )
        # never less than one whole parameter or the head (ModelInfo.gathered_floor)
        resident["gathered params"] = min(p, max(live, model.gathered_floor)) * w
    acts = activation_bytes(model, micro_batch * seq_len, grad_ckpt, w)
    at_logits = dict(resident)
    if stage == 3:
        # while the loss's logits are alive, ZeRO-3 holds the head gathered and the next prefetch
        # bucket, not stage3_max_live_parameters' worth: measured in T4 emulation (docs/gpu_runs.md run
        # 20) the six NVMe rungs of GPT-2 124M, Qwen2.5-0.5B and TinyLlama-1.1B peaked 0.08 to
        # 0.22 GiB under a prediction that counted the live limit here
        at_logits["gathered params"] = min(p, model.gathered_floor + int(
            zero.get("stage3_prefetch_bucket_size", 5e7))) * w
    phases = {
        "start of backward": {**at_logits, "activations": acts["start of backward"]},
        "end of backward": {
            **resident,
            "grads": on.get("grads", 0),
            "activations": acts["end of backward"],
        },
    }
    if stage in (1, 2) and _offload(zero, "offload_optimizer"):
        # once backward is done every half-precision gradient is still on the device, before the
        # offloaded optimizer's copy to the host; a tied embedding's two gradient contributions
        # (output head, then input) coexist for a moment. Fit half: GPT-2 774M (4 x 512) and
        # TinyLlama 1.1B (untied) with ZeRO-2 + CPU offload peaked at weights + gradients + buckets.
        tied = w * model.vocab * model.hidden if model.tied and trainable is None else 0
        phases["after backward"] = {
            **resident,
            "grads": w * t,
            **({"tied gradient": tied} if tied else {}),
        }
    if stage == 3 and _offload(zero, "offload_optimizer"):
        # the head's gradient made and handed to the host: see GRAD_OFFLOAD_BYTES (with LoRA, whose
        # largest adapter is not known here, all the trained elements: an upper bound)
        largest = min(model.largest_param_numel if largest_trained is None else largest_trained, t)
        per_rank = GRAD_OFFLOAD_PARTITION_BYTES + (0 if zero_init else GRAD_OFFLOAD_HOST_BUILT_BYTES)
        phases["gradient to the host"] = {
            **at_logits, "activations": acts["head's backward"],
            "gradient hand-off": int((GRAD_OFFLOAD_BYTES + per_rank / n) * largest)}
    if stage == 3 and not zero_init:
        # deepspeed.initialize casts a model built without zero.Init and moves it whole to the
        # device before ZeRO-3 partitions it (engine._configure_distributed_model): fit half,
        # GPT-2 1.5B with ZeRO-3 + CPU offload peaked at its fp16 weights, 2.97 GiB
        phases["deepspeed.initialize"] = {"params before partitioning": w * p}
    if not _offload(zero, "offload_optimizer") and _half(config):
        # The optimizer step's temporaries (fp32 gradient copies and the flattened partitions):
        # 24 bytes/param at stage 0, 2 + 2/N + 18/N at stages 1-2 (DeepSpeed's stage 1
        # reduce-scatters before the step, as stage 2), and at stage 3 its states plus one fp32
        # sub-group gradient. Fitted on GPT-2 124M and 355M with 1 and 2 GPUs (docs/gpu_runs.md runs
        # 2 and 6); DeepSpeed's buckets (and stage 3's gathered parameters) come on top.
        # (with LoRA, the frozen parameters' weights plus these for the trained ones)
        frozen = p - t
        # the frozen weights as they are held (QLoRA's quantized: below 2 bytes each)
        frozen_bytes = on.get("params", w * p) - w * t if stage == 0 else w * frozen
        if stage == 0:
            # 8-bit Adam: its moments' 6 bytes a parameter fewer, assumed to come off the same fit
            step = (24 - (8 - ADAM_8BIT_BYTES if adam_8bit else 0)) * t + frozen_bytes
        elif stage in (1, 2):
            step = 2 * p + 2 * t / n + 18 * t / n
        else:
            step = (16 * t + w * frozen) / n + FP32 * min(t / n, int(zero.get("sub_group_size", 1e9)))
        extra = {k: v for k, v in resident.items() if k in ("buffers", "gathered params")}
        temporaries = max(0, step - sum(on.values()))
        phases["optimizer step"] = {**on, **extra, "step temporaries": temporaries}
        if stage == 3:
            # has_overflow, before the sub-groups' steps: see OVERFLOW_CHECK_BYTES
            check = OVERFLOW_CHECK_BYTES * t / n
            phases["overflow check"] = {**on, **extra, "overflow check": check}
    return phases


def batch_in_config(config: dict) -> dict[str, int]:
    """What a DeepSpeed config says of the batch, where it says it in numbers ("auto" or a missing
    key says nothing): ``micro_batch`` (``train_micro_batch_size_per_gpu``) and ``world_size``
    (``train_batch_size`` over micro batch x ``gradient_accumulation_steps``)."""
    micro, total = config.get("train_micro_batch_size_per_gpu"), config.get("train_batch_size")
    accumulation = config.get("gradient_accumulation_steps", 1)
    said = {}
    if isinstance(micro, int) and micro > 0:
        said["micro_batch"] = micro
        if isinstance(total, int) and isinstance(accumulation, int) and accumulation > 0:
            if total % (micro * accumulation) == 0:
                said["world_size"] = total // (micro * accumulation)
    return said


def batch_disagreement(config: dict, micro_batch: int | None = None,
                       world_size: int | None = None) -> str:
    """Where ``micro_batch`` or ``world_size`` differ from what ``config`` says (one clause each,
    naming the key); empty when they agree or the config does not say. The config carries them:
    a run or an estimate given other numbers would describe another run."""
    said = batch_in_config(config)
    keys = {"micro_batch": "train_micro_batch_size_per_gpu",
            "world_size": "train_batch_size / (micro batch x gradient_accumulation_steps)"}
    given = {"micro_batch": micro_batch, "world_size": world_size}
    return "; ".join(f"{name} {value} but the config's {keys[name]} is {said[name]}"
                     for name, value in given.items()
                     if value is not None and name in said and said[name] != value)


def estimate(
    model: ModelInfo,
    config: dict,
    world_size: int | None = None,
    micro_batch: int | None = None,
    seq_len: int = 512,
    grad_ckpt: bool = True,
    on_gpu: bool = True,
    zero_init: bool = False,
    sliced_overflow_check: bool = True,
    trainable: int | None = None,
    frozen_embeddings: bool = False,
    quantized: bool = False,
    adam_8bit: bool = False,
    save_shard_bytes: int = 0,
) -> Estimate:
    """Predict the peak bytes a training step needs on the GPU, in host RAM and on NVMe.

    The device's peak is the largest of the moments of a step (``Estimate.phase`` says which):
    the start of backward (resident states, DeepSpeed's buckets, every saved activation and the
    loss's fp32 logits; gradients not yet made), the end of backward (gradients made, activations
    nearly gone) and the optimizer step (its temporaries); where they apply, the gradients after
    backward (ZeRO-1/2 with offload), the overflow check and the whole-model move at
    ``deepspeed.initialize`` (ZeRO-3), and a large gradient handed to the host (ZeRO-3 with the
    optimizer offloaded). Model states follow
    :func:`model_states`; activations follow :func:`activation_bytes` (attention and MLP per
    architecture, grouped-query heads and the MLP width included). Host RAM: the process base, what
    stays of the model built before ``deepspeed.initialize`` (unless ``zero_init`` builds it
    partitioned), offloaded states and their buffers. Without a GPU (``on_gpu=False``) the device
    is the host: its states and activations add to the host's figures. ``sliced_overflow_check``:
    whether ZeRO-3's overflow check over host buffers runs in slices (the kit's
    ``deepspeed_fixes.fix_stage3_overflow_check``, installed by every ZeRO-3 run with offload) or over
    the whole buffer (DeepSpeed 0.19.8 as it comes: about 2.6 bytes per parameter more).
    ``trainable``: how many parameters train (LoRA's adapters; None: all of them): gradients,
    optimizer states and their buffers count only those (:func:`model_states`).
    ``frozen_embeddings``: the input embedding (and a head tied to it) does not train: it leaves
    the trained count and the optimizer's sub-groups (:func:`without_embedding`).
    ``quantized`` (QLoRA's 4-bit base, loaded quantized straight onto the GPU: no fp32 model built
    on the host) and ``adam_8bit`` (8-bit moments): :func:`model_states`. ``save_shard_bytes``: a
    save in shards of this size after training (notebook 06's ``save_16bit_in_shards``): the host
    then holds what training keeps (not the step's temporaries) and the shard being written, at
    most its size and one more tensor (the largest, in the weights' type), never more than the
    whole model; where that passes the step, it is the host's peak (phase "save in shards").

    The micro batch and the world size come from ``config`` where it has them in numbers (else 4
    and 1); ``micro_batch`` or ``world_size`` given otherwise is refused (ValueError).
    """
    if why := batch_disagreement(config, micro_batch, world_size):
        raise ValueError(f"memory.estimate: {why}: give the config's numbers, or none")
    said = batch_in_config(config)
    micro_batch = said.get("micro_batch", 4) if micro_batch is None else micro_batch
    world_size = said.get("world_size", 1) if world_size is None else world_size
    zero = _zero(config)
    stage, n, p = int(zero.get("stage", 0)), max(1, world_size), model.n_params
    w = HALF if _half(config) else FP32
    grouped = without_embedding(model) if frozen_embeddings else model  # what the optimizer holds
    if frozen_embeddings and trainable is None:
        trainable = grouped.n_params
    t = p if trainable is None else trainable
    states = model_states(model, config, world_size, trainable, quantized, adam_8bit)
    est = Estimate()
    phases = _gpu_phases(
        model, config, states, world_size, micro_batch, seq_len, grad_ckpt, w, zero_init, trainable,
        grouped.largest_param_numel, adam_8bit,
    )
    when = max(phases, key=lambda k: sum(phases[k].values()))
    dev = "gpu" if on_gpu else "cpu"
    for kind, nbytes in phases[when].items():
        est.add(dev, kind, nbytes)
    est.phase[dev] = when
    # host RAM
    host_opt, host_par = (
        _offload(zero, "offload_optimizer"),
        _offload(zero, "offload_param") if stage == 3 else None,
    )
    est.add("cpu", "process", HOST_BASE_GPU if on_gpu else HOST_BASE_CPU)
    built_on_host = not (stage == 3 and zero_init) and not quantized
    if built_on_host:
        est.add("cpu", "model build", p * HOST_BUILD_BYTES)
    for place in ("cpu", "nvme"):
        for kind, nbytes in states.get(place, {}).items():
            est.add(place, kind, nbytes)
    if stage == 3 and (host_opt or host_par):
        est.add("cpu", "grads", t * w / n)  # ZeRO-3's flat gradient partition on the host (fp16)
        if sliced_overflow_check and host_opt == "nvme":
            group = largest_sub_group_numel(grouped, int(zero.get("sub_group_size", 1e9)), world_size)
            step = STEP_SUB_GROUP_BYTES * group
        elif sliced_overflow_check:
            step = max(SLICED_STEP_BYTES * t / n, SLICED_STEP_FLOOR)
        else:
            step = OVERFLOW_CHECK_BYTES * t / n
        est.add("cpu", "step temporaries", step)
        if zero_init:
            est.add("cpu", "zero.Init build", ZERO_INIT_HOST_BYTES)
    if host_par == "nvme":
        par_cfg = zero.get("offload_param") or {}
        est.add(
            "cpu",
            "parameter swap buffers",
            int(par_cfg.get("buffer_count", 5)) * int(par_cfg.get("buffer_size", 1e8)) * w,
        )
    if host_opt == "nvme":
        # DeepSpeed's optimizer swapper: buffer_count page-locked fp32 buffers, each as large as
        # the largest sub-group (whatever pin_memory says), so a big embedding sets their size
        opt_cfg = zero.get("offload_optimizer") or {}
        group = largest_sub_group_numel(grouped, int(zero.get("sub_group_size", 1e9)), world_size)
        est.add("cpu", "optimizer swap buffers",
                int(opt_cfg.get("buffer_count", 4)) * group * FP32)
    if host_opt and (zero.get("offload_optimizer") or {}).get("pin_memory"):
        est.add("cpu", "pinned buffers", t * HOST_PINNED_BYTES / n)
    est.phase.setdefault("cpu", "optimizer step" if host_opt else "start of training")
    if save_shard_bytes:
        saving = {k: v for k, v in est.parts.get("cpu", {}).items() if k != "step temporaries"}
        shard = min(save_shard_bytes + w * model.largest_param_numel, w * p)  # no more than the model
        saving["save shard"] = int(shard)
        if sum(saving.values()) > est.total("cpu"):
            est.parts["cpu"], est.phase["cpu"] = saving, "save in shards"
    if built_on_host:
        built = host_build_bytes(model)
        if sum(built.values()) > est.total("cpu"):
            est.parts["cpu"], est.phase["cpu"] = built, "model built"
    return est


def host_build_bytes(model: ModelInfo) -> dict[str, int]:
    """Host bytes by kind the moment the fp32 model has been built on the host (the peak of a run
    that offloads nothing, from 355M parameters up): see :data:`HOST_BUILD_BASE`."""
    out = {"process": HOST_BUILD_BASE, "model build": FP32 * model.n_params}
    if model.tied:
        out["untied head"] = FP32 * model.vocab * model.hidden  # freed once tied, after the peak
    return out


def gpu_prediction_claim(
    label: str, predicted: int, measured: int | None, rtol: float = 0.15
) -> tuple[str, bool]:
    """(claim, held): the predicted GPU peak is within ``rtol`` of the measured one (no
    measurement: not held)."""
    shown = "not measured" if measured is None else f"{measured / GiB:.2f} GiB"
    return (
        f"{label}: predicted GPU memory within {rtol:.0%} of measured "
        f"({predicted / GiB:.2f} GiB vs {shown})",
        claims.within(predicted, measured, rtol),
    )


def compare(
    model: ModelInfo,
    config: dict,
    result,
    environment,
    micro_batch: int,
    seq_len: int,
    gpu_rtol: float = 0.15,
) -> list[tuple[str, bool]]:
    """Claims about a measured run against its prediction: it ran; on a GPU, within ``gpu_rtol``."""
    est = estimate(
        model, config, micro_batch=micro_batch, seq_len=seq_len, on_gpu=environment.has_gpu
    )
    out = [
        (
            f"the measured run finished "
            f"({result.status}{': ' + result.message if result.message else ''})",
            result.status == "ok",
        )
    ]
    if environment.has_gpu:
        out.append(
            gpu_prediction_claim(
                result.label, est.total("gpu"), result.peak_gpu_allocated_bytes, gpu_rtol
            )
        )
    return out


# ---- the verdict: fits, tight or does not fit --------------------------------------------------
#: The three-way memory verdict: "fits", "tight" or "does not fit", for one place (GPU, host RAM,
#: disk) or all of them. Pure arithmetic on byte counts, so every layer above can use it.
#:
#: "tight" means the prediction is within :data:`VERDICT_MARGIN` of the limit: the run may still fail. The
#: margin covers what a peak-allocation estimate cannot see: the caching allocator's rounding and
#: fragmentation (a capped GPU fails when *reserved* memory reaches the cap, not allocated memory;
#: GPT-2 774M at stage 3 ran out with 13.21 GiB allocated of 15) and the estimator's own error. It is
#: chosen so that no out-of-memory case of the measurements (helpers/memory_measurements.json) is
#: "fits" (tests/test_memory_validation.py checks that on the validation half).
FITS, TIGHT, NO_FIT = "fits", "tight", "does not fit"
#: How close to a limit a prediction may come and still be called "fits": within 10% is "tight".
VERDICT_MARGIN = 0.10
#: The places a verdict speaks of, and their names in sentences.
PLACES = {"gpu": "GPU", "cpu": "host RAM", "nvme": "NVMe disk"}


def verdict(need: int | float, limit: int | float | None, margin: float = VERDICT_MARGIN) -> str:
    """"fits" when ``need`` <= (1 - margin) x ``limit``, "tight" up to the limit, else "does not
    fit".

    A limit of None means the place does not exist here (no GPU): anything needed there does not
    fit,
    nothing needed fits. A negative need or margin outside [0, 1) is a caller's bug (ValueError)."""
    if need < 0 or not 0 <= margin < 1:
        raise ValueError(
            f"need must be >= 0 and margin in [0, 1): got need={need}, margin={margin}"
        )
    if limit is None:
        return FITS if not need else NO_FIT
    if need <= (1 - margin) * limit:
        return FITS
    return TIGHT if need <= limit else NO_FIT


@dataclass(frozen=True)
class PlaceVerdict:
    """One place's need, limit and verdict."""

    place: str
    need: int
    limit: int | None
    word: str

    def sentence(self) -> str:
        """``GPU: 14.61 of 15.0 GiB: tight (within 10% of the limit)``."""
        limit = "no such device here" if self.limit is None else f"{self.limit / GiB:.1f} GiB"
        why = f" (within {VERDICT_MARGIN:.0%} of the limit)" if self.word == TIGHT else ""
        name = PLACES.get(self.place, self.place)
        return f"{name}: {self.need / GiB:.2f} of {limit}: {self.word}{why}"


def worst_verdict(words: list[str]) -> str:
    """The overall verdict of several places: the worst of them ("fits" only when all fit)."""
    order = [FITS, TIGHT, NO_FIT]
    return max(words, key=order.index) if words else FITS


def verdicts(
    needs: dict[str, int], limits: dict[str, int | None], margin: float = VERDICT_MARGIN
) -> dict[str, PlaceVerdict]:
    """A verdict for every place that needs bytes (and always for "gpu" and "cpu" when limited)."""
    out = {}
    for place in PLACES:
        need = int(needs.get(place, 0))
        if need or (place in limits and limits[place] is not None and place != "nvme"):
            limit = limits.get(place)
            out[place] = PlaceVerdict(place, need, limit, verdict(need, limit, margin))
    return out
