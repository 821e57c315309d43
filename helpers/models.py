"""Models: GPT-2-shaped models built offline from a config, parameter counts on the meta device,
a byte-level tokenizer that needs no vocabulary files, and the Hub path with a clear fallback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: GPT-2 family shapes (layers, width, heads); "tiny" and "small-test" are for smoke mode and tests.
GPT2_SHAPES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 64, 2),
    "mini": (4, 256, 4),
    "gpt2-124m": (12, 768, 12),
    "gpt2-355m": (24, 1024, 16),
    "gpt2-774m": (36, 1280, 20),
    "gpt2-1.5b": (48, 1600, 25),
    "gpt2-2.7b": (32, 2560, 32),
}
GPT2_VOCAB = 50257


class ByteTokenizer:
    """UTF-8 bytes as tokens (0-255) plus an end-of-text token (256): no files, no download."""

    vocab_size = 257
    eos_token_id = 256
    pad_token_id = 256
    name_or_path = "byte-level (offline)"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")

    def __call__(self, text: str, return_tensors: str | None = None):
        import torch

        ids = self.encode(text)
        return {"input_ids": torch.tensor([ids]) if return_tensors == "pt" else ids}


def gpt2_config(shape: str = "tiny", vocab_size: int | None = None, n_positions: int = 1024):
    """A GPT2Config of a named shape (see GPT2_SHAPES); dropout off so runs are comparable."""
    from transformers import GPT2Config

    if shape not in GPT2_SHAPES:
        raise ValueError(f"unknown model shape {shape!r}: choose one of {', '.join(GPT2_SHAPES)}")
    layers, width, heads = GPT2_SHAPES[shape]
    return GPT2Config(
        n_layer=layers, n_embd=width, n_head=heads, n_positions=n_positions,
        vocab_size=vocab_size or GPT2_VOCAB, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        use_cache=False, bos_token_id=(vocab_size or GPT2_VOCAB) - 1, eos_token_id=(vocab_size or GPT2_VOCAB) - 1,
    )


def count_params(config) -> int:
    """Parameters of a model built from ``config``, counted on the meta device (no memory, no download)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def largest_param_numel(config) -> int:
    """The element count of the model's largest single parameter (NVMe buffers must hold it)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return max(p.numel() for p in model.parameters())


def build_model(config, seed: int = 0):
    """A freshly initialised causal LM from a config (HF weight init), same weights for the same seed."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


@dataclass
class LoadedModel:
    """A model, its tokenizer and where they came from."""

    model: object
    tokenizer: object
    source: str  # "hub:<name>", "folder:<path>" or "offline:<shape>"
    note: str = ""


def load_pretrained(name_or_path: str, fallback_shape: str = "tiny", seed: int = 0) -> LoadedModel:
    """A pretrained model and tokenizer from the Hub or a local folder; on failure, the offline model.

    The fallback is announced in ``note`` (one sentence naming what failed), never a traceback wall.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kind = "folder" if Path(name_or_path).is_dir() else "hub"
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path)
        return LoadedModel(model, tokenizer, f"{kind}:{name_or_path}")
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        tokenizer = ByteTokenizer()
        model = build_model(gpt2_config(fallback_shape, vocab_size=tokenizer.vocab_size), seed=seed)
        note = (f"could not load {name_or_path!r} ({first[:160]}); using the offline {fallback_shape} "
                "GPT-2-shaped model with the byte-level tokenizer instead")
        return LoadedModel(model, tokenizer, f"offline:{fallback_shape}", note)


def hub_reachable(timeout: float = 3.0) -> bool:
    """True when the Hugging Face Hub answers (and HF_HUB_OFFLINE is not set)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}:
        return False
    import socket

    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False
