"""helpers.runner: each status, the JSON schema, and per-rank byte accounting with 2 CPU ranks."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from helpers import config, runner
from helpers import env
from helpers.lessons import stages_and_offload
from tools import run_log

CPU_FP32 = dict(trainer=False, precision="fp32", pin_memory=False, micro_batch=2)


def spec(stage=2, world_size=1, **kw):
    ds = config.build(stage=stage, world_size=world_size, **CPU_FP32)
    return runner.RunSpec(ds_config=ds, shape="tiny", steps=kw.pop("steps", 3), force_cpu=True, **kw)


def test_ok_run_reports_every_field():
    r = runner.measure(spec())
    assert r.status == runner.OK and r.steps_done == 3 and len(r.losses) == 3 and r.losses[-1] < r.losses[0]
    assert r.median_step_s > 0 and r.tokens_per_s > 0 and r.peak_host_rss_bytes > 100 * 2**20
    # engine.step() timed alone, inside each step's time (notebook 09's benchmark splits on it)
    assert len(r.optimizer_step_s) == 3
    assert all(0 < s < t for s, t in zip(r.optimizer_step_s, r.step_times_s))
    assert r.n_params == 3_382_080 and r.ranks[0]["params_bytes"] == 4 * r.n_params
    # A stage 2 run in fp32 needs none of the kit's DeepSpeed fixes, so it installs none: its
    # figures are DeepSpeed's own (a runner that installed every fix would list them here).
    assert r.deepspeed_fixes == []
    assert json.loads(json.dumps(dataclasses.asdict(r)))["status"] == "ok"
    # Host RSS per phase of the run (helpers.runner), in the order the phases began.
    phases = {p["name"]: p for p in r.rss_phases}
    assert list(phases) == ["imports, process group", "model built", "deepspeed.initialize",
                            "forward and backward", "optimizer step"]
    assert phases["optimizer step"]["entries"] == phases["forward and backward"]["entries"] == 3
    assert all(0 < p["start_bytes"] <= p["peak_bytes"] for p in r.rss_phases)
    # The trace's phases hold the worker's own peak (the kernel's high-water mark, read at each
    # phase switch). The parent's sampled peak counts the worker's children too (DeepSpeed's cpuinfo
    # probes and, on a first run, its JIT compilers: up to GBs), so it is no yardstick here.
    # (None where the worker never passed the mark inherited from its parent at the fork; the
    # kernel updates its mark lazily: psutil's samples may pass it by a few pages)
    own = r.ranks[0]["rss_high_water_bytes"]
    top = max(p["peak_bytes"] for p in r.rss_phases)
    assert top > 100 * 2**20 and (own is None or top == pytest.approx(own, rel=0.01))


#: An entry point whose every rank runs out of memory at once (an error raised as CUDA raises it).
FAKE_OOM = """
import torch


def oom_at_first_step(payload, result):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated on CPU)")
"""


def test_out_of_memory_is_a_status(monkeypatch, tmp_path):
    (tmp_path / "fake_runs.py").write_text(FAKE_OOM)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the run's process imports its entry point
    monkeypatch.setenv(runner.REPORT_ENV, "tools.run_log:append")  # as tools/gpu_record_run.sh sets it
    monkeypatch.setenv(run_log.LOG_ENV, str(tmp_path / "runs.jsonl"))
    r = runner.finish(runner.run(spec(), entry="fake_runs:oom_at_first_step"), spec())
    assert r.status == runner.OOM and r.losses == []
    assert r.message.startswith("CUDA out of memory: tried to allocate 2.00 GiB (simulated on CPU)")
    logged = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [(x["shape"], x["status"]) for x in logged] == [("tiny", runner.OOM)]


def test_a_run_past_its_ram_budget_is_killed_and_reported():
    r = runner.measure(spec(ram_limit_bytes=50 * 2**20))
    assert r.status == runner.KILLED_RAM and "budget" in r.message
    assert r.deepspeed_fixes == []  # stage 2: none, also for a run killed before it wrote a result
    killed3 = runner.measure(runner.RunSpec(
        ds_config=config.build(stage=3, offload_optimizer="cpu", **CPU_FP32), shape="tiny",
        force_cpu=True, ram_limit_bytes=50 * 2**20))
    # killed before any rank wrote its result: what it installed at its start is still named
    assert killed3.status == runner.KILLED_RAM and killed3.ranks == []
    assert killed3.deepspeed_fixes == ["fix_stage3_overflow_check"]


#: An entry point that grows its RAM inside a named phase until the parent kills it.
FAKE_HOG = """
import os, time
from helpers import runner


