"""What the notebooks state as fact, held to the kit's estimator and to DeepSpeed 0.19.8's and
transformers 5.24's own code (issue 27, item 5): each test reads the statement where it is made
(a notebook's text or the helper that prints it) and fails when the two part."""

from __future__ import annotations

import json
import re

from helpers import memory
from helpers.lessons import gpu_check
from tools import nbtool


def markdown(stem: str) -> str:
    """Every markdown cell of a notebook, joined."""
    cells = json.loads((nbtool.NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]
    return "\n".join(nbtool.source(c) for c in cells if c["cell_type"] == "markdown")


# ---- pinned host memory: notebook 01 against helpers.memory ------------------------------------------


def test_notebook_01s_bytes_per_parameter_are_the_estimators():
    """Notebook 01 once said 2 bytes per parameter for pinned buffers where the estimator counts 6:
    its verdict now prints the estimator's own figures, which must add up to the limit's slope."""
    for pin in (False, True):
        kinds = gpu_check.offload_host_bytes_per_param(pin)
        low, high = (memory.cpu_offload_host_bytes(n, pin) for n in (10**9, 2 * 10**9))
        assert abs(sum(kinds.values()) - (high - low) / 10**9) < 0.05, (pin, kinds)
    pinned, plain = gpu_check.offload_host_bytes_per_param(True), gpu_check.offload_host_bytes_per_param(False)
    assert pinned["pinned buffers"] == memory.HOST_PINNED_BYTES and "pinned buffers" not in plain
    sentence = gpu_check.offload_host_sentence()
    assert f"{sum(plain.values()):g} bytes" in sentence and f"{sum(pinned.values()):g} bytes" in sentence
    assert f"{memory.HOST_PINNED_BYTES:g} more for pinned" in sentence


def test_notebook_01s_text_states_no_byte_count_of_its_own():
    """The figures come from the printed verdict only: no 'N bytes' or 'N more if ... pinned' in the
    prose, where they could drift from the estimator again."""
    text = markdown("01_gpu_check_and_install")
    assert not re.search(r"\d+ bytes|\d+ more if", text), re.findall(r".{40}\d+ (?:bytes|more if).{20}", text)


# ---- notebook 07: the lesson's config, run as the lesson runs it --------------------------------------


def lesson_namespace(stem: str, marker: str, **injected) -> dict:
    """A notebook's parameters cell, then ``injected`` (as papermill would), then the first lesson
    cell containing ``marker``, executed in one namespace, which is returned."""
    cells = json.loads((nbtool.NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]
    tagged = lambda tag: [nbtool.source(c) for c in cells
                          if c["cell_type"] == "code" and tag in c["metadata"].get("tags", [])]
    namespace: dict = {}
    exec(tagged("parameters")[0], namespace)
    namespace.update(injected)
    exec(next(s for s in tagged("lesson") if marker in s), namespace)
    return namespace


def lrs_of_first_steps(scheduler_params: dict, steps: int = 3) -> list[float]:
    """The learning rate each of the first ``steps`` optimizer steps runs at under DeepSpeed's
    WarmupLR, stepped as the engine steps it (after each optimizer step)."""
    import torch
    from deepspeed.runtime.lr_schedules import WarmupLR

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = WarmupLR(optimizer, **scheduler_params)
    seen = []
    for _ in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])  # what optimizer.step() would use
        scheduler.step()
    return seen


def test_warmup_lr_starting_at_zero_wastes_two_steps():
    """The fact the configs below avoid, from DeepSpeed's own scheduler."""
    lrs = lrs_of_first_steps({"warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 4,
                              "warmup_type": "linear"})
    assert lrs[:2] == [0.0, 0.0] and lrs[2] > 0


def test_every_warmup_the_kit_writes_learns_from_the_first_step(tmp_path):
    from helpers import config
    from helpers.lessons import beyond_data_parallelism

    ns = lesson_namespace("07_engine_and_accelerate", "ds_config = {", WORK_DIR=str(tmp_path),
                          PRECISION="fp32")
    schedulers = {
        "notebook 07's ds_config": ns["ds_config"]["scheduler"],
        "notebook 08's engine_config": beyond_data_parallelism.engine_config(
            4, 1, 1, "fp32", 1e-3, 4)["scheduler"],
        "helpers.config.build": config.build(stage=2, micro_batch=4, trainer=False,
                                             warmup_steps=4)["scheduler"],
    }
    for where, scheduler in schedulers.items():
        assert scheduler["type"] == "WarmupLR", where
        lrs = lrs_of_first_steps(scheduler["params"])
        assert all(lr > 0 for lr in lrs), f"{where}: first steps at learning rates {lrs}"


