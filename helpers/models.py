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


def offline_tokenizer(vocab_size: int = 1024, seed: int = 0):
    """A real Hugging Face tokenizer made here, with no download: byte-level BPE trained on the
    offline corpus (helpers.data), with ``<|endoftext|>`` as its end, padding and start token. It
    saves and loads like any Hub tokenizer (``save_pretrained`` / ``AutoTokenizer.from_pretrained``)."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from helpers import data

    end = "<|endoftext|>"
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[end], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = data.offline_corpus(200_000, seed=seed)
    tok.train_from_iterator(text.splitlines(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=end, eos_token=end, pad_token=end,
                                   unk_token=end, model_max_length=1024)


def save_offline_model(folder: str | os.PathLike, shape: str = "tiny", seed: int = 0) -> Path:
    """Write a model folder that ``from_pretrained`` loads offline, as it would a Hub checkpoint:
    a freshly initialised model of a kit ``shape`` (config.json + safetensors weights) and the
    :func:`offline_tokenizer`. Notebooks point ``MODEL_NAME`` at it when the Hub cannot be reached;
    tests use it to exercise the Hub path without a network. Returns the folder."""
    folder = Path(folder)
    tokenizer = offline_tokenizer(seed=seed)
    model = build_model(gpt2_config(shape, vocab_size=len(tokenizer)), seed=seed)
    model.config.bos_token_id = model.config.eos_token_id = model.config.pad_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


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