def hog_in_initialize(payload, result):
    trace = runner.PhaseTrace(marker=os.environ.get(runner.PHASE_FILE_ENV))
    trace.enter("deepspeed.initialize")
    held = []
    for _ in range(80):  # up to 8 GB, 100 MB at a time, each written so that it is resident
        held.append(b"\\x01" * (100 * 2**20))
        time.sleep(0.05)
"""


def test_a_run_killed_for_ram_says_in_which_phase(tmp_path, monkeypatch):
    """A killed rank writes no JSON: its phase comes from the marker its PhaseTrace keeps, so that
    notebook 06 can say where the 3B met the wall (run 19: inside deepspeed.initialize)."""
    (tmp_path / "fake_hog.py").write_text(FAKE_HOG)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    r = runner.run(spec(ram_limit_bytes=2 * 10**9), entry="fake_hog:hog_in_initialize")
    assert r.status == runner.KILLED_RAM and r.last_phase == "deepspeed.initialize", r
    assert "(10.0 GB) during deepspeed.initialize" not in r.message  # the real peak, not made up
    assert "during deepspeed.initialize: on Colab" in r.message, r.message


def test_other_errors_carry_their_message():
    bad = spec()
    bad.ds_config["zero_optimization"]["no_such_key"] = 1
    r = runner.measure(bad)
    assert r.status == runner.ERROR and "no_such_key" in r.message


def test_two_cpu_ranks_hold_the_zero_fractions():
    runs = {(stage, n): runner.measure(spec(stage, world_size=n, steps=2)) for stage in (1, 3) for n in (1, 2)}
    assert all(r.status == runner.OK for r in runs.values())
    one, two = runs[(1, 1)].ranks[0], runs[(1, 2)].ranks
    assert [r["optimizer_bytes"] for r in two] == [one["optimizer_bytes"] // 2] * 2
    assert all(r["params_bytes"] == one["params_bytes"] for r in two)
    solo3 = runs[(3, 1)].ranks[0]
    assert solo3["optimizer_bytes"] == one["optimizer_bytes"]  # ZeRO-3's fp32 masters count too: 12 B/param
    assert all(abs(r["params_bytes"] - solo3["params_bytes"] / 2) <= 0.02 * solo3["params_bytes"] for r in runs[(3, 2)].ranks)


def test_a_run_installs_the_fixes_its_config_needs_and_the_table_names_them():
    ds = config.build(stage=3, offload_optimizer="cpu", **CPU_FP32)
    offloaded = runner.measure(runner.RunSpec(ds_config=ds, shape="tiny", steps=2, force_cpu=True,
                                              label="stage 3 + opt->cpu"))
    assert offloaded.status == runner.OK
    assert offloaded.deepspeed_fixes == ["fix_stage3_overflow_check"]
    plain = runner.RunResult("stage 2", runner.OK)
    note = runner.fixes_note([offloaded, plain])
    assert "fix_stage3_overflow_check in stage 3 + opt->cpu;" in note and "stage 2" not in note
    assert "needed none" in runner.fixes_note([plain])
    assert runner.fixes_note([offloaded]).endswith("stage 3 + opt->cpu.")  # no "other runs"
    with pytest.raises(ValueError):  # a label for every run, or the note would drop runs
        runner.fixes_note([offloaded, plain], ["only one"])
    assert runner.results_table([offloaded, plain]).note == note


def _rows(ranks: int, halve: bool, peak: int = 100, losses=(2.0, 1.0)) -> list[runner.Row]:
    out = []
    for label, choice in config.STAGE_ROWS:
        if choice not in stages_and_offload.TWO_RANK_KINDS:
            continue
        share = 2 if (halve and ranks == 2 and choice["stage"] >= 1) else 1
        per = {"optimizer_bytes": 800 // share, "grads_bytes": 400 // share,
               "params_bytes": 400 // (share if choice["stage"] == 3 else 1), "peak_gpu_allocated_bytes": peak}
        result = runner.RunResult(label, runner.OK, losses=list(losses), peak_gpu_allocated_bytes=peak,
                                 ranks=[dict(per, rank=i) for i in range(ranks)])
        out.append(runner.Row(label, choice, None, result, None))
    return out


def test_two_rank_checks_hold_for_zero_fractions_and_fail_otherwise():
    cpu = env.describe()
    assert all(held for _, held in stages_and_offload.two_rank_checks(_rows(1, True), _rows(2, True), cpu))
    failed = [claim for claim, held in stages_and_offload.two_rank_checks(_rows(1, True), _rows(2, False), cpu) if not held]
    assert "stage 1: optimizer halved on each of 2 ranks" in failed and "stage 3: params halved on each of 2 ranks" in failed
    assert "stage 0: optimizer whole on each of 2 ranks" not in failed
    two = _rows(2, True)
    two[1].result.losses, two[2].result.losses = [2.0, 1.5], [2.5, 1.0]
    drift = [c for c, held in stages_and_offload.two_rank_checks(_rows(1, True), two, cpu) if not held]
    assert drift == ["stage 1: 2-rank losses match 2-rank stage 0 (within 0.0001)",
                     "stage 2: first loss with 2 ranks equals 1 rank's (within 0.0001)",
                     "stage 2: 2-rank losses match 2-rank stage 0 (within 0.0001)"]
    gpu = dataclasses.replace(cpu, gpu_name="T4", gpu_count=2, precision="fp16")
    same_peak = [c for c, held in stages_and_offload.two_rank_checks(_rows(1, True), _rows(2, True), gpu) if not held]
    assert "stage 3: less GPU memory per rank with 2 ranks than with 1" in same_peak
    assert not [c for c, held in stages_and_offload.two_rank_checks(_rows(1, True, peak=100), _rows(2, True, peak=60), gpu) if not held]


def test_two_rank_plan_follows_the_gpus():
    cpu = env.describe()
    assert stages_and_offload.two_rank_plan(cpu)[0] == "cpu"
    assert stages_and_offload.two_rank_plan(dataclasses.replace(cpu, gpu_name="T4", gpu_count=2))[0] == "gpu"
    where, why = stages_and_offload.two_rank_plan(dataclasses.replace(cpu, gpu_name="T4", gpu_count=1))
    assert where is None and "Kaggle" in why


def test_command_line_prints_the_table():
    done = subprocess.run([sys.executable, "-m", "helpers", "bench", "--shape", "tiny", "--stage", "1", "--steps", "2",
                           "--precision", "fp32"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Measured runs" in done.stdout and "stage 1" in done.stdout and " ok " in done.stdout


def test_command_line_matrix_with_two_ranks():
    done = subprocess.run([sys.executable, "-m", "helpers", "matrix", "--only", "stage 0,stage 3", "--world-size", "2",
                           "--shape", "tiny", "--steps", "2"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Per rank" in done.stdout and "stage 3" in done.stdout and "stage 1" not in done.stdout
    bad = subprocess.run([sys.executable, "-m", "helpers", "matrix", "--only", "stage 9"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "unknown matrix row" in bad.stderr


def test_nvme_cleanup_removes_only_this_runs_folder(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("keep me")
    beside = tmp_path / "run-1-other" / "zero_stage_3"  # another run's swap files, side by side
    beside.mkdir(parents=True)
    own = tmp_path / "run-2-this"
    (own / "zero_stage_3" / "optimizer" / "rank0").mkdir(parents=True)
    (own / "zero_stage_3" / "optimizer" / "rank0" / "0.tensor.swp").write_bytes(b"x" * 10)
    runner._remove_swap_files(str(own), str(tmp_path), created=True)
    assert mine.read_text() == "keep me" and beside.is_dir() and not own.exists()
    fresh = tmp_path / "fresh"
    (fresh / "run-3" / "zero_stage_3").mkdir(parents=True)
    runner._remove_swap_files(str(fresh / "run-3"), str(fresh), created=True)
    assert not fresh.exists()


def test_each_run_swaps_into_its_own_subfolder_and_leaves_the_parent_as_it_was(tmp_path, monkeypatch):
    from helpers import memory

    # two runs side by side once shared one folder: one overwrote (and deleted) the other's swap
    # files, and notebook 05's NVMe losses parted from stage 0's in CI
    assert env.libaio_available(), "libaio is missing: apt-get install -y libaio-dev"
    parent = tmp_path / "offload"
    choice = dict(config.STAGE_ROWS)["stage 3 + NVMe offload"]
    ds = config.for_row(choice, memory.ModelInfo.for_shape("tiny"), None, 2, precision="fp32",
                           nvme_path=str(parent))
    moved = runner.with_nvme_folder(ds, str(parent / "run-x"))
    zero, was = moved["zero_optimization"], ds["zero_optimization"]
    assert zero["offload_param"]["nvme_path"] == str(parent / "run-x")
    assert zero["offload_optimizer"]["nvme_path"] == str(parent / "run-x")
    assert was["offload_param"]["nvme_path"] == str(parent)  # the caller's config is untouched
    seen, real = [], runner._folder_bytes
    monkeypatch.setattr(runner, "_folder_bytes", lambda path: seen.append(path) or real(path))
    result = runner.measure(runner.RunSpec(ds_config=ds, shape="tiny", steps=2, force_cpu=True))
    assert result.status == runner.OK, result.message
    assert seen and all(os.path.dirname(p) == str(parent) for p in seen), seen
    assert result.peak_nvme_bytes > 0 and not parent.exists()


def test_an_error_row_fails_the_matrix_checks_but_a_limit_does_not():
    machine = env.describe()
    row = lambda label, status, msg: runner.Row(label, dict(config.STAGE_ROWS)[label], None,
                                                runner.RunResult(label, status, msg, losses=[2.0, 1.0]), None)
    claim = "every config ran, or hit a limit, or says why it did not run (no errors)"
    fine = [row("stage 0", runner.OK, ""), row("stage 1", runner.OOM, "CUDA out of memory"),
            row("stage 3 + NVMe offload", runner.NOT_HERE, "libaio missing")]
    assert dict(stages_and_offload.checks(fine, machine, nvme_ready=False))[claim]
    broken = fine + [row("stage 2", runner.ERROR, "DistNetworkError: port 29500 taken")]
    assert not dict(stages_and_offload.checks(broken, machine, nvme_ready=False))[claim]


def test_matrix_plots_include_step_times_and_losses():
    import matplotlib
    matplotlib.use("Agg")
    rows = _rows(1, True)
    for r in rows:
        r.result.median_step_s = 0.5
    figures = stages_and_offload.plot(rows, env.describe())  # no GPU here: host RAM, step times, losses
    titles = [f.axes[0].get_title() for f in figures]
    assert len(figures) == 3 and titles[1].startswith("Seconds per step") and "loss" in titles[2]


def test_the_engine_loop_each_run_executes_is_shown_as_source():
    from helpers import show, taught

    shown = show.Source(runner.train_steps)
    assert str(shown).startswith("# helpers.runner.train_steps\ndef train_steps(")
    assert "deepspeed.initialize(" in shown.code and "taught.train_step(engine" in shown.code
    step = show.Source(taught.train_step)  # notebook 07's lesson cell, generated
    for call in ("engine.backward(loss)", "engine.step()"):
        assert call in step.code
    assert "<details>" in step._repr_html_() and "engine.step()" in step._repr_html_()


def test_the_config_is_the_one_carrier_of_the_micro_batch_and_the_ranks():
    """A run reads its micro batch and rank count from its DeepSpeed config, as
    deepspeed.initialize does: no second number to keep equal, and a config that gives none is
    refused with the fix."""
    ds = config.build(stage=2, trainer=False, precision="fp32", pin_memory=False, micro_batch=4, world_size=2)
    spec = runner.RunSpec(ds_config=ds)
    assert (spec.micro_batch, spec.world_size) == (4, 2)
    assert "micro_batch" not in dataclasses.asdict(spec)  # a rank rebuilds it from the config alone
    with pytest.raises(TypeError):
        runner.RunSpec(ds_config=ds, micro_batch=2)
    for said_nothing in (config.build(stage=2, trainer=True), {"zero_optimization": {"stage": 2}}):
        with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu is .*helpers.config.build"):
            runner.RunSpec(ds_config=said_nothing)
    one = runner.RunSpec(ds_config={"train_micro_batch_size_per_gpu": 3})
    assert (one.micro_batch, one.world_size) == (3, 1)


def test_a_lesson_rows_own_micro_batch_runs_on_the_ranks_asked(monkeypatch):
    """Notebook 05's lesson configs write their micro batch; on two ranks the total must follow it
    (a config without train_batch_size would run on one rank)."""
    seen = []
    monkeypatch.setattr(runner, "measure", lambda s: seen.append(s) or runner.RunResult(s.label, runner.OK))
    written = {"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 2}}
    runner.run_matrix("tiny", env.describe(), 2, 32, 1, configs={"mine": written}, world_size=2,
                      progress=False)
    assert (seen[0].micro_batch, seen[0].world_size) == (3, 2)
    assert seen[0].ds_config["train_batch_size"] == 6


@pytest.mark.parametrize("lora", [None, {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}])
def test_a_run_trains_a_from_pretrained_model_in_training_mode_with_checkpointing(tmp_path, lora):
    """from_pretrained returns a model in evaluation mode, where transformers skips activation
    checkpointing: a run of a model folder (notebook 09's) must train it as the Trainer does."""
    from helpers import models

    folder = models.save_offline_model(tmp_path / "model", "tiny")
    ds = config.build(stage=0, **CPU_FP32)
    model, _ = runner.prepared_model(runner.RunSpec(ds_config=ds, model_path=str(folder),
                                                    grad_ckpt=True, lora=lora))
    base = model.get_base_model() if lora else model
    checkpointing = getattr(base, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers 4's name
        checkpointing = base.is_gradient_checkpointing
    assert model.training and base.training and checkpointing
    assert all(m.training for m in base.modules())
