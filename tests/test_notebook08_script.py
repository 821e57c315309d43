"""Notebook 08's lesson cells as the script its runs launch (issue 27, item 3): the parameters cell
run as the notebook runs it in smoke mode, its values and each run's written after it into
``train.py`` (helpers.lessons.beyond_data_parallelism.plan), each run started as the notebook starts
it (``torchrun`` with two CPU processes over gloo, from a shell line like the notebook's ``!``), and
what the processes wrote judged by the notebook's own checks. And AutoTP's ZeRO stages as the
notebook states them, against what DeepSpeed does."""

from __future__ import annotations

import inspect
import json
import os
import subprocess

import pytest

from helpers import claims, data, launch, models, runner
from helpers.lessons import beyond_data_parallelism as lesson
from tests.test_parallel import machine

_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
#: The runs launched here: the pipeline section without the 1-micro-batch run (its idle share is
#: checked on GPUs only), both MoE runs, one refusal, and AutoTP at ZeRO-3 on 1 and 2 processes.
SMOKE_RUNS = [row for row in lesson.RUNS if row[0] in (
    lesson.BASE, lesson.DP, lesson.PIPE, lesson.MOE_1, lesson.MOE_2, "MoE + ZeRO-3")]
AUTOTP_ZERO3 = [("AutoTP, 1 process, ZeRO-3", "autotp", "autotp", 1, {"ZERO_STAGE": 3}),
                ("AutoTP, autotp_size=2, ZeRO-3", "autotp", "autotp", 2, {"ZERO_STAGE": 3})]


def notebook_values(folder) -> dict:
    """The parameters cell executed in smoke mode, then what the notebook's kit cell resolves (the
    text, the offline AutoTP model, the precision): the values the notebook passes to its runs."""
    namespace: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KIT_SMOKE", "1")
        exec(launch.tagged_cells(lesson.NOTEBOOK, "parameters")[0], namespace)
    os.rmdir(namespace["WORK_DIR"])  # the cell's own temporary folder: each run gets its own
    namespace.update(TEXT_FILE=str(data.write_offline_text(folder / "train.txt", 60_000)),
                     TP_MODEL=str(models.save_offline_model(folder / "tp-model", "llama-tiny")),
                     PRECISION="fp32")
    return launch.parameter_values(lesson.NOTEBOOK, namespace)


def launch_all(runs: list[lesson.Launch]) -> None:
    """Each run as the notebook starts it: cd into its folder, the launcher, the output to its log;
    the GPUs hidden, so that the two processes are CPU ranks on any machine."""
    env = {k: v for k, v in os.environ.items() if k not in _DIST}
    env.update(KIT_SMOKE="1", CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1")
    for run in runs:
        line = f"cd {run.folder} && {launch.NOTEBOOK_LAUNCH_ENV} {run.command} > {run.log} 2>&1"
        run.returncode = subprocess.run(["bash", "-c", line], env=env, timeout=900).returncode


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, lesson.Launch]:
    folder = tmp_path_factory.mktemp("nb08")
    runs = lesson.plan(notebook_values(folder), machine(0), folder / "runs",
                       runs=SMOKE_RUNS + AUTOTP_ZERO3)
    launch_all(runs)
    return {run.label: run for run in runs}


def _section(launched: dict, labels: tuple[str, ...]) -> dict[str, runner.RunResult]:
    return {label: lesson.result(launched[label]) for label in labels}


def test_the_pipeline_and_data_parallel_runs_match_one_process(launched):
    runs = _section(launched, (lesson.BASE, lesson.DP, lesson.PIPE))
    assert all(r.status == runner.OK for r in runs.values()), {k: r.message for k, r in runs.items()}
    assert claims.failed(lesson.pipeline_checks(runs, machine(0))) == []
    assert runs[lesson.PIPE].ranks[0]["busy_s"], "DeepSpeed's timers gave no forward/backward time"
    assert all(0 < b < t for r in runs[lesson.PIPE].ranks
               for b, t in zip(r["busy_s"], r["step_times_s"]))


def test_the_moe_runs_split_the_experts_and_match(launched):
    runs = _section(launched, (lesson.MOE_1, lesson.MOE_2))
    assert all(r.status == runner.OK for r in runs.values()), {k: r.message for k, r in runs.items()}
    assert claims.failed(lesson.moe_checks(runs, machine(0))) == []
    assert [r["experts_held"] for r in runs[lesson.MOE_2].ranks] == [[0, 1], [2, 3]]


def test_deepspeed_refuses_moe_at_zero3_in_its_own_words(launched):
    refused = lesson.refusals_result([launched["MoE + ZeRO-3"]])
    found = refused.ranks[0]["refusals"][0]
    words = lesson.REFUSALS["MoE + ZeRO-3"][0]
    assert found["refused"] and words in found["error"], found


