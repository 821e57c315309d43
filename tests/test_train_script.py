"""Notebook 07's train.py (issue 27, item 4): the parameters cell and the lesson cells exported as the
script a learner launches, started with the deepspeed launcher and with ``accelerate launch`` and an
Accelerate YAML config, with two CPU ranks in smoke mode, each printing the engine losses of one
process; and the pieces around it, fed good and bad input."""

from __future__ import annotations

import math

import pytest

from helpers import claims, launch
from helpers.lessons import engine_and_accelerate as lesson
from tests.test_lesson_scripts import lesson_script as guarded_script


def test_train_py_is_the_lesson_script_the_lesson_test_runs():
    """The export and the lesson-script test build the same script: the parameters cell, the
    values after it, the lesson cells in order (the test adds its guard against the kit first)."""
    values = {"MODEL_NAME": "/m", "TEXT_FILE": "/t.txt", "WORK_DIR": "/w"}
    parts = lambda script: [part.split("\n", 1)[1] for part in script.split("# %% [")[1:]]
    exported, tested = parts(launch.lesson_script(lesson.NOTEBOOK, values)), parts(
        guarded_script(lesson.NOTEBOOK, values))
    assert "class _OnlyTheFixes" in tested[0] and "_OnlyTheFixes" not in "".join(exported)
    assert tested[1] == exported[0] and tested[3:] == exported[2:]  # parameters; lesson cells
    assert "MODEL_NAME = '/m'" in exported[1] and "WORK_DIR = '/w'" in exported[1]


def test_the_accelerate_yaml_names_nothing_accelerate_refuses_beside_a_deepspeed_config():
    yaml = launch.accelerate_yaml(2, use_cpu=True)
    assert "distributed_type: DEEPSPEED" in yaml and "num_processes: 2" in yaml and "use_cpu: true" in yaml
    assert "mixed_precision" not in yaml and "zero_stage" not in yaml


def test_launched_losses_are_read_from_interleaved_ranks():
    out = ("engine losses: engine losses: [6.0, 5.5, 5.0][6.0, 5.5, 5.0]\n"
           "trainer losses: trainer losses:[6.1, 5.6] [6.1, 5.6]\n")
    assert launch.launched_losses(out, "engine") == [6.0, 5.5, 5.0]
    assert launch.launched_losses("no losses here", "engine") == []


def _launched(name, code=0, losses=(6.0, 5.5, 5.0)):
    return launch.Launched(name, code, list(losses), 1.0, "")


@pytest.mark.parametrize("runs", [
    [_launched("deepspeed", code=1), _launched("accelerate launch")],
    [_launched("deepspeed"), _launched("accelerate launch", losses=(6.0, 5.9, 5.8))],
    [_launched("deepspeed"), _launched("accelerate launch", losses=(6.0, 5.5))],
    [_launched("deepspeed")],
    [_launched("deepspeed", losses=(6.0, math.nan, 5.0)), _launched("accelerate launch")],
])
def test_a_bad_launch_fails_its_claims(runs):
    assert claims.failed(lesson.launch_claims(runs, [6.0, 5.5, 5.0], "fp32"))


def test_a_good_launch_passes():
    runs = [_launched("deepspeed"), _launched("accelerate launch")]
    assert claims.failed(lesson.launch_claims(runs, [6.0, 5.5, 5.0], "fp32")) == []


