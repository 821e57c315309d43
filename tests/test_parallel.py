"""Notebook 08's checks (helpers.lessons.beyond_data_parallelism) fed good runs and bad ones: each claim holds on a good
run and fails on the bad run it is there to catch (memory not split, losses disagreeing, no
per-rank data, DeepSpeed accepting a combination it refuses today). Runs are built by hand here;
tests/test_notebook08_script.py launches the lesson script itself."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from helpers import claims, runner
from helpers import env as kit_env
from helpers.lessons import beyond_data_parallelism

GiB = 2**30


def machine(gpus: int) -> kit_env.Environment:
    """A CPU machine (gpus=0), one GPU, or two, as describe() would report them."""
    gpu = gpus > 0
    return kit_env.Environment(
        platform="local", gpu_name="Tesla T4" if gpu else None, gpu_count=gpus,
        capability=(7, 5) if gpu else None, real_capability=(7, 5) if gpu else None,
        vram_total_bytes=15 * GiB if gpu else None, vram_free_bytes=15 * GiB if gpu else None,
        native_bf16=False, precision="fp16" if gpu else "fp32", cpu_cores=2,
        ram_total_bytes=13 * GiB, ram_available_bytes=12 * GiB, ram_budget_bytes=12 * GiB,
        offload_dir="/tmp", disk_free_bytes=GiB,
        torch_version="2", torch_cuda=None, nvcc=None, deepspeed_version="0.19.8",
        transformers_version="5", smoke=not gpu)


LOSSES = [5.6, 5.5, 5.2, 4.9, 4.6, 4.4]


def run(label: str, ranks: list[dict], losses=LOSSES, status=runner.OK,
        message="") -> runner.RunResult:
    peaks = [r.get("peak_gpu_allocated_bytes") for r in ranks if r.get("peak_gpu_allocated_bytes")]
    return runner.RunResult(label, status, message, world_size=max(1, len(ranks)),
                           n_params=ranks[0].get("n_params", 0) if ranks else 0,
                           losses=list(losses),
                           steps_done=len(losses), median_step_s=0.1, tokens_per_s=1000.0,
                           peak_gpu_allocated_bytes=max(peaks) if peaks else None, ranks=ranks)


def rank(i: int, **fields) -> dict:
    return {"rank": i, "status": runner.OK, "losses": LOSSES, "step_times_s": [1.0] * 4, **fields}


def pipeline_good(gpu: bool = False) -> dict:
    peak = (lambda b: {"peak_gpu_allocated_bytes": b}) if gpu else (lambda b: {})
    return {
        beyond_data_parallelism.BASE: run(beyond_data_parallelism.BASE, [rank(0, n_params=1000, **peak(4 * GiB))]),
        beyond_data_parallelism.DP: run(beyond_data_parallelism.DP, [rank(0, n_params=1000, **peak(3 * GiB)),
                                       rank(1, n_params=1000, **peak(3 * GiB))]),
        beyond_data_parallelism.PIPE: run(beyond_data_parallelism.PIPE, [
            rank(0, n_params=520, busy_s=[0.7] * 4, **peak(2 * GiB)),
            rank(1, n_params=480, busy_s=[0.7] * 4, **peak(2 * GiB))]),
        beyond_data_parallelism.PIPE_1: run(beyond_data_parallelism.PIPE_1, [rank(0, n_params=520, busy_s=[0.4] * 4),
                                               rank(1, n_params=480, busy_s=[0.4] * 4)],
                             losses=[5.7, 5.4, 5.3, 5.0, 4.8, 4.6]),
    }


def failed(checks: list[claims.Claim]) -> list[str]:
    assert checks, "no checks at all"
    return claims.failed(checks)


# ---- the pipeline --------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [0, 2])
def test_a_good_pipeline_run_passes(gpus):
    assert failed(beyond_data_parallelism.pipeline_checks(pipeline_good(gpus > 0), machine(gpus))) == []


def _break(runs: dict, label: str, change) -> dict:
    runs = copy.deepcopy(runs)
    change(runs[label])
    return runs


PIPELINE_BREAKAGES = {
    "each stage holds the whole model": (
        lambda r: [x.update(n_params=1000) for x in r.ranks], "each rank holds at most"),
    "stages do not add up to the model": (
        lambda r: r.ranks[1].update(n_params=300), "add up to the whole model"),
    "no per-rank data": (lambda r: r.ranks.clear(), "2 ranks reported"),
    "losses disagree with 1 rank": (lambda r: r.losses.__setitem__(3, 5.3), "losses match"),
    "fewer steps than the baseline": (lambda r: r.losses.pop(), "losses match"),
    "the pipeline failed": (lambda r: setattr(r, "status", runner.ERROR), "every run ran"),
}


@pytest.mark.parametrize("name", PIPELINE_BREAKAGES)
def test_a_bad_pipeline_run_fails(name):
    change, words = PIPELINE_BREAKAGES[name]
    runs = _break(pipeline_good(), beyond_data_parallelism.PIPE, change)
    bad = failed(beyond_data_parallelism.pipeline_checks(runs, machine(0)))
    assert any(words in sentence for sentence in bad), bad


def test_data_parallel_losses_must_agree_too():
    runs = _break(pipeline_good(), beyond_data_parallelism.DP, lambda r: r.losses.__setitem__(0, 5.7))
    assert any(beyond_data_parallelism.DP in s for s in failed(beyond_data_parallelism.pipeline_checks(runs, machine(0))))


def test_on_gpus_memory_must_split_and_the_bubble_must_shrink():
    runs = _break(pipeline_good(gpu=True), beyond_data_parallelism.PIPE,
                  lambda r: r.ranks[0].update(peak_gpu_allocated_bytes=5 * GiB))
    assert any("peaks below" in s for s in failed(beyond_data_parallelism.pipeline_checks(runs, machine(2))))
    runs = _break(pipeline_good(gpu=True), beyond_data_parallelism.PIPE,
                  lambda r: [x.update(busy_s=[0.2] * 4) for x in r.ranks])
    assert any("idle less" in s for s in failed(beyond_data_parallelism.pipeline_checks(runs, machine(2))))


def test_a_baseline_whose_loss_does_not_fall_fails():
    runs = _break(pipeline_good(), beyond_data_parallelism.BASE, lambda r: r.losses.reverse())
    assert any("loss falls" in s for s in failed(beyond_data_parallelism.pipeline_checks(runs, machine(0))))


def test_idle_share_and_the_bubble():
    assert beyond_data_parallelism.bubble_theory(2, 1) == 0.5
    assert beyond_data_parallelism.bubble_theory(2, 8) == pytest.approx(1 / 9)
    runs = pipeline_good()
    assert beyond_data_parallelism.idle_fraction(runs[beyond_data_parallelism.PIPE]) == pytest.approx(0.3)
    assert beyond_data_parallelism.idle_fraction(runs[beyond_data_parallelism.PIPE_1]) == pytest.approx(0.6)
    assert beyond_data_parallelism.idle_fraction(None) is None
    assert beyond_data_parallelism.idle_fraction(run("x", [rank(0)])) is None  # no timings: no figure


# ---- one GPU: the 2-rank runs explain themselves, nothing fails ----------------------------------


def test_on_one_gpu_the_two_rank_runs_are_explained_and_the_checks_hold():
    one = machine(1)
    two_ranks, why = beyond_data_parallelism.two_rank_note(one)
    assert not two_ranks and "Kaggle" in why
    solo = rank(0, n_params=1000, peak_gpu_allocated_bytes=GiB)
    runs = {beyond_data_parallelism.BASE: run(beyond_data_parallelism.BASE, [solo])}
    for label in (beyond_data_parallelism.DP, beyond_data_parallelism.PIPE, beyond_data_parallelism.PIPE_1):
        runs[label] = beyond_data_parallelism.not_here(
            beyond_data_parallelism.Launch(label, "pipeline", "dense", 2, why=why))
    assert failed(beyond_data_parallelism.pipeline_checks(runs, one)) == []
    assert runner.explained(runs[beyond_data_parallelism.PIPE]) and runs[beyond_data_parallelism.PIPE].message == why
    assert beyond_data_parallelism.two_rank_note(machine(0))[0] and beyond_data_parallelism.two_rank_note(machine(2))[0]


# ---- mixture of experts --------------------------------------------------------------------------


def moe_good(gpu: bool = False) -> dict:
    peak = (lambda b: {"peak_gpu_allocated_bytes": b}) if gpu else (lambda b: {})
    counts = [[30, 34, 28, 36], [32, 32, 33, 31]]  # 2 layers x 4 experts: 128 tokens each
    half = [[[15, 17, 14, 18], [16, 16, 16, 16]], [[15, 17, 14, 18], [16, 16, 17, 15]]]
    moe = dict(aux_losses=[1.1, 1.05], dense_params=500)
    return {
        beyond_data_parallelism.MOE_1: run(beyond_data_parallelism.MOE_1, [rank(0, expert_params=800, experts_held=[0, 1, 2, 3],
                                                  expert_counts=counts, tokens=128, **moe,
                                                  **peak(4 * GiB))]),
        beyond_data_parallelism.MOE_2: run(beyond_data_parallelism.MOE_2, [
            rank(0, expert_params=400, experts_held=[0, 1], expert_counts=half[0], tokens=64, **moe,
                 **peak(3 * GiB)),
            rank(1, expert_params=400, experts_held=[2, 3], expert_counts=half[1], tokens=64, **moe,
                 **peak(3 * GiB))]),
    }


@pytest.mark.parametrize("gpus", [0, 2])
def test_a_good_moe_run_passes(gpus):
    assert failed(beyond_data_parallelism.moe_checks(moe_good(gpus > 0), machine(gpus))) == []


MOE_BREAKAGES = {
    "experts not split": (lambda r: [x.update(expert_params=800) for x in r.ranks],
                          "half of the experts"),
    "dense part split": (lambda r: r.ranks[1].update(dense_params=250), "whole dense part"),
    "no per-rank data": (lambda r: r.ranks.clear(), "half of the experts"),
    "losses disagree": (lambda r: r.losses.__setitem__(2, 5.0), "losses match"),
    "tokens lost by the gate": (lambda r: r.ranks[0]["expert_counts"][1].__setitem__(0, 1),
                                "counts add up"),
    "aux loss not finite": (lambda r: r.ranks[0]["aux_losses"].append(float("nan")),
                            "load-balancing"),
}


@pytest.mark.parametrize("name", MOE_BREAKAGES)
def test_a_bad_moe_run_fails(name):
    change, words = MOE_BREAKAGES[name]
    bad = failed(beyond_data_parallelism.moe_checks(_break(moe_good(), beyond_data_parallelism.MOE_2, change), machine(0)))
    assert any(words in sentence for sentence in bad), bad


def test_moe_figures_come_from_the_ranks():
    runs = moe_good()
    assert beyond_data_parallelism.expert_tokens(runs[beyond_data_parallelism.MOE_1]) == [62, 66, 61, 67]
    two = runs[beyond_data_parallelism.MOE_2]
    assert beyond_data_parallelism.tokens_routed(two, 1) == beyond_data_parallelism.tokens_seen(two) == 128
    sizes = beyond_data_parallelism.moe_sizes(runs[beyond_data_parallelism.MOE_1], experts=4)
    assert sizes == {"total": 1300, "active": 700, "dense": 500, "experts": 800}
    assert beyond_data_parallelism.moe_sizes(None, 4) == {}
    assert "2, 3" in str(beyond_data_parallelism.moe_table(runs))


# ---- AutoTP --------------------------------------------------------------------------------------


def tp_good(gpu: bool = False) -> dict:
    peak = (lambda b: {"peak_gpu_allocated_bytes": b}) if gpu else (lambda b: {})
    return {beyond_data_parallelism.TP_1: run(beyond_data_parallelism.TP_1, [rank(0, n_params=1000, **peak(4 * GiB))]),
            beyond_data_parallelism.TP_2: run(beyond_data_parallelism.TP_2, [rank(0, n_params=510, **peak(3 * GiB)),
                                               rank(1, n_params=510, **peak(3 * GiB))])}


def test_autotp_checks_hold_on_a_good_run_and_fail_on_bad_ones():
    assert failed(beyond_data_parallelism.tp_checks(tp_good(), machine(0))) == []
    whole = _break(tp_good(), beyond_data_parallelism.TP_2, lambda r: [x.update(n_params=1000) for x in r.ranks])
    assert any("at most" in s for s in failed(beyond_data_parallelism.tp_checks(whole, machine(0))))
    drift = _break(tp_good(), beyond_data_parallelism.TP_2, lambda r: r.losses.__setitem__(5, 4.0))
    assert any("losses match" in s for s in failed(beyond_data_parallelism.tp_checks(drift, machine(0))))
    one_rank = _break(tp_good(), beyond_data_parallelism.TP_2, lambda r: r.ranks.pop())
    assert any("2 ranks reported" in s for s in failed(beyond_data_parallelism.tp_checks(one_rank, machine(0))))


# ---- refusals ------------------------------------------------------------------------------------


def refusals(**override) -> runner.RunResult:
    found = [{"combination": name, "refused": True, "error": f"AssertionError: x {words} y"}
             for name, (words, _) in beyond_data_parallelism.REFUSALS.items()]
    for item in found:
        item.update(override.get(item["combination"], {}))
    return run("refusals", [rank(0, refusals=found)])


def test_refusals_hold_when_deepspeed_refuses_with_its_words():
    assert failed(beyond_data_parallelism.refusal_checks(refusals())) == []
    assert "incompatible with pipeline" in str(beyond_data_parallelism.refusal_table(refusals()))


@pytest.mark.parametrize("change, combination", [
    ({"refused": False, "error": ""}, "pipeline + ZeRO-2"),  # DeepSpeed accepts it one day
    ({"error": "RuntimeError: out of memory"}, "MoE + ZeRO-3"),  # refused for another reason
])
def test_a_refusal_check_fails_when_deepspeed_changes(change, combination):
    bad = failed(beyond_data_parallelism.refusal_checks(refusals(**{combination: change})))
    assert any(s.startswith(combination) for s in bad), bad


def test_a_refusal_run_with_no_answer_fails():
    empty = run("refusals", [], status=runner.ERROR, message="ImportError: no deepspeed")
    bad = failed(beyond_data_parallelism.refusal_checks(empty))
    assert "the refusal run came back" in bad and len(bad) == 1 + len(beyond_data_parallelism.REFUSALS)


# ---- the plan, and what a launched run left ------------------------------------------------------


def test_the_plan_writes_one_script_per_run_and_starts_2_process_runs_only_where_they_can_go(tmp_path):
    values = {"LAYERS": 2, "MICRO_BATCH": 2, "MICRO_BATCHES": 4, "SEQ_LEN": 64, "TEXT_FILE": "/t"}
    cpu = beyond_data_parallelism.plan(values, machine(0), tmp_path / "cpu")
    assert [r.label for r in cpu] == [row[0] for row in beyond_data_parallelism.RUNS]
    assert all(r.command and "--nproc-per-node" in r.command for r in cpu)
    pipe_1 = next(r for r in cpu if r.label == beyond_data_parallelism.PIPE_1)
    script = (Path(pipe_1.folder) / "train.py").read_text()
    assert "LAYOUT = 'pipeline'" in script and "MICRO_BATCHES = 1" in script
    assert script.index("MICRO_BATCHES = 1") > script.index("MICRO_BATCHES = 4")  # after the cell's
    assert f"WORK_DIR = {pipe_1.folder!r}" in script and "def train(layout" in script
    assert pipe_1.tokens_per_step() == 2 * 1 * 64
    one_gpu = beyond_data_parallelism.plan(values, machine(1), tmp_path / "gpu")
    assert all((r.command is None) == (r.world_size == 2) for r in one_gpu)
    assert all("Kaggle" in r.why for r in one_gpu if r.command is None)


def test_a_lesson_cell_edited_and_run_in_the_kernel_reaches_every_runs_script(tmp_path, monkeypatch):
    """On Colab the notebook file on disk is the cloned copy: the script must take the kernel's
    last run of each lesson cell, not the file (the notebook told learners to save it)."""
    from helpers import launch

    cells = launch.tagged_cells(beyond_data_parallelism.NOTEBOOK, "lesson")
    original = next(c for c in cells if "class MoEGPT" in c)
    edited = original.replace("capacity_factor=1.25", "capacity_factor=2.0")
    assert edited != original
    monkeypatch.setattr(launch, "kernel_history", lambda: [edited])
    values = {"LAYERS": 2, "MICRO_BATCH": 2, "MICRO_BATCHES": 4, "SEQ_LEN": 64, "TEXT_FILE": "/t"}
    runs = beyond_data_parallelism.plan(values, machine(0), tmp_path)
    for run in runs:
        script = (Path(run.folder) / "train.py").read_text()
        assert "capacity_factor=2.0" in script and "capacity_factor=1.25" not in script


def test_the_first_error_is_the_ranks_not_the_launchers():
    log = ("noise\n[rank0]: Traceback (most recent call last):\n"
           "[rank0]: AssertionError: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\n"
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert beyond_data_parallelism.first_error(log) == (
        "AssertionError: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    assert beyond_data_parallelism.first_error("all went well\n") == ""
    aborted = "dense losses: [5.6, 5.5]\nterminate called without an active exception\n" + log
    assert beyond_data_parallelism.first_error(aborted) == (
        "terminate called without an active exception")


def _launched(tmp_path, ranks: list[dict], returncode: int = 0, log: str = "",
              world_size: int = 2) -> runner.RunResult:
    folder = tmp_path / "run"
    folder.mkdir()
    for r in ranks:
        (folder / f"rank{r['rank']}.json").write_text(json.dumps(r))
    (folder / "log.txt").write_text(log)
    values = {"MICRO_BATCH": 2, "MICRO_BATCHES": 4, "SEQ_LEN": 64}
    return beyond_data_parallelism.result(beyond_data_parallelism.Launch(
        "p", "pipeline", "pipeline", world_size, values, str(folder), "torchrun ...", "",
        returncode))


def test_a_launched_run_needs_every_rank_and_exit_code_0(tmp_path):
    good = _launched(tmp_path, [rank(0), rank(1)])
    assert good.status == runner.OK and good.median_step_s == 1.0 and good.tokens_per_s == 512


def test_a_launched_run_with_a_missing_rank_fails(tmp_path):
    missing = _launched(tmp_path, [rank(0)], returncode=1)
    assert missing.status == runner.ERROR and "1 of 2 ranks reported" in missing.message


def test_a_launched_run_that_raised_says_what_in_one_line(tmp_path):
    broken = _launched(tmp_path, [], returncode=1,
                       log="Traceback\nValueError: LAYOUT 'tensor': choose dense, pipeline,\n")
    assert broken.status == runner.ERROR and broken.message.startswith("ValueError: LAYOUT")
    assert not runner.explained(broken) and "\n" not in broken.message


def test_a_run_that_died_without_an_exception_quotes_its_log_end_and_its_claim_names_it(tmp_path):
    log = "".join(f"line {i}\n" for i in range(20)) + "Signal 6 (SIGABRT) received by PID 5636\n"
    died = _launched(tmp_path, [], returncode=-6, log=log)
    assert died.status == runner.ERROR and "\n" not in died.message
    assert died.message.startswith("0 of 2 ranks reported, exit code -6; its log ends: line 6")
    assert died.message.endswith("Signal 6 (SIGABRT) received by PID 5636")
    sentence, held = beyond_data_parallelism._ran_or_explained({"p": died})
    assert not held and "failed: p: 0 of 2 ranks reported" in sentence
    sentence, held = beyond_data_parallelism._ran_or_explained(
        {"p": runner.RunResult("p", runner.OK)})
    assert held and "failed" not in sentence


def test_a_launched_run_stopped_by_its_timeout_says_so(tmp_path):
    stuck = _launched(tmp_path, [rank(0)], returncode=124, log="[rank1] waiting in all_reduce\n")
    assert stuck.status == runner.ERROR and stuck.message == (
        f"timed out after {beyond_data_parallelism.LAUNCH_TIMEOUT_S} s")


def test_a_refusal_is_a_run_that_failed_with_deepspeeds_words(tmp_path):
    runs = []
    for i, (name, (words, _)) in enumerate(beyond_data_parallelism.REFUSALS.items()):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "log.txt").write_text(f"[rank0]: AssertionError: {words}\n")
        runs.append(beyond_data_parallelism.Launch(name, "refusals", "", 1, folder=str(folder),
                                                   command="torchrun ...", returncode=1))
    assert failed(beyond_data_parallelism.refusal_checks(
        beyond_data_parallelism.refusals_result(runs))) == []
    runs[0].returncode = 0  # DeepSpeed accepted it
    bad = failed(beyond_data_parallelism.refusal_checks(beyond_data_parallelism.refusals_result(runs)))
    assert any(s.startswith(runs[0].label) for s in bad), bad


# ---- what the notebook shows, on a CPU, 1 GPU and 2 GPUs -----------------------------------------


def _one_gpu_sections(why: str) -> tuple[dict, dict, dict]:
    pipe = {beyond_data_parallelism.BASE: pipeline_good(True)[beyond_data_parallelism.BASE]}
    moe = {beyond_data_parallelism.MOE_1: moe_good(True)[beyond_data_parallelism.MOE_1]}
    tp = {beyond_data_parallelism.TP_1: tp_good(True)[beyond_data_parallelism.TP_1]}
    for section, labels in ((pipe, (beyond_data_parallelism.DP, beyond_data_parallelism.PIPE, beyond_data_parallelism.PIPE_1)),
                            (moe, (beyond_data_parallelism.MOE_2,)), (tp, (beyond_data_parallelism.TP_2,))):
        for label in labels:
            section[label] = beyond_data_parallelism.not_here(
                beyond_data_parallelism.Launch(label, "", "", 2, why=why))
    return pipe, moe, tp


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_tables_figures_takeaways_and_summary_render(gpus):
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    env = machine(gpus)
    if gpus == 1:
        pipe, moe, tp = _one_gpu_sections(beyond_data_parallelism.two_rank_note(env)[1])
    else:
        pipe, moe, tp = pipeline_good(gpus > 0), moe_good(gpus > 0), tp_good(gpus > 0)
    for table in (beyond_data_parallelism.runs_table(pipe, "p", env), beyond_data_parallelism.runs_table(moe, "m", env),
                  beyond_data_parallelism.runs_table(tp, "t", env), beyond_data_parallelism.moe_table(moe),
                  beyond_data_parallelism.dimensions_table()):
        assert str(table) and table._repr_html_()
    figures = [beyond_data_parallelism.three_d_figure(), beyond_data_parallelism.plot_memory_speed({**pipe, **moe, **tp}, env),
               beyond_data_parallelism.loss_curves(pipe, moe, tp),
               beyond_data_parallelism.plot_expert_tokens(moe[beyond_data_parallelism.MOE_2 if gpus != 1 else beyond_data_parallelism.MOE_1])]
    plt.close("all")
    assert len(figures) == 4
    lines = beyond_data_parallelism.takeaways(pipe, moe, tp, refusals(), env, experts=4)
    assert any("refused pipeline + ZeRO-2" in line for line in lines)
    assert any("Kaggle" in line for line in lines) == (gpus == 1)
    checks = (beyond_data_parallelism.refusal_checks(refusals()) + beyond_data_parallelism.pipeline_checks(pipe, env)
              + beyond_data_parallelism.moe_checks(moe, env) + beyond_data_parallelism.tp_checks(tp, env))
    assert failed(checks) == []
    text = beyond_data_parallelism.summary(pipe, moe, tp, refusals(), checks)
    # The checked output reads the same on a CPU, 1 GPU and 2 GPUs.
    assert text == beyond_data_parallelism.summary(*pipeline_moe_tp_cpu(), refusals(), checks)
    assert "all checks held: True" in text


def pipeline_moe_tp_cpu() -> tuple[dict, dict, dict]:
    return pipeline_good(), moe_good(), tp_good()
