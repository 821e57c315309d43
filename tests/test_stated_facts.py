"""What the notebooks state as fact, held to the kit's estimator and to DeepSpeed 0.19.8's and
transformers 5.24's own code (issue 27, item 5): each test reads the statement where it is made
(a notebook's text or the helper that prints it) and fails when the two part."""

from __future__ import annotations

import dataclasses
import json
import re

import lesson_code
from helpers import memory
from helpers.lessons import gpu_check
from tools import nbtool
from tools.stated_figures import canonical_figures, disagreements, figures_by_meaning


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

    ns = lesson_namespace("07_engine_and_accelerate", "ds_config = {", WORK_DIR=str(tmp_path),
                          PRECISION="fp32")
    ns08 = lesson_namespace("08_beyond_data_parallelism", "def ds_config(", PRECISION="fp32")
    schedulers = {
        "notebook 07's ds_config": ns["ds_config"]["scheduler"],
        **{f"notebook 08's ds_config ({layout})": ns08["ds_config"](layout, 2)["scheduler"]
           for layout in ("dense", "pipeline", "moe", "autotp")},
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


def test_the_training_arguments_ask_for_checkpointing_without_a_future_warning(tmp_path):
    """TrainingArguments(gradient_checkpointing=...) prints a FutureWarning in transformers 5.24:
    notebook 04's lesson uses the name transformers asks for, and the model's checkpointing is
    switched on all the same."""
    import warnings

    from transformers import TrainingArguments

    with warnings.catch_warnings(record=True) as caught:  # the fact: the old name warns
        warnings.simplefilter("always")
        TrainingArguments(output_dir=str(tmp_path), gradient_checkpointing=True, use_cpu=True)
    assert any(issubclass(w.category, FutureWarning) and "gradient_checkpointing" in str(w.message)
               for w in caught)

    namespace = lesson_code.lesson_functions(
        "04_zero2_training", ["training_args"], OUT_DIR=str(tmp_path), ds_config=None,
        MICRO_BATCH=2, STEPS=4, LR=1e-3, PRECISION="fp32", GRAD_CKPT=True,
        torch=__import__("torch"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = {"notebook 04": namespace["training_args"]()}
    assert not [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    for where, args in made.items():
        assert args.activation_checkpointing is True, where


# ---- what each stage keeps: notebook 05's table against notebook 04's picture ---------------------------


def stage_table(stem: str) -> dict[int, str]:
    """{stage: "each GPU holds" expression} from the markdown table whose rows start ``| 0 |``."""
    rows = re.findall(r"^\|\s*([0-3])\s*\|\s*([^|]+?)\s*\|", markdown(stem), flags=re.M)
    return {int(stage): expression for stage, expression in rows}


def test_notebook_05s_table_of_stages_is_notebook_04s_picture():
    """Stage 1's gradients: notebook 05's table once said 2 + 2 + 12/N (the ZeRO paper's stage 1)
    while notebook 04's picture, drawn from the kit's estimator, halves them (DeepSpeed's stage 1
    reduce-scatters at the end of backward, measured on 2 GPUs). The table's expressions, at
    N = 1, 2 and 4, must be the picture's bytes per parameter on each GPU."""
    from helpers.lessons import zero2_training

    table = stage_table("05_stages_and_offload")
    assert sorted(table) == [0, 1, 2, 3], table
    info = memory.ModelInfo.for_shape("gpt2-124m")
    for n in (1, 2, 4):
        picture = zero2_training.model_states(info, n)
        for stage, expression in table.items():
            drawn = sum(picture[f"stage {stage}"]["gpu"].values()) / info.n_params
            said = eval(expression.replace("N", str(n)), {})  # "2 + 2/N + 12/N"
            assert abs(said - drawn) < 0.05, f"stage {stage}, N={n}: table {expression} = {said}, picture {drawn:.2f}"


# ---- ZeRO-2 + CPU offload on the GPU: twice the fp16 weights -------------------------------------------


def test_zero2_offload_keeps_gradients_on_the_gpu_at_its_peak_and_notebook_05_says_so():
    """Notebook 05 once said the GPU keeps only the fp16 weights under ZeRO-2 + CPU offload; the
    docs/deepspeed_gaps.md's measurement (1.5B: 5.87 GiB) and the estimator have every fp16 gradient there too at
    the end of backward. And its host-RAM figure is the estimator's (notebook 01's breakdown)."""
    info = memory.ModelInfo.for_shape("gpt2-355m")
    config = {"fp16": {"enabled": True},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    est = memory.estimate(info, config, micro_batch=1, seq_len=64)  # model states set the peak
    gpu = est.parts["gpu"]
    assert est.phase["gpu"] == "after backward" and gpu["grads"] == gpu["params"] == 2 * info.n_params
    text = markdown("05_stages_and_offload")
    assert "twice the fp16 weights" in text
    assert not re.search(r"keeps only (the )?fp16 weights", text)
    plain, pinned = (sum(gpu_check.offload_host_bytes_per_param(pin).values()) for pin in (False, True))
    assert f"{plain:g} bytes per parameter" in text and f"{pinned:g} with pinned" in text


# ---- GB and GiB: never set against each other unconverted ------------------------------------------------

_GB = re.compile(r"(\d[\d.,]*)\s*GB\b")


def unconverted_gb(line: str) -> list[str]:
    """The "N GB" figures of a line that also speaks GiB, outside an "(= N GB)" conversion."""
    if "GiB" not in line:
        return []
    return [m.group(0) for m in _GB.finditer(re.sub(r"\(= [^)]*\)", "", line))]


def test_a_line_in_gib_converts_its_gb_figures():
    assert unconverted_gb("host RSS 3.2 GB of a T4's 15 GiB") == ["3.2 GB"]
    assert unconverted_gb("host RSS 3.20 GiB of free Colab's 11.8 GiB (= 12.7 GB)") == []
    assert unconverted_gb("12.7 GB of RAM") == []  # one unit: nothing to mix


def test_notebook_04s_lines_and_notebook_05s_ram_axis_keep_one_unit(tmp_path):
    """Notebook 04's memory line once set 'X GiB of a T4's 15' beside 'Y GB of free Colab's 12.7',
    and notebook 05's host-RAM bars (GiB) a line labelled '12.7 GB' drawn at 11.8."""
    import matplotlib

    matplotlib.use("agg")
    from helpers import env, runner
    from helpers.lessons import stages_and_offload, zero2_training

    machine = dataclasses.replace(env.describe(), gpu_name="Tesla T4")  # the GPU line too
    records = [{"loss": 5.0 - i, "tokens_per_s": 100.0, "host_rss_bytes": 3 * 2**30,
                "gpu_peak_bytes": 2**30, "skipped_steps": 0} for i in range(3)]
    run = zero2_training.TrainRun("ok", records=records, seconds=1.0, micro_batch=2)
    advice = "out of GPU memory at micro batch 1024: lower per_device_train_batch_size"
    lines = zero2_training.takeaways(run, machine, 0.0, True, advice, "zero2.json", (4.9, 3.7))
    lines += [" ".join(row) for row in zero2_training.summary_table(run, machine).rows]
    assert not [(line, unconverted_gb(line)) for line in lines if unconverted_gb(line)]

    result = runner.RunResult("stage 0", runner.OK, "", losses=[5.0, 4.0, 3.0], median_step_s=1.0,
                              peak_host_rss_bytes=3 * 2**30)
    rows = [runner.Row("stage 0", {"stage": 0}, None, result, None)]
    no_gpu = dataclasses.replace(machine, gpu_name=None)  # the host figure comes first
    host = stages_and_offload.plot(rows, no_gpu)[0].axes[0]
    limit = next(line for line in host.get_lines() if line.get_linestyle() == "--")
    assert host.get_ylabel() == "GiB"
    assert f"{limit.get_ydata()[0]:.1f} GiB" in limit.get_label() and not unconverted_gb(limit.get_label())


def test_what_notebooks_04_and_06_print_on_a_gpu_names_each_memory_figure_as_the_profile_does():
    """On the GPU (never on a CPU) 04's table and summary and 06's GPU claim printed the allocator's
    14.68 GiB as "a T4's", beside 01's "a T4's 14.75 GiB": the plugin failed both notebooks."""
    from helpers import env
    from helpers.lessons import biggest_model, zero2_training

    machine = dataclasses.replace(env.describe(), gpu_name="NVIDIA H100", gpu_count=1,
                                  emulation=env.EMULATIONS["t4"],
                                  gpu_cap_bytes=env.EMULATIONS["t4"].gpu_cap_bytes)
    records = [{"loss": 5.0 - i, "tokens_per_s": 100.0, "host_rss_bytes": 3 * 2**30,
                "gpu_peak_bytes": 2**30, "skipped_steps": 0} for i in range(3)]
    run = zero2_training.TrainRun("ok", records=records, seconds=1.0, micro_batch=2)
    lines = zero2_training.takeaways(run, machine, 0.0, True, "out of GPU memory", "zero2.json",
                                     (4.9, 3.7))
    lines += [" ".join(map(str, row)) for row in zero2_training.summary_table(run, machine).rows]
    lines.append(biggest_model.t4_gpu_claim("peak GPU memory", 2**30, machine)[0])
    found = figures_by_meaning({"printed on a GPU": "\n".join(lines)})
    allocator = "what PyTorch's allocator has on a T4 (its memory less the CUDA context)"
    assert found[allocator] == {"14.68 GiB": ["printed on a GPU"] * 3}, found
    assert not disagreements(found)


# ---- notebook 03: the form's config as the lesson's dict --------------------------------------------------


def test_notebook_03s_lesson_dict_is_the_forms_first_config_and_the_printer_round_trips(tmp_path):
    """The lesson cell holds the form's first settings, written by config_as_python (so the cell
    that prints the form's config prints code of the lesson's shape); what the printer writes is
    code that gives the same dict back, for other settings too, within the kit's line width."""
    from helpers import env
    from helpers.lessons import config_builder

    ns = lesson_namespace("03_config_builder", "ds_config = {", WORK_DIR=str(tmp_path))
    form = config_builder.ConfigForm(env.describe(), shape=ns["SHAPE"], micro_batch=ns["MICRO_BATCH"],
                                     seq_len=ns["SEQ_LEN"], folder=tmp_path)
    assert ns["ds_config"] == form.config
    assert json.loads((tmp_path / "ds_config.json").read_text()) == form.config
    for settings in ({}, {"stage": 3, "offload_optimizer": "nvme", "offload_param": "cpu"},
                     {"trainer": False, "precision": "fp16", "micro_batch": 3}):
        form.set(**settings)
        source = config_builder.config_as_python(form.config)
        printed: dict = {}
        exec(source, printed)
        assert printed["ds_config"] == form.config, settings
        assert max(len(line) for line in source.splitlines()) <= config_builder.CODE_WIDTH


# ---- one value per meaning: the memory figures a learner reads ------------------------------
def learner_texts() -> dict[str, str]:
    """What a learner reads: every notebook cell, the README, and the helpers' strings (messages,
    help texts, docstrings: comments are left out)."""
    import ast
    from pathlib import Path

    root = nbtool.NOTEBOOKS.parent
    texts = {}
    for path in sorted(nbtool.NOTEBOOKS.glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            texts[f"{path.stem}[{i}]"] = nbtool.source(cell)
    texts["README.md"] = (root / "README.md").read_text()
    for path in sorted(Path(root / "helpers").rglob("*.py")):
        strings = [node.value for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)]
        texts[str(path.relative_to(root))] = "\n".join(strings)
    return texts


def test_each_memory_figure_a_learner_reads_has_one_value_the_kits_t4_profile():
    """Notebook 05 once said a T4 has '15 GiB', 09 '14.7 GiB' and 01 '14.75 GiB', for one thing."""
    found = figures_by_meaning(learner_texts())
    assert all(found.values()), f"a meaning no text states (its phrases are out of date): {found}"
    assert not disagreements(found)


def test_the_figure_check_finds_each_way_a_figure_went_wrong():
    bad = {"a": "caps the GPU at a T4's 15 GiB",
           "b": "a free T4 (14.7 GiB of GPU for PyTorch, about",
           "c": "on free Colab (11.5 GB) RAM runs out",
           "d": "12.7 GB less about 1.4 GB that the VM uses",
           "e": "about 10.7 GiB of RAM left for a run",
           # what notebooks 04 and 06 printed on the GPU: the allocator's cap under a T4's name
           "f": "peak GPU memory 3.08 GiB of a T4's 14.68 GiB",
           "g": "peak GPU memory within the 14.75 GiB PyTorch has on a T4 (T4 emulation)"}
    found = figures_by_meaning(bad)
    allocator = "what PyTorch's allocator has on a T4 (its memory less the CUDA context)"
    assert found == {"a T4's GPU memory, as CUDA reports it": {"15 GiB": ["a"], "14.7 GiB": ["b"],
                                                               "14.68 GiB": ["f"]},
                     allocator: {"14.75 GiB": ["g"]},
                     "free Colab's RAM": {"11.5 GB": ["c"]},
                     "the VM's own use of that RAM": {"1.4 GB": ["d"]},
                     "the RAM a run has on free Colab": {"10.7 GiB": ["e"]}}
    allowed = canonical_figures()
    assert not any(set(figures) & allowed[meaning] for meaning, figures in found.items())
    assert len(disagreements(found)) == 7 and "15 GiB in a (the kit's T4 profile: 14.75 GiB)" in \
        disagreements(found)[0]
    assert "14.75 GiB in g (the kit's T4 profile: 14.68 GiB)" in disagreements(found)[3]
    good = {"f": "peak GPU memory 3.08 GiB of the 14.68 GiB PyTorch has on a T4",
            "g": "a T4's 14.75 GiB less the 0.07 GiB CUDA context"}
    assert not disagreements(figures_by_meaning(good))


def _notebook(path, *lines: str) -> None:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
              "outputs": [], "source": line} for i, line in enumerate(lines)]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))


def test_printed_figures_read_back_in_the_cells_order_whichever_process_wrote_first(tmp_path):
    """Two workers write in either order (their files are named by pid): the cells and the listing
    come back the same (CI once listed '15 GiB' before '14.75 GiB' and failed the test below)."""
    from tools import stated_figures

    (tmp_path / "9.jsonl").write_text(json.dumps({"where": "a: Cell 1", "text": "x"}) + "\n")
    (tmp_path / "10.jsonl").write_text(json.dumps({"where": "b: Cell 1", "text": "y"}) + "\n")
    assert list(stated_figures.read_printed(tmp_path)) == ["a: Cell 1", "b: Cell 1"]


def test_a_notebook_that_prints_a_figure_the_profile_disagrees_with_fails_the_session(tmp_path):
    """The plugin reads what nbval's kernels printed, in two worker processes as CI runs them."""
    import os
    import subprocess
    import sys

    _notebook(tmp_path / "good.ipynb", "print(\"free Colab's 12.7 GB of RAM\")",
              "from IPython.display import Markdown; Markdown(\"a T4's 14.75 GiB\")")
    _notebook(tmp_path / "bad.ipynb", "print('x')", "print(\"capped at a T4's 15 GiB\")")
    root = str(nbtool.NOTEBOOKS.parent)
    environment = {**os.environ,
                   "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    environment.pop("KIT_PRINTED_FIGURES_DIR", None)

    def session(*notebooks: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "tools.stated_figures", "-q",
                               "--nbval-lax", "-n", "2", "-p", "no:cacheprovider", *notebooks],
                              cwd=tmp_path, env=environment, capture_output=True, text=True,
                              timeout=600)

    bad = session("good.ipynb", "bad.ipynb")
    assert bad.returncode == 1 and "4 passed" in bad.stdout, bad.stdout[-3000:]
    assert "a T4's GPU memory, as CUDA reports it: 15 GiB in bad: Cell 1" in bad.stdout
    listed = "a T4's GPU memory, as CUDA reports it: 14.75 GiB in 1 cell(s); 15 GiB in 1 cell(s)"
    assert listed in bad.stdout
    good = session("good.ipynb")
    assert good.returncode == 0 and "disagree" not in good.stdout, good.stdout[-3000:]