def test_train_py_runs_under_both_launchers_with_two_cpu_ranks(tmp_path):
    """Smoke mode, two CPU ranks (gloo), offline: each launcher exits 0 and its engine prints the
    losses of the same script run as one plain process (same data on every rank)."""
    import os
    import subprocess
    import sys

    from helpers import data, models

    model = models.save_offline_model(tmp_path / "model", "tiny")
    text = data.write_offline_text(tmp_path / "train.txt", 60_000)
    values = {"MODEL_NAME": str(model), "TEXT_FILE": str(text), "PRECISION": "fp32"}
    one = tmp_path / "one"
    script = lesson.write_train_script(one, {**values, "WORK_DIR": str(one)})
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(KIT_SMOKE="1", HF_HUB_OFFLINE="1", TQDM_DISABLE="1", OMP_NUM_THREADS="1")
    single = subprocess.run([sys.executable, str(script)], cwd=one, env=env, capture_output=True,
                            text=True, timeout=900)
    assert single.returncode == 0, (single.stdout + single.stderr)[-3000:]
    reference = launch.launched_losses(single.stdout, "engine")

    launched_dir = tmp_path / "launched"
    script = lesson.write_train_script(launched_dir, {**values, "WORK_DIR": str(launched_dir)})
    yaml_file = launched_dir / "accelerate.yaml"
    yaml_file.write_text(launch.accelerate_yaml(2, use_cpu=True))
    runs = []
    commands = launch.launch_commands(script, yaml_file, 2, launch.free_ports())
    for launcher, command in commands.items():
        log_file = launched_dir / f"{launcher.split()[0]}.log"
        line = f"cd {launched_dir} && {launch.NOTEBOOK_LAUNCH_ENV} {command} > {log_file} 2>&1"
        done = subprocess.run(["bash", "-c", line], env=env, timeout=900)  # as the notebook's "!"
        runs.append(lesson.launched(launcher, done.returncode, log_file, 0.0))
    failed = claims.failed(lesson.launch_claims(runs, reference, "fp32"))
    assert not failed, (failed, [r.tail[-1500:] for r in runs])


def test_the_launchers_are_found_beside_python_or_on_path(monkeypatch, tmp_path):
    assert launch.command_path("deepspeed").endswith("deepspeed")
    monkeypatch.setattr(launch.sys, "executable", str(tmp_path / "python3"))  # Colab: /usr/bin
    monkeypatch.setattr(launch.shutil, "which", lambda name: f"/usr/local/bin/{name}")
    assert launch.command_path("accelerate") == "/usr/local/bin/accelerate"
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    assert launch.command_path("accelerate") == "accelerate"


def test_parameter_values_are_the_parameters_cells_names_with_a_kernels_literal_values():
    """What notebook 08 writes after its parameters cell: the names that cell assigns, with the
    kernel's values; a value that is no literal (an object) is left to the cell."""
    from helpers.lessons import beyond_data_parallelism as notebook_08

    kernel = {"LAYERS": 3, "SMOKE": True, "WORK_DIR": "/w", "EMULATE": None, "torch": object(),
              "TP_MODEL": object(), "SEQ_LEN": (64,), "not_a_parameter": 1}
    assert launch.parameter_values(notebook_08.NOTEBOOK, kernel) == {
        "LAYERS": 3, "SMOKE": True, "WORK_DIR": "/w", "EMULATE": None, "SEQ_LEN": (64,)}


def test_the_torchrun_command_starts_the_script_in_n_processes(tmp_path):
    command = launch.torchrun_command(tmp_path / "train.py", 2, 29511)
    assert "torchrun --nproc-per-node 2 --master-port 29511 " in command
    assert command.endswith(f"{tmp_path}/train.py")


# ---- notebook 04's train.py: the Trainer under both launchers ------------------------------------
FIRST = {1: 6.0, 2: 5.5, 3: 5.0, 4: 4.6}


def _trainer_run(name, code=0, losses=(6.0, 5.5, 5.0, 4.6)):
    return launch.Launched(name, code, list(losses), 1.0, "")