def test_the_script_prints_its_losses_and_writes_one_json_per_process(launched):
    run = launched[lesson.PIPE]
    log = open(run.log).read()
    printed = launch.launched_losses(log, "pipeline")
    written = [json.load(open(os.path.join(run.folder, f"rank{i}.json"))) for i in (0, 1)]
    assert printed and printed == [round(x, 4) for x in written[0]["losses"]]
    assert [w["rank"] for w in written] == [0, 1] and written[0]["losses"] == written[1]["losses"]


# ---- AutoTP's ZeRO stages, as notebook 08 states them --------------------------------------------


def test_autotp_trains_at_zero3_with_the_one_process_losses(launched):
    """Notebook 08 says DeepSpeed 0.19.8 refuses no ZeRO stage beside AutoTP. Two CPU processes
    with autotp_size=2 at ZeRO-3 train with the 1-process ZeRO-3 run's losses, each holding part of
    the model."""
    one, two = (lesson.result(launched[label]) for label, *_ in AUTOTP_ZERO3)
    assert one.status == two.status == runner.OK, (one.message, two.message)
    assert len(two.losses) == len(one.losses) > 1
    assert all(claims.within(b, a, 1e-4) for a, b in zip(one.losses, two.losses)), (
        one.losses, two.losses)


def test_the_notebook_states_autotps_stages_for_the_installed_deepspeed():
    import deepspeed
    from deepspeed.runtime.engine import DeepSpeedEngine

    text = "".join("".join(c["source"]) for c in json.loads(lesson.NOTEBOOK.read_text())["cells"]
                   if c["cell_type"] == "markdown")
    assert (f"Which ZeRO stages AutoTP takes, as DeepSpeed {deepspeed.__version__} enforces them: "
            "all of them, 0 to 3") in text
    tensor = next(row for row in lesson.DIMENSIONS if row[0] == "tensor")
    assert tensor[3].startswith("0, 1, 2, 3")
    # The one refusal the notebook names: DeepCompile's AutoTP pass beside its ZeRO passes.
    source = inspect.getsource(DeepSpeedEngine)
    assert "The AutoTP compile pass cannot yet be combined with AutoSP or the ZeRO" in source


# ---- The launched script's exit: no engine left for the interpreter's end ------------------------

#: Runs train.py as the launcher would, with the process group's exit wrapped: it first writes how
#: many DeepSpeed engines are still alive (unfreed, even if unreachable) to engines_at_exit.json.
_COUNT_ENGINES_AT_EXIT = """
import gc, json, runpy
import torch.distributed as dist
from deepspeed import DeepSpeedEngine

leave = dist.destroy_process_group


def counted(*args, **kwargs):
    alive = sum(1 for o in gc.get_objects() if isinstance(o, DeepSpeedEngine))
    with open("engines_at_exit.json", "w") as f:
        json.dump(alive, f)
    return leave(*args, **kwargs)


dist.destroy_process_group = counted
runpy.run_path("train.py", run_name="__main__")
"""
_CLEAN_UP = ("    engine.destroy()  # its hooks go", "    gc.collect()\n")


@pytest.mark.parametrize("clean_up", [True, False], ids=["as-written", "without-its-clean-up"])
def test_the_script_frees_its_engine_before_it_leaves_the_process_group(tmp_path, clean_up):
    """An engine still alive when a launched rank exits goes with the interpreter, when a gloo thread
    dropping its last tensor cannot take the GIL: the rank aborts ("terminate called without an
    active exception"; notebook 08's data-parallel run in one CI run, 07's in 2 launches of 8). The
    lesson's script destroys its engine and collects it before leaving the process group; the same
    script without those lines leaves it alive there."""
    run, = lesson.plan(notebook_values(tmp_path), machine(0), tmp_path / "runs",
                       runs=[row for row in lesson.RUNS if row[0] == lesson.BASE])
    script = os.path.join(run.folder, "train.py")
    text = open(script).read()
    assert all(line in text for line in _CLEAN_UP), "the lesson's clean-up lines changed"
    if not clean_up:
        text = "".join(line for line in text.splitlines(keepends=True)
                       if not line.startswith(_CLEAN_UP))
        open(script, "w").write(text)
    open(os.path.join(run.folder, "wrap.py"), "w").write(_COUNT_ENGINES_AT_EXIT)
    run.command = run.command.replace(script, "wrap.py")
    launch_all([run])
    assert run.returncode == 0, open(run.log).read()[-3000:]
    alive = json.load(open(os.path.join(run.folder, "engines_at_exit.json")))
    assert (alive == 0) if clean_up else (alive >= 1), alive
