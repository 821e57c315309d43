"""Data: real English text that ships with Python (the offline default), a corpus generated on the
spot (for models trained from scratch), chunking into fixed-length blocks for causal LM training,
and the Hub path (wikitext-2) with a clear fallback.
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


def real_corpus(n_chars: int | None = None) -> str:
    """Real English prose with no download: the topics of Python's own documentation, which every
    CPython ships (``pydoc_data.topics``: 79 topics, about 465,000 characters), in a fixed order,
    one paragraph a line (its wrapped lines joined); the first ``n_chars`` where given, cut at a
    line's end. What the real model is fine-tuned and scored on offline."""
    import re

    from pydoc_data.topics import topics

    paragraphs = [" ".join(line.strip() for line in block.splitlines())
                  for name in sorted(topics) for block in re.split(r"\n\s*\n", topics[name])]
    text = "".join(p + "\n" for p in paragraphs if p.strip())
    if n_chars and n_chars < len(text):
        text = text[:text.rfind("\n", 0, n_chars) + 1] or text[:n_chars]
    return text


#: The offline corpora by name: real text (the default) or the generated grammar (for models
#: trained from scratch, whose loss must fall in a few CPU steps).
CORPORA = {"real": lambda n_chars, seed: real_corpus(n_chars),
           "generated": lambda n_chars, seed: offline_corpus(n_chars, seed=seed)}


def write_offline_text(path: str | os.PathLike, n_chars: int = 200_000, seed: int = 0,
                       corpus: str = "generated") -> Path:
    """Write an offline corpus (:data:`CORPORA`) to a text file (one line a row), for code that
    reads text files as a user's would: ``datasets.load_dataset("text", data_files=path)``."""
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}: choose one of {', '.join(CORPORA)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CORPORA[corpus](n_chars, seed))
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


def resolve_text(path: str | None, work_dir: str | os.PathLike, n_chars: int | None, seed: int = 0,
                 corpus: str = "real") -> str:
    """The text file to train on: ``path`` when it exists, else (no path) an offline corpus of
    :data:`CORPORA` written here (Python's documentation by default; ``n_chars`` cuts it). A path
    that names no file is refused with the fix, never silently replaced."""
    if path and Path(path).is_file():
        return str(path)
    if path:
        raise FileNotFoundError(f"TEXT_FILE {path!r} is not a file: point it at a plain-text file "
                                "(one example a line), or set it to None for the kit's corpus")
    return str(write_offline_text(Path(work_dir) / "train.txt", n_chars, seed=seed, corpus=corpus))


# ---- a Hub dataset, and its cache on a machine without network ------------------------------------


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


def _datasets_cache_folder(name: str, config_name: str, cache_dir: str | os.PathLike | None) -> Path:
    """Where ``load_dataset(name, config_name)`` keeps what it prepared (datasets'
    CachedDatasetModuleFactory reads ``NAMESPACE___NAME/CONFIG/VERSION/HASH/``)."""
    from datasets import config
    from datasets.naming import camelcase_to_snakecase

    parts = name.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    return Path(cache_dir or config.HF_DATASETS_CACHE) / "___".join(parts) / config_name


def datasets_cached(name: str, config_name: str, cache_dir: str | os.PathLike | None = None) -> bool:
    """True when this machine's datasets cache holds ``name``'s configuration, prepared by an earlier
    ``load_dataset``: then ``load_dataset(name, config_name)`` works with HF_HUB_OFFLINE=1."""
    folder = _datasets_cache_folder(name, config_name, cache_dir)
    return any(p.is_dir() for p in folder.glob("*/*"))


def write_datasets_cache(text_file: str | os.PathLike, name: str, config_name: str,
                         cache_dir: str | os.PathLike | None = None) -> Path:
    """Lay a plain-text file out as ``load_dataset(name, config_name)`` leaves a Hub dataset once
    downloaded (a "text" column, split "train"), so that the same call finds it with no network
    (HF_HUB_OFFLINE=1, ``HF_DATASETS_CACHE=cache_dir``): how the kit tests the Hub-name path
    offline, and a way to carry a dataset to a machine without network. Returns the folder."""
    import json
    import shutil
    import tempfile

    import datasets

    with tempfile.TemporaryDirectory() as work:
        builder = datasets.load_dataset_builder("text", data_files=str(text_file), cache_dir=work)
        builder.download_and_prepare()
        prepared = Path(builder.cache_dir)
        short = name.split("/")[-1]
        folder = _datasets_cache_folder(name, config_name, cache_dir) / "0.0.0" / prepared.name
        folder.mkdir(parents=True, exist_ok=True)
        for arrow in prepared.glob("*.arrow"):
            shutil.copy(arrow, folder / arrow.name.replace("text-", f"{short}-", 1))
        info = json.loads((prepared / "dataset_info.json").read_text())
        info.update(config_name=config_name, dataset_name=short)
        (folder / "dataset_info.json").write_text(json.dumps(info))
    return folder


def resolve_text_source(dataset: tuple[str, str] | None, text_file: str | None,
                        work_dir: str | os.PathLike, n_chars: int,
                        seed: int = 0) -> tuple[tuple[str, str] | None, str | None, str]:
    """(the Hub dataset to load or None, the text file to load or None, a one-line note saying why).

    Your ``text_file`` wins where given (refused when it names no file); else ``dataset`` (a Hub
    name and configuration) where this machine's datasets cache holds it or the Hub answers; else
    the kit's offline corpus, written to ``work_dir`` (CI and the GPU machine have no network).
    """
    if text_file:
        return None, resolve_text(text_file, work_dir, n_chars, seed), f"text: your file {text_file}"
    if dataset:
        name, config_name = dataset
        if datasets_cached(name, config_name):
            return tuple(dataset), None, f"text: {name} ({config_name}) from this machine's datasets cache"
        if hub_reachable():
            return tuple(dataset), None, f"text: {name} ({config_name}) from the Hugging Face Hub"
    corpus = resolve_text(None, work_dir, n_chars, seed, corpus="generated")
    why = f"{dataset[0]} cannot be loaded: the Hub cannot be reached" if dataset else "no DATASET"
    return None, corpus, f"text: the kit's offline corpus, {n_chars:,} characters, at {corpus} ({why})"