@pytest.mark.parametrize("processes, runs", [
    (1, [_trainer_run("deepspeed", code=1), _trainer_run("accelerate launch")]),
    (1, [_trainer_run("deepspeed"), _trainer_run("accelerate launch", losses=(6.0, 5.5, 5.0, 4.9))]),
    (1, [_trainer_run("deepspeed"), _trainer_run("accelerate launch", losses=(6.0, 5.5, 5.0))]),
    (1, [_trainer_run("deepspeed")]),
    (1, [_trainer_run("deepspeed"), _trainer_run("accelerate launch", losses=())]),
    (2, [_trainer_run("deepspeed"), _trainer_run("accelerate launch", losses=(6.0, 6.1, 6.2, 6.3))]),
    (2, [_trainer_run("deepspeed"), _trainer_run("accelerate launch", losses=(6.0, 5.0, 4.0))]),
])
def test_a_bad_trainer_launch_fails_notebook_04s_claims(processes, runs):
    from helpers.lessons import zero2_training

    assert claims.failed(zero2_training.launch_claims(runs, FIRST, "fp32", processes))


def test_a_failed_launch_quotes_the_end_of_its_log():
    """A CI log shows only the failed claims: the launch's own last lines must be in one."""
    from helpers.lessons import zero2_training

    tail = "\n".join(f"line {i}" for i in range(40)) + "\nRuntimeError: gloo: connection closed"
    runs = [launch.Launched("deepspeed", -122, [], 1.0, tail), _trainer_run("accelerate launch")]
    bad = claims.failed(zero2_training.launch_claims(runs, FIRST, "fp32", 1))
    quoted = [b for b in bad if "exit code -122" in b]
    assert quoted and "RuntimeError: gloo: connection closed" in quoted[0]
    assert "line 0\n" not in quoted[0]  # the end, not the whole log
    good = claims.failed(zero2_training.launch_claims([_trainer_run("deepspeed"),
                                                        _trainer_run("accelerate launch")],
                                                       FIRST, "fp32", 1))
    assert not any("log ends" in b for b in good)


@pytest.mark.parametrize("module", ["zero2_training", "engine_and_accelerate"])
def test_reading_a_launch_frees_the_ended_ranks_shm_buffers(module, monkeypatch, tmp_path):
    """Notebooks 04 and 07 launch two CPU ranks; DeepSpeed leaves each rank's all-reduce buffer in
    RAM (/dev/shm), so each notebook's reader of a launch must free them (helpers.env)."""
    import importlib

    from helpers import env

    lesson_module = importlib.import_module(f"helpers.lessons.{module}")
    freed = []
    monkeypatch.setattr(env, "remove_ended_shm_buffers", lambda: freed.append(True) or 0)
    log = tmp_path / "launch.log"
    log.write_text("")
    lesson_module.launched("deepspeed", 0, log, 1.0)
    assert freed == [True]


@pytest.mark.parametrize("processes, other", [(1, (6.0, 5.5, 5.0, 4.6)), (2, (6.2, 5.1, 4.4, 4.0))])
def test_a_good_trainer_launch_passes_notebook_04s_claims(processes, other):
    """One process: the notebook's losses; two ranks: other batches, a loss that falls."""
    from helpers.lessons import zero2_training

    runs = [_trainer_run("deepspeed", losses=other), _trainer_run("accelerate launch", losses=other)]
    assert claims.failed(zero2_training.launch_claims(runs, FIRST, "fp32", processes)) == []


@pytest.mark.parametrize("losses, held", [
    ((6.0, 5.6, 5.1, 4.7), True),    # parted mid-run by 2%, ends within 5%
    ((6.0, 5.5, 5.0, 4.8), True),    # ends 4.3% higher
    ((6.1, 5.5, 5.0, 4.6), False),   # another first loss: other weights or another batch
    ((6.0, 5.5, 5.2, 5.0), False),   # ends 8.7% higher
    ((6.0, 6.5, 5.0, 4.6), False),   # rose above its first loss
])
def test_one_fp16_process_holds_the_first_loss_and_the_end(losses, held):
    """In fp16 a launched process must start where the notebook did and end near it."""
    from helpers.lessons import zero2_training

    runs = [_trainer_run("deepspeed", losses=losses), _trainer_run("accelerate launch", losses=losses)]
    failed = claims.failed(zero2_training.launch_claims(runs, FIRST, "fp16", 1))
    assert (failed == []) == held, failed


