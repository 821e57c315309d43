"""Data: an offline corpus generated on the spot (no shipped text, no download), chunking into
fixed-length blocks for causal LM training, and the Hub path (wikitext-2) with a clear fallback.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

_NAMES = ["Ada", "Grace", "Alan", "Linus", "Barbara", "Dennis", "Margaret", "Ken", "Frances", "John"]
_VERBS = ["moves", "paints", "counts", "sorts", "loads", "checks", "packs", "stacks"]
_COLOURS = ["red", "green", "blue", "yellow", "white", "black"]
_THINGS = ["boxes", "crates", "bottles", "books", "stones", "cups"]
_PLACES = ["north barn", "south shed", "east dock", "west hall", "old mill", "new store"]


def offline_corpus(n_chars: int = 200_000, seed: int = 0) -> str:
    """Generated English-like sentences with a learnable structure, ``n_chars`` long.

    A small grammar (who, what, how many, where) makes the loss fall fast and clearly, even for a
    tiny model on a CPU, while staying text a reader recognises.
    """
    rng = random.Random(seed)
    parts, size = [], 0
    while size < n_chars:
        line = (f"{rng.choice(_NAMES)} {rng.choice(_VERBS)} {rng.randint(2, 9)} {rng.choice(_COLOURS)} "
                f"{rng.choice(_THINGS)} to the {rng.choice(_PLACES)}.\n")
        parts.append(line)
        size += len(line)
    return "".join(parts)[:n_chars]


def write_offline_text(path: str | os.PathLike, n_chars: int = 200_000, seed: int = 0) -> Path:
    """Write the offline corpus to a text file (one sentence a line), for code that reads text files
    as a user's would: ``datasets.load_dataset("text", data_files=path)``. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(offline_corpus(n_chars, seed=seed))
    return path


def chunk(ids: list[int], block_size: int) -> list[list[int]]:
    """Cut a token stream into consecutive blocks of ``block_size`` (the remainder is dropped)."""
    if block_size < 2:
        raise ValueError(f"block_size must be at least 2, got {block_size}")
    n = len(ids) // block_size
    if n == 0:
        raise ValueError(f"{len(ids)} tokens are fewer than one block of {block_size}: use more text or a smaller block")
    return [ids[i * block_size:(i + 1) * block_size] for i in range(n)]


def split_held_out(text: str, fraction: float = 0.1) -> tuple[str, str]:
    """(training text, held-out text): the text's last ``fraction``, cut at a line break, is kept
    out of training to score a model on text it has not seen."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be between 0 and 1, got {fraction}")
    cut = text.rfind("\n", 0, int(len(text) * (1 - fraction))) + 1 or int(len(text) * (1 - fraction))
    return text[:cut], text[cut:]


def batches(text: str, tokenizer, block_size: int, micro_batch: int, steps: int, seed: int = 0):
    """``steps`` batches of shape (micro_batch, block_size) as tensors, cycling through the blocks."""
    import torch

    blocks = torch.tensor(chunk(tokenizer.encode(text), block_size))
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(blocks), generator=gen)
    out = []
    for step in range(steps):
        idx = torch.tensor([int(order[(step * micro_batch + j) % len(blocks)]) for j in range(micro_batch)])
        out.append(blocks[idx])
    return out


def resolve_text(path: str | None, work_dir: str | os.PathLike, n_chars: int, seed: int = 0) -> str:
    """The text file to train on: ``path`` when it exists, else the offline corpus written here."""
    if path and Path(path).is_file():
        return str(path)
    return str(write_offline_text(Path(work_dir) / "train.txt", n_chars, seed=seed))
