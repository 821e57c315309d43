"""ZeRO Kit helpers: the logic behind the notebooks, one module per concern.

Modules are imported lazily by the notebooks (``from helpers import env``) so that importing the
package never pulls in torch or DeepSpeed by itself. The core modules sit at the top of helpers/;
helpers/lessons/ holds one module per notebook that needs one, named after it, a layer above.

:data:`LAYERS` is the one statement of the layers, bottom first, with what each module is for: a
module imports only from layers below its own (tests/test_layers.py enforces it, lazy imports
inside functions included), so there are no import cycles and no arrow runs back up. CONTRIBUTING.md's
layout section is rendered from it (``python tools/layout.py``; a test checks the two agree).

Importing the package sets one thing: where DeepSpeed keeps its compiled ops, when nothing else
has (``TORCH_EXTENSIONS_DIR``). The kit's folder is one per machine, shared by every clone,
notebook, test and run (``make setup`` fills it), so that no run compiles an op again.
"""

import os


def kit_cache_dir() -> str:
    """The kit's cache on this machine, read at each call: the Makefile's shared environment,
    DeepSpeed's compiled ops, notebook 06's pretrained stand-in (``ZERO_KIT_CACHE`` moves it)."""
    return os.environ.get("ZERO_KIT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                             "zero-kit")


def share_threads(workers: int) -> None:
    """Give each of ``workers`` processes running side by side (and what they start: kernels,
    runs) its share of the cores as OpenMP threads, unless ``OMP_NUM_THREADS`` is set: threads
    beyond the cores only spin (a 2-rank test under pytest-xdist ran 25% slower)."""
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(kit_cache_dir(), "torch_extensions"))

#: The layers, bottom first: each a dict of module (``lessons.X`` for helpers/lessons/X.py) to
#: what it is for, in one line.
LAYERS: list[dict[str, str]] = [
    {
        "show": "units (GiB, GB), table cells, tables (HTML and text), source, figures",
        "colab": "the repository's address, the setup cell, badges, the lock, Colab's packages",
        "deepspeed_fixes": "fixes for DeepSpeed bugs the kit meets, each run installs those it needs",
        "data": "real text offline (Python's docs), a generated corpus, blocks, the Hub's text",
        "taught": "generated from the notebooks' export cells: the lesson code the kit's runs call",
    },
    {
        "claims": "the check rules every notebook shares (a loss that falls, a tolerance)",
        "models": "the real model offline (GGUF), GPT-2 and Llama/Qwen shapes, a byte tokenizer",
    },
    {
        "env": "machine facts, T4 emulation, libaio, one-process distributed setup",
        "launch": "train.py: lesson cells exported, started by deepspeed, accelerate, torchrun",
    },
    {"memory": "the memory estimator (GPU, host RAM, NVMe); fits, tight or does not fit"},
    {"config_check": "every value DeepSpeed would reject or ignore, at its key, with the fix"},
    {"config": "build, explain, save, load; the stage and offload rows; ZeRO-Infinity's"},
    {
        "runner": "every training run, in a fresh process, 1 rank or N; what a rank holds",
        "doctor": "ds_report explained: ops, diagnoses with exact fixes; the ops prebuilt",
    },
    {"measurements": "the stored memory measurements, the estimator checked against them"},
    {"sizing": "any model's memory per stage and offload, beside DeepSpeed's estimators"},
    {"cli": "every command line: python -m helpers bench, matrix, doctor, sizing"},
    {"__main__": "python -m helpers: the command lines, and one rank of a run"},
    {
        "lessons.gpu_check": "01: is this machine ready? checks that can fail, a verdict",
        "lessons.ds_report": "02: the ops built and exercised, checked; the closing lines",
        "lessons.config_builder": "03: the config form, ten mistakes caught, the summary",
        "lessons.zero2_training": "04: the Trainer's run, save, reload, resume; the ZeRO picture",
        "lessons.stages_and_offload": "05: the stage rows checked, 2 ranks, faster offload",
        "lessons.biggest_model": "06: the model-size ladder, the disk; the fine-tune, watched",
    },
    {
        "lessons.engine_and_accelerate": "07: one config trained three ways, compared",
        "lessons.beyond_data_parallelism": "08: the lesson script's runs planned, read, checked",
        "lessons.zero_or_lora": "09: LoRA beside full fine-tuning and faster offload, measured",
    },
]