def test_notebook_04s_train_py_is_its_parameters_and_lesson_cells(tmp_path):
    from helpers.lessons import zero2_training

    script = zero2_training.write_train_script(tmp_path, {"MODEL_NAME": "/m", "OUT_DIR": "/o"})
    text = script.read_text()
    assert "trainer.train()" in text and "OUT_DIR = '/o'" in text
    assert text.index("OUT_DIR = '/o'") < text.index("trainer.train()")
    assert "wait_for_everyone" in text  # rank 0 writes the tokenizer, the others wait


# ---- train.py takes the lesson cells as the kernel last ran them ---------------------------------
LESSON_CELLS = ["# Your code: train.\ntrainer.train()\nprint('trainer losses:', losses)",
                "# Your code: save, then reload.\nSAVE_DIR = f'{OUT_DIR}/final'\n"
                "trainer.save_model(SAVE_DIR)\nreloaded = load(SAVE_DIR)"]


def test_an_edited_lesson_cell_goes_into_train_py_as_last_run():
    edited = LESSON_CELLS[0].replace("trainer.train()", "trainer.train(resume_from_checkpoint=True)")
    history = ["import os", LESSON_CELLS[0], "print(1)", LESSON_CELLS[1], edited]
    assert launch.as_last_run(LESSON_CELLS, history) == [edited, LESSON_CELLS[1]]
    later = edited.replace("losses)", "losses[-3:])")
    assert launch.as_last_run(LESSON_CELLS, [*history, later])[0] == later  # the latest run wins


def test_cells_the_kernel_never_ran_or_ran_unlike_stay_as_the_notebook_has_them():
    assert launch.as_last_run(LESSON_CELLS, []) == LESSON_CELLS
    unlike = ["import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()", "x = 1"]
    assert launch.as_last_run(LESSON_CELLS, unlike) == LESSON_CELLS
    # one run is one cell's: the save cell's run does not also stand in for the train cell
    assert launch.as_last_run(LESSON_CELLS, [LESSON_CELLS[1]]) == LESSON_CELLS


def test_the_kernel_history_is_in_outside_ipython_nothing(monkeypatch):
    import IPython

    assert launch.kernel_history() == []  # pytest runs no IPython kernel

    class Shell:
        user_ns = {"In": ["", "import os", "   ", LESSON_CELLS[0]]}

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    assert launch.kernel_history() == ["import os", LESSON_CELLS[0]]


def test_notebook_04s_train_py_holds_an_edit_made_in_the_kernel(tmp_path, monkeypatch):
    from helpers.lessons import zero2_training

    train_cell = next(c for c in launch.tagged_cells(zero2_training.NOTEBOOK, "lesson")
                      if "trainer.train()" in c)
    edited = train_cell.replace("trainer.train()", "trainer.train()  # my run")
    monkeypatch.setattr(launch, "kernel_history", lambda: [train_cell, edited])
    text = zero2_training.write_train_script(tmp_path, {"OUT_DIR": "/o"}).read_text()
    # the cell's own line, replaced (train_or_advise's indented call is another cell's)
    assert "trainer.train()  # my run" in text and "\ntrainer.train()\n" not in text


def test_a_cell_that_copies_a_lesson_with_a_change_of_its_own_stays_itself():
    """Notebook 07 runs the Trainer again without loss_type to measure what that costs: that cell
    is the notebook's own, not an edit of the lesson's Trainer cell."""
    variant = LESSON_CELLS[0].replace("print('trainer losses:', losses)", "first = losses[0]")
    assert launch.as_last_run(LESSON_CELLS, [LESSON_CELLS[0], variant]) == [variant,
                                                                            LESSON_CELLS[1]]
    assert launch.as_last_run(LESSON_CELLS, [LESSON_CELLS[0], variant],
                              others=[variant]) == LESSON_CELLS


@pytest.mark.parametrize("name", ["04_zero2_training", "07_engine_and_accelerate",
                                  "08_beyond_data_parallelism"])