# ---- notebook 07: STAGE 0 against zero_to_fp32 --------------------------------------------------------

#: One process trains a Linear layer one step at the given ZeRO stage, saves a DeepSpeed checkpoint
#: and asks zero_to_fp32 for the state dict; it prints "converted" or the exception's type.
_ZERO_TO_FP32_SCRIPT = """
import os, sys, torch, deepspeed
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], RANK="0", LOCAL_RANK="0",
                  WORLD_SIZE="1")
model = torch.nn.Linear(8, 8)
config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": int(sys.argv[1])},
          "zero_allow_untested_optimizer": True, "steps_per_print": 10**6}
engine, *_ = deepspeed.initialize(model=model, config=config,
                                  optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
loss = engine(torch.randn(2, 8)).pow(2).mean()
engine.backward(loss)
engine.step()
engine.save_checkpoint(sys.argv[2])
try:
    state = get_fp32_state_dict_from_zero_checkpoint(sys.argv[2])
    print("converted", sorted(state))
except Exception as error:
    print("failed", type(error).__name__, error)
"""


def test_notebook_07_refuses_stage_0_where_zero_to_fp32_fails(tmp_path):
    """Notebook 07's parameters once allowed STAGE = 0, whose checkpoint DeepSpeed's zero_to_fp32
    cannot read: the fact (a real stage-0 checkpoint fails, a stage-1 one converts), then the
    lesson's config cell refusing stage 0 and taking 1."""
    import socket
    import subprocess
    import sys

    import pytest

    results = {}
    for stage in (0, 1):
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        done = subprocess.run([sys.executable, "-c", _ZERO_TO_FP32_SCRIPT, str(stage),
                               str(tmp_path / f"stage{stage}"), str(port)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        results[stage] = done.stdout.strip().splitlines()[-1]
    assert results[0] == "failed TypeError 'NoneType' object is not iterable", results[0]
    assert results[1].startswith("converted") and "weight" in results[1]

    with pytest.raises(ValueError, match="zero_to_fp32"):
        lesson_namespace("07_engine_and_accelerate", "ds_config = {", WORK_DIR=str(tmp_path),
                         PRECISION="fp32", STAGE=0)
    ns = lesson_namespace("07_engine_and_accelerate", "ds_config = {", WORK_DIR=str(tmp_path),
                          PRECISION="fp32", STAGE=1)
    assert ns["ds_config"]["zero_optimization"]["stage"] == 1


# ---- transformers 5.24: gradient checkpointing by its new name -----------------------------------------


def definitions(source: str) -> str:
    """A cell's imports, functions and UPPER_CASE assignments, without the statements that run."""
    import ast

    keep = [node for node in ast.parse(source).body
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))
            or isinstance(node, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)]
    return "\n".join(ast.unparse(node) for node in keep)


def test_the_training_arguments_ask_for_checkpointing_without_a_future_warning(tmp_path):
    """TrainingArguments(gradient_checkpointing=...) prints a FutureWarning in transformers 5.24:
    notebook 04's lesson and the kit's own arguments use the name transformers asks for, and the
    model's checkpointing is switched on all the same."""
    import warnings

    from transformers import TrainingArguments

    from helpers.lessons import zero2_training

    with warnings.catch_warnings(record=True) as caught:  # the fact: the old name warns
        warnings.simplefilter("always")
        TrainingArguments(output_dir=str(tmp_path), gradient_checkpointing=True, use_cpu=True)
    assert any(issubclass(w.category, FutureWarning) and "gradient_checkpointing" in str(w.message)
               for w in caught)

    cells = json.loads((nbtool.NOTEBOOKS / "04_zero2_training.ipynb").read_text())["cells"]
    lessons = [nbtool.source(c) for c in cells if "lesson" in c["metadata"].get("tags", [])]
    namespace: dict = {}
    exec(definitions(next(s for s in lessons if "def training_args" in s)), namespace)
    namespace.update(OUT_DIR=str(tmp_path), ds_config=None, MICRO_BATCH=2, STEPS=4, LR=1e-3,
                     PRECISION="fp32", GRAD_CKPT=True, torch=__import__("torch"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = {"notebook 04": namespace["training_args"](),
                "helpers": zero2_training.training_args(tmp_path, None, 4, 2, 1e-3, "fp32",
                                                        grad_ckpt=True)}
    assert not [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    for where, args in made.items():
        assert args.activation_checkpointing is True, where
