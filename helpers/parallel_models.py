"""The code a learner writes for notebook 08, in one place: a small GPT as a list of layers, the
same layers as a ``deepspeed.pipe.PipelineModule`` and as a plain model, a GPT whose MLPs are
``deepspeed.moe.layer.MoE`` layers, and the three training steps (``engine.train_batch`` for the
pipeline, the engine loop with gradient accumulation for the others). Notebook 08 prints each
piece beside the call that runs it (``helpers.show.Source``); ``helpers.parallel`` runs them in
subprocesses, one per rank. Only torch and DeepSpeed, no kit imports: it reads as a user's script.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


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
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": lr,
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