def test_a_kernel_that_ran_every_cell_as_written_exports_the_notebooks_lesson(name):
    """What nbval's kernel holds after a run: every code cell, in order, unedited (twice, as after
    a re-run). train.py must then be the notebook's own lesson, cell for cell."""
    import json

    from tools import nbtool

    path = nbtool.NOTEBOOKS / f"{name}.ipynb"
    code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == "code"]
    assert launch.lesson_script(path, {}, [*code, *code]) == launch.lesson_script(path, {})


def test_a_short_cell_with_one_of_its_two_lines_edited_is_still_that_cell():
    short = "# ... continue from the checkpoint.\nresumed.train(resume_from_checkpoint=CKPT)"
    edited = short.replace("CKPT)", "CKPT, trial=None)")
    assert launch.as_last_run([short, LESSON_CELLS[1]], [short, edited]) == [edited,
                                                                             LESSON_CELLS[1]]


def test_an_edit_with_an_ipython_magic_stays_out_of_train_py():
    """In holds a magic as get_ipython() calls, which a launched script cannot run."""
    magic = LESSON_CELLS[0].replace("trainer.train()",
                                    "get_ipython().run_line_magic('time', 'trainer.train()')")
    assert launch.as_last_run(LESSON_CELLS, [LESSON_CELLS[0], magic]) == LESSON_CELLS


def test_a_pretrained_trainer_launch_needs_finite_losses_not_a_trend():
    """From a pretrained start two ranks' noisy losses pass; a NaN fails; one process must still
    start at the notebook's first loss."""
    from helpers.lessons import zero2_training

    noisy = (6.0, 6.3, 5.8, 6.1)
    runs = [_trainer_run("deepspeed", losses=noisy), _trainer_run("accelerate launch", losses=noisy)]
    assert claims.failed(zero2_training.launch_claims(runs, FIRST, "fp32", 2, pretrained=True)) == []
    assert claims.failed(zero2_training.launch_claims(runs, FIRST, "fp32", 2))  # the trend rule
    nan = [_trainer_run("deepspeed", losses=(6.0, float("nan"), 5.0, 4.0))] * 2
    assert claims.failed(zero2_training.launch_claims(nan, FIRST, "fp32", 2, pretrained=True))
    other_start = [_trainer_run("deepspeed", losses=(6.1, 5.5, 5.0, 4.6))] * 2
    assert claims.failed(zero2_training.launch_claims(other_start, FIRST, "fp16", 1, pretrained=True))


def test_cpu_ranks_allocate_with_tcmalloc_where_the_system_has_it():
    """A rank started with the notebook's prefix runs on tcmalloc (a quarter faster on a CPU)
    where ldconfig lists it (make setup installs it as root; CI's set-up requires it); nowhere
    else is it preloaded: not with a GPU, not where the library is missing."""
    import os
    import subprocess
    import sys
    from ctypes.util import find_library

    import torch

    if os.environ.get("CI"):  # CI's set-up installs it (tools/system_packages.sh --strict)
        assert find_library(launch.TCMALLOC), "libtcmalloc-minimal4 is missing under CI"
    assert launch.cpu_rank_preload("no_such_library_zero_kit", cuda=False) == ""
    assert launch.cpu_rank_preload(cuda=True) == ""
    maps = "print('libtcmalloc_minimal' in open('/proc/self/maps').read())"
    line = f"{launch.NOTEBOOK_LAUNCH_ENV} {sys.executable} -c \"{maps}\""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    mapped = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60,
                            env=env)
    assert mapped.returncode == 0, mapped.stderr
    expected = (find_library(launch.TCMALLOC) is not None and not torch.cuda.is_available()
                and not os.environ.get("LD_PRELOAD"))
    assert mapped.stdout.strip() == str(expected)
    assert ("LD_PRELOAD=" in launch.NOTEBOOK_LAUNCH_ENV) == expected
