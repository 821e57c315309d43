"""Every notebook's check list fails on a bad run: the shared rules (helpers.claims), then each
notebook's claims fed a result that should trip them (an all-out-of-memory matrix, NVMe rows that
did not run, a loss that jumps at the last step, a run killed for RAM, an op that loads but
computes wrongly, a wrong accelerator)."""

import dataclasses
import math

import pytest

from helpers import claims, config, doctor, env, memory, runner
from helpers.lessons import biggest_model
from helpers.lessons import stages_and_offload
from helpers.lessons import zero2_training
from helpers.lessons import ds_report
from helpers.lessons import gpu_check

XL_RUN = [11.17, 7.26, 7.24, 7.20, 9.31]  # GPT-2 XL once: the last step jumped back up


# ---- the shared rules -----------------------------------------------------------------------------


@pytest.mark.parametrize("losses", [[10.9, 9.0, 7.5, 6.1], [11.0, 11.0, 10.2, 9.9, 9.5, 9.6],
                                    [5.4, 5.9, 4.0, 3.0, 2.0, 1.5, 1.6, 1.5, 1.4],  # an early Adam spike
                                    [10.0, 6.0, 6.5, 5.0, 5.2, 4.9, 5.1]])
def test_a_falling_loss_passes(losses):
    assert claims.loss_falls(losses) and claims.loss_falls_claim("x", losses)[1]


@pytest.mark.parametrize("losses, why", [
    (XL_RUN, "jumps back at the last step"),
    ([10.9, 16.7, 5.0, 4.0], "a step above the first"),
    ([10.0, 9.0, 8.0, 11.0, 6.0, 5.0], "a step above the first after the first third"),
    ([10.0, 10.0, 10.0, 10.0], "flat"),
    ([10.0, 9.0, math.nan, 8.0], "not finite"),
    ([10.0, 9.0], "too few steps to show a trend"),
    ([], "nothing recorded"),
    ([10.0, 4.0, 9.0, 9.5, 9.8, 9.9], "the last third is not below the first"),
])
def test_a_loss_that_does_not_fall_fails(losses, why):
    assert not claims.loss_falls(losses), why
    assert not claims.loss_falls_claim("x", losses)[1]


def test_an_empty_comparison_is_a_failure_not_a_pass():
    assert not claims.every([]) and not claims.every(iter(()))
    assert claims.every([True, True]) and not claims.every([True, False])
    assert not claims.within(None, 1.0, 0.1) and claims.within(1.05, 1.0, 0.1)


# ---- notebook 05: the matrix ------------------------------------------------------------------------


def _row(label, choice, status=runner.OK, losses=(10.0, 9.0, 8.0, 7.0), gpu=None):
    result = runner.RunResult(label, status, "" if status == runner.OK else f"{status} (test)", losses=list(losses),
                             peak_gpu_allocated_bytes=gpu)
    return runner.Row(label, choice, None, result, None)


def _matrix(**status):
    return [_row(label, choice, status.get(label, runner.OK)) for label, choice in config.STAGE_ROWS]


@pytest.fixture(scope="module")
def cpu():
    """This CPU as the kit sees it, with fixed RAM figures: without emulation the budget is what is
    free when measured, which other processes (CI's workers) would make vary from run to run."""
    return dataclasses.replace(env.describe(), notebook_ram_bytes=16 * 10**9,
                               ram_budget_bytes=15 * 10**9)


def failed(found):
    return claims.failed(found)


def test_a_good_matrix_passes(cpu):
    assert failed(stages_and_offload.checks(_matrix(), cpu, nvme_ready=True)) == []


def test_an_all_out_of_memory_matrix_fails(cpu):
    rows = _matrix(**{label: runner.OOM for label, _ in config.STAGE_ROWS})
    bad = failed(stages_and_offload.checks(rows, cpu, nvme_ready=True))
    assert "stage 0 ran (the baseline every row is compared with)" in bad
    assert "at least one offload config ran" in bad
    assert any(c.startswith("at least two ZeRO configs compared") for c in bad)
    assert any(c.startswith("stage 0: the loss falls") for c in bad)
    summary = stages_and_offload.summary(rows, stages_and_offload.checks(rows, cpu, nvme_ready=True))
    assert "losses agree with stage 0: False" in summary and "all checks held: False" in summary


def test_nvme_rows_that_did_not_run_fail_where_libaio_is_ready(cpu):
    rows = _matrix(**{"stage 3 + NVMe offload": runner.NOT_HERE})
    assert "libaio is ready here, so the NVMe row ran" in failed(stages_and_offload.checks(rows, cpu, nvme_ready=True))
    assert failed(stages_and_offload.checks(rows, cpu, nvme_ready=False)) == []


def test_losses_that_differ_from_stage_0_fail(cpu):
    rows = _matrix()
    rows[2] = _row("stage 2", {"stage": 2}, losses=(10.0, 9.0, 8.0, 7.5))
    assert any(c.startswith("stage 2: losses match stage 0") for c in failed(stages_and_offload.checks(rows, cpu, True)))


def test_a_stage_0_loss_that_jumps_at_the_last_step_fails(cpu):
    rows = [_row(label, choice, losses=XL_RUN) for label, choice in config.STAGE_ROWS]
    assert any(c.startswith("stage 0: the loss falls") for c in failed(stages_and_offload.checks(rows, cpu, True)))


def test_on_a_gpu_offload_must_run_and_save_memory(cpu):
    gpu = dataclasses.replace(cpu, gpu_name="Tesla T4", gpu_count=1, capability=(7, 5), precision="fp16")
    rows = [_row(label, choice, gpu=2**30 if "offload" in label else 2 * 2**30) for label, choice in config.STAGE_ROWS]
    rows[4] = _row("stage 2 + CPU offload", rows[4].choice, status=runner.OOM)
    bad = failed(stages_and_offload.checks(rows, gpu, nvme_ready=False))
    assert "stage 2 + CPU offload uses less GPU memory than stage 2 (one did not run)" in bad


def test_a_subset_of_rows_is_held_to_its_own_pairs_and_names_its_model(cpu):
    gpu = dataclasses.replace(cpu, gpu_name="Tesla T4", gpu_count=1, capability=(7, 5), precision="fp16")
    labels = ["stage 0", "stage 2", "stage 2 + CPU offload"]  # notebook 05's Llama-style rows
    rows = [_row(label, choice, gpu=2**30 if "offload" in label else 2 * 2**30)
            for label, choice in config.STAGE_ROWS if label in labels]
    found = stages_and_offload.checks(rows, gpu, nvme_ready=False, model="smollm2-360m-shaped")
    assert failed(found) == [] and all(c.startswith("smollm2-360m-shaped: ") for c, _ in found)
    assert not any("stage 3" in c for c, _ in found)
    rows[2] = _row("stage 2 + CPU offload", rows[2].choice, gpu=3 * 2**30)  # offload saved nothing
    assert ("smollm2-360m-shaped: stage 2 + CPU offload uses less GPU memory than stage 2"
            in failed(stages_and_offload.checks(rows, gpu, nvme_ready=False, model="smollm2-360m-shaped")))


def test_rows_a_lesson_renames_are_checked_as_what_their_configs_are(cpu):
    """The checks pick rows by their configs (stage, offload devices), not their labels: a lesson
    that calls its rows "ZeRO-2" and "ZeRO-2, optimizer in RAM" is held to the same claims."""
    gpu = dataclasses.replace(cpu, gpu_name="Tesla T4", gpu_count=1, capability=(7, 5), precision="fp16")
    names = {"stage 0": "no ZeRO", "stage 2": "ZeRO-2", "stage 2 + CPU offload": "ZeRO-2, optimizer in RAM"}
    rows = [_row(names[label], choice, gpu=3 * 2**30 if "offload" in label else 2 * 2**30)
            for label, choice in config.STAGE_ROWS if label in names]  # offload saved nothing
    bad = failed(stages_and_offload.checks(rows, gpu, nvme_ready=False))
    assert bad == ["ZeRO-2, optimizer in RAM uses less GPU memory than ZeRO-2"]
    rows[0] = _row("no ZeRO", {"stage": 0}, status=runner.OOM)
    assert ("stage 0 ran (the baseline every row is compared with)"
            in failed(stages_and_offload.checks(rows, gpu, nvme_ready=False)))
    for row in rows:
        row.result.median_step_s = 1.0
    lines = stages_and_offload.takeaways(rows, cpu)
    assert any(line.startswith("No GPU here, so CPU offload had nothing to move") for line in lines)


def test_two_shapes_side_by_side_quote_both_runs(cpu):
    def rows(shape, gib):
        out = [_row(label, choice, gpu=gib * 2**30) for label, choice in config.STAGE_ROWS[:3]]
        for r in out:
            r.spec = runner.RunSpec(ds_config={"train_micro_batch_size_per_gpu": 4}, shape=shape)
            r.result.median_step_s = gib / 10
        return out

    gpu = dataclasses.replace(cpu, gpu_name="Tesla T4", gpu_count=1, capability=(7, 5), precision="fp16")
    line = stages_and_offload.shape_takeaway(rows("gpt2-355m", 5), rows("smollm2-360m-shaped", 6), gpu)
    assert line.startswith("Peak GPU, gpt2-355m vs smollm2-360m-shaped: stage 0 5.00 vs 6.00 GiB, 0.50 vs 0.60")
    none_ran = [_row(label, choice, status=runner.OOM) for label, choice in config.STAGE_ROWS[:3]]
    assert "no config that ran under both" in stages_and_offload.shape_takeaway(rows("gpt2-355m", 5), none_ran, gpu)


# ---- notebook 06: the ladder ------------------------------------------------------------------------


def _phases(forward_backward=2**30, step=2**30 + 10 * 2**20):
    return [{"name": "forward and backward", "start_bytes": 2**29, "peak_bytes": forward_backward, "entries": 6},
            {"name": "optimizer step", "start_bytes": 2**29, "peak_bytes": step, "entries": 6}]


def _rung(shape, method, status=runner.OK, losses=(10.8, 10.0, 9.5, 9.0, 8.7, 8.5), steps=6):
    result = runner.RunResult(f"{shape} {method}", status, "" if status == runner.OK else f"{status} (test)",
                             losses=list(losses) if status == runner.OK else [], steps_done=steps,
                             peak_host_rss_bytes=2**30, peak_gpu_allocated_bytes=2 * 2**30,
                             rss_phases=_phases())
    spec = None
    if biggest_model.is_nvme(method):  # the config the ladder gives it (its optimizer sub-groups)
        ds = config.zero_infinity(memory.ModelInfo.for_shape(shape),
                                  config.t4_profile(env.describe()), 4, "/tmp/zero_kit_offload")
        saves = shape == "gpt2-1.5b"  # the headline saves and reloads (run_ladder)
        spec = runner.RunSpec(ds_config=ds, shape=shape,
                              save_reload_dir="/tmp/zero_kit_offload/saved" if saves else None)
        if saves and status == runner.OK:
            result.reload_logit_diff, result.saved_bytes, result.save_s = 1e-3, 10**9, 5.0
    return biggest_model.Rung(shape, method, result, 1, spec=spec)


def _ladder(headline_status=runner.OK, nvme_status=runner.OK, losses=(10.8, 10.0, 9.5, 9.0, 8.7, 8.5)):
    out = []
    for shape in ("tiny", "gpt2-1.5b"):
        for method, _ in biggest_model.METHODS:
            if method == biggest_model.NVME_FROZEN:  # the lever: not tried where all trained whole
                continue
            if method.startswith("stage 0") and shape == "gpt2-1.5b":
                out.append(_rung(shape, method, runner.OOM))
            elif biggest_model.is_nvme(method):  # weights on NVMe, or only the optimizer
                out.append(_rung(shape, method, headline_status if shape == "gpt2-1.5b" else nvme_status,
                                 losses))
            else:
                out.append(_rung(shape, method))
    return out


def test_a_good_ladder_passes(cpu):
    assert failed(biggest_model.checks(_ladder(), cpu, "gpt2-1.5b", nvme_ready=True)) == []


def test_nvme_rows_all_not_here_fail_where_libaio_is_ready(cpu):
    rungs = [r for r in _ladder(nvme_status=runner.NOT_HERE, headline_status=runner.NOT_HERE)]
    bad = failed(biggest_model.checks(rungs, cpu, None, nvme_ready=True))
    assert any(c.startswith("libaio is ready, so ZeRO-3 + NVMe trained") for c in bad)


def test_a_headline_killed_for_ram_fails(cpu):
    bad = failed(biggest_model.checks(_ladder(headline_status=runner.KILLED_RAM), cpu, "gpt2-1.5b", nvme_ready=True))
    assert "gpt2-1.5b trains with ZeRO-3 + NVMe" in bad


def test_a_headline_trained_only_with_its_embedding_frozen_fails(cpu):
    # the headline is the largest size trained whole: the lever's rung does not stand in for it
    rungs = [r for r in _ladder(headline_status=runner.KILLED_RAM)]
    rungs.append(_rung("gpt2-1.5b", biggest_model.NVME_FROZEN))
    bad = failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True))
    assert "gpt2-1.5b trains with ZeRO-3 + NVMe" in bad


def _headline_nvme(rungs):
    return [r for r in rungs if r.shape == "gpt2-1.5b" and biggest_model.is_nvme(r.method)]


RELOAD_CLAIM = ("the NVMe runs from gpt2-1.5b up save their weights in shards that "
                "from_pretrained reloads to the trained logits")


def test_a_headline_whose_save_reloads_other_logits_or_did_not_save_fails(cpu):
    rungs = _ladder()
    top = _headline_nvme(rungs)
    top[0].result.reload_logit_diff = 0.2  # past fp16's 5e-2: the reload is not the model trained
    assert failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True)) == [RELOAD_CLAIM]
    top[0].result.reload_logit_diff = None  # the save or the reload never happened
    assert failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True)) == [RELOAD_CLAIM]
    for r in top:
        r.spec.save_reload_dir = None  # no rung saved at all: nothing shows the save works
    assert failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True)) == [RELOAD_CLAIM]


def test_a_headline_killed_while_saving_fails_the_reload_claim(cpu):
    rungs = _ladder()
    top = _headline_nvme(rungs)[0]
    top.result.status, top.result.message = runner.KILLED_RAM, "killed (test)"
    top.result.last_phase, top.result.reload_logit_diff = runner.SAVE_PHASE, None
    assert RELOAD_CLAIM in failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True))
    top.result.last_phase = "forward and backward"  # killed in training: not a save's failure
    assert RELOAD_CLAIM not in failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True))


def test_a_headline_that_finished_over_the_ram_budget_fails(cpu):
    rungs = _ladder()
    for r in _headline_nvme(rungs):
        r.result.peak_host_rss_bytes = cpu.ram_budget_bytes + 1
    bad = failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True))
    assert any(c.startswith("gpt2-1.5b: peak host RSS within") for c in bad), bad
    # one NVMe method within the budget is enough: the check names the one that fits
    _headline_nvme(rungs)[-1].result.peak_host_rss_bytes = 2**30
    assert failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True)) == []


def test_a_headline_peak_between_two_samples_fails(cpu):
    """The kill samples the tree's RSS every 0.1 s; a spike between two samples (seen by the
    process's own getrusage high-water mark) past the budget would still be killed on Colab."""
    rungs = _ladder()
    for r in _headline_nvme(rungs):
        r.result.ranks = [{"rank": 0, "rss_high_water_bytes": cpu.ram_budget_bytes + 1}]
    bad = failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True))
    assert any(c.startswith("gpt2-1.5b: peak host RSS within") for c in bad), bad
    _headline_nvme(rungs)[0].result.ranks = [{"rank": 0, "rss_high_water_bytes": None}]
    assert failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True)) == []


def test_the_headline_is_held_to_the_limit_its_run_was_killed_at(cpu):
    """The ladder's kill limit is the notebook's RAM less the kernel's RSS when the ladder starts,
    which can be less than the budget measured at the top of the notebook."""
    rungs = _ladder()
    for r in _headline_nvme(rungs):
        r.ram_limit_bytes = 2**29  # the kernel grew: half a GiB was left
    bad = failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True))
    assert any(c.startswith("gpt2-1.5b: peak host RSS within the run's 0.5 GB") for c in bad), bad


def t4(cpu):
    return dataclasses.replace(cpu, gpu_name="NVIDIA H200", gpu_count=1, capability=(7, 5), precision="fp16",
                               emulation=env.EMULATIONS["t4"],
                               gpu_cap_bytes=env.EMULATIONS["t4"].gpu_cap_bytes)


def test_on_a_gpu_the_headline_must_fit_the_cap_under_emulation(cpu):
    assert failed(biggest_model.checks(_ladder(), t4(cpu), "gpt2-1.5b", nvme_ready=True)) == []
    rungs = _ladder()
    for r in _headline_nvme(rungs):  # over a T4's allocator (14.75 GiB less the CUDA context)
        r.result.peak_gpu_allocated_bytes = int(14.74 * 2**30)
    cap = f"{env.EMULATIONS['t4'].gpu_cap_bytes / 2**30:.2f} GiB"
    assert any(f"peak GPU memory within the {cap} PyTorch has on a T4 (T4 emulation)" in c
               for c in failed(biggest_model.checks(rungs, t4(cpu), "gpt2-1.5b", True)))


def test_on_a_real_gpu_without_emulation_the_headline_is_held_to_a_t4s_allocator(cpu):
    """On Colab's real T4 nothing is emulated: the claim must hold there (it once required emulation
    and failed on every real T4), and on a bigger GPU a peak past a T4's allocator must still
    fail."""
    real_t4 = dataclasses.replace(t4(cpu), gpu_name="Tesla T4", emulation=None, gpu_cap_bytes=None)
    assert failed(biggest_model.checks(_ladder(), real_t4, "gpt2-1.5b", nvme_ready=True)) == []
    rungs = _ladder()
    for r in _headline_nvme(rungs):
        r.result.peak_gpu_allocated_bytes = int(14.74 * 2**30)
    a100 = dataclasses.replace(real_t4, gpu_name="NVIDIA A100-SXM4-40GB", capability=(8, 0))
    bad = failed(biggest_model.checks(rungs, a100, "gpt2-1.5b", True))
    assert any("PyTorch has on a T4" in c and "measured on NVIDIA A100" in c for c in bad), bad


def test_an_all_out_of_memory_ladder_fails_even_without_libaio(cpu):
    rungs = [_rung(r.shape, r.method, runner.OOM) for r in _ladder()]
    bad = failed(biggest_model.checks(rungs, cpu, None, nvme_ready=False))
    assert "the smallest size (tiny) trained under stage 0 and ZeRO-2 + CPU offload" in bad


def test_a_headline_loss_that_jumps_at_the_last_step_fails(cpu):
    bad = failed(biggest_model.checks(_ladder(losses=XL_RUN), cpu, "gpt2-1.5b", nvme_ready=True))
    assert any(c.startswith("gpt2-1.5b: the loss falls") for c in bad)


def test_a_headline_that_fits_under_stage_0_fails(cpu):
    rungs = [_rung(r.shape, r.method) if r.method.startswith("stage 0") else r for r in _ladder()]
    bad = failed(biggest_model.checks(rungs, t4(cpu), "gpt2-1.5b", True))
    assert "gpt2-1.5b under stage 0 runs out of GPU memory" in bad


def _without_libaio(status=runner.NOT_HERE, message="libaio missing: apt-get install -y libaio-dev"):
    rungs = []
    for r in _ladder():
        if biggest_model.is_nvme(r.method):
            r = _rung(r.shape, r.method, status)
            r.result.message = message
        rungs.append(r)
    return rungs


def test_without_libaio_the_headline_is_reported_not_run_and_the_checks_hold(cpu):
    """Colab as it is (no libaio): the NVMe rungs say why they did not run, no NVMe claim is made,
    and the checks hold to what ran (stage 0 still runs out of GPU memory at the headline)."""
    for machine in (cpu, t4(cpu)):
        held = biggest_model.checks(_without_libaio(), machine, "gpt2-1.5b", nvme_ready=False)
        assert failed(held) == [], failed(held)
        assert not any("trains with ZeRO-3 + NVMe" in c for c, _ in held)
    bad = failed(biggest_model.checks(_without_libaio(status=runner.ERROR, message="boom"), cpu, "gpt2-1.5b",
                                 nvme_ready=False))
    assert any(c.startswith("libaio is missing, so every ZeRO-3 + NVMe rung is reported") for c in bad)
    no_nvme_rows = [r for r in _ladder() if not biggest_model.is_nvme(r.method)]
    assert any(c.startswith("libaio is missing") for c in failed(
        biggest_model.checks(no_nvme_rows, cpu, "gpt2-1.5b", nvme_ready=False)))  # nothing to report: fails
    fits = [_rung(r.shape, r.method) if r.method.startswith("stage 0") else r for r in _without_libaio()]
    assert "gpt2-1.5b under stage 0 runs out of GPU memory" in failed(
        biggest_model.checks(fits, t4(cpu), "gpt2-1.5b", nvme_ready=False))


STEP_CLAIM = "the optimizer step adds at most"


@pytest.mark.parametrize("phases, why", [
    (_phases(step=2**30 + int(3 * 1.56e9)), "DeepSpeed's own overflow check: +3 bytes/param at XL"),
    ([], "no phases recorded"),
    (_phases()[:1], "no optimizer step recorded"),
])
def test_an_optimizer_step_that_swells_host_ram_fails(cpu, phases, why):
    rungs = _ladder()
    top = rungs[-1]
    top.n_params = int(1.56e9)
    top.result.rss_phases = phases
    bad = failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True))
    assert any(c.startswith(STEP_CLAIM) for c in bad), why
    top.result.rss_phases = _phases(step=2**30 + int(0.3 * 1.56e9))  # what the other consumers add
    assert failed(biggest_model.checks(rungs, cpu, "gpt2-1.5b", nvme_ready=True)) == []


def test_a_start_far_from_ln_vocab_fails(cpu):
    rungs = _ladder(losses=(120.0, 90.0, 60.0, 40.0, 30.0, 20.0))
    assert any(c.startswith("NVMe runs start from a normal loss") for c in failed(biggest_model.checks(rungs, cpu, None, True)))


# ---- notebook 04: training ----------------------------------------------------------------------------


def _train_run(losses):
    records = [{"step": i + 1, "loss": x} for i, x in enumerate(losses)]
    return zero2_training.TrainRun("ok", "", records, None, 1.0, 2)


def test_training_checks_fail_on_a_last_step_jump_and_an_unreported_oom(cpu):
    oom = ("out of GPU memory at micro batch 512: lower per_device_train_batch_size and raise "
           "gradient_accumulation_steps to keep the batch")
    fresh = (10.8, 9.0)  # a freshly initialised model's held-out loss, falling
    good = zero2_training.checks(_train_run([10.0, 8.0, 6.0, 5.0, 4.0, 3.5]), 0.0, (True, True), oom, cpu,
                                 fresh, 49152)
    assert failed(good) == []
    bad = failed(zero2_training.checks(_train_run([10.0, 8.0, 6.0, 5.0, 4.0, 9.5]), 0.0, (True, True),
                              "", cpu, fresh, 49152))
    assert any(c.startswith("training: the loss falls") for c in bad)
    assert "out of GPU memory was reported with advice" in bad


def test_training_checks_from_a_pretrained_start(cpu):
    """SmolLM2's noisy fine-tuning losses pass from a pretrained start; a held-out loss that does not
    fall, a NaN, or most steps skipped for overflow fail."""
    oom = ("out of GPU memory at micro batch 512: lower per_device_train_batch_size and raise "
           "gradient_accumulation_steps to keep the batch")
    noisy = [5.165, 4.792, 4.24, 3.838, 3.76, 3.606, 3.658, 4.098, 3.59, 4.068, 5.2, 3.745]
    good = zero2_training.checks(_train_run(noisy), 0.0, (True, True), oom, cpu, (4.96, 3.66), 49152)
    assert failed(good) == []
    assert any(c.startswith("the model starts pretrained") for c, _ in good)
    assert any("held-out loss fell" in c for c in failed(
        zero2_training.checks(_train_run(noisy), 0.0, (True, True), oom, cpu, (4.96, 4.97), 49152)))
    assert any(c.startswith("training from a pretrained start") for c in failed(
        zero2_training.checks(_train_run(noisy[:-1] + [math.nan]), 0.0, (True, True), oom, cpu, (4.96, 3.66),
                              49152)))
    skipping = _train_run(noisy)
    for record in skipping.records[-1:]:
        record["skipped_steps"] = 9
    assert any("skipped for fp16 overflow" in c for c in failed(
        zero2_training.checks(skipping, 0.0, (True, True), oom, cpu, (4.96, 3.66), 49152)))
    assert "barely trained" in claims.overflow_advice(9, "fp16", 12)


# ---- notebook 01: the machine -------------------------------------------------------------------------


def test_machine_checks_fail_on_a_wrong_accelerator_a_bad_matmul_and_an_unwritable_folder(cpu, monkeypatch,
                                                                                           tmp_path):
    monkeypatch.setattr(env, "dist_roundtrip", lambda: True)
    assert failed(gpu_check.check_invariants(dataclasses.replace(cpu, offload_dir=str(tmp_path)))) == []
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setattr(gpu_check, "_accelerator_name", lambda: "cuda")
    monkeypatch.setattr(gpu_check, "precision_error", lambda precision: 0.5)
    found = gpu_check.check_invariants(dataclasses.replace(cpu, offload_dir=str(blocked / "sub")))
    bad = failed(found)
    assert len(bad) == 3, bad
    assert "all checks held: False" in gpu_check.summary(cpu, found)


def test_the_matmul_probe_measures_precision():
    assert gpu_check.precision_error("fp32") <= gpu_check.PRECISION_TOL["fp32"]
    assert gpu_check.PRECISION_TOL["fp32"] < gpu_check.precision_error("bf16") <= gpu_check.PRECISION_TOL["bf16"]


# ---- notebook 02: the ops -----------------------------------------------------------------------------


def _op(name, loads=True, works=True, why=""):
    return doctor.OpStatus(name, "", False, True, why, loads=loads, works=works, works_error=0.0 if works else 1.0)


def test_op_checks_fail_when_an_op_loads_but_computes_wrongly():
    facts = doctor.gather_facts(env.describe())
    facts = dataclasses.replace(facts, libaio=True, has_gpu=False)
    good = [_op("cpu_adam"), _op("async_io")]
    assert failed(ds_report.checks(facts, good)) == []
    bad = failed(ds_report.checks(facts, [_op("cpu_adam", works=False), _op("async_io", loads=False)]))
    assert len(bad) == 3, bad  # CPU Adam wrong, async_io missing, and its failed build has no reason
    assert "all checks held: False" in ds_report.summary(facts, good, ds_report.checks(facts, [_op("cpu_adam", works=False)]))


# ---- notebook 06's fine-tune ---------------------------------------------------------------------
# a pretrained TinyLlama-like run at a fine-tuning rate: batch-to-batch noise larger than its gain
PRETRAINED_LOSSES = [2.31, 2.25, 2.40, 2.28, 2.35, 2.22, 2.30, 2.27]
# run 25's offline default, a freshly initialised TinyLlama shape (docs/gpu_runs.md)
RANDOM_START_LOSSES = [10.676, 10.656, 10.535, 9.733, 8.019, 7.160, 6.722, 6.240]


def finetune_run(losses, skipped=0, gpu=3 * 2**30):
    return biggest_model.FinetuneRun(losses=list(losses), step_seconds=[22.0] * len(losses),
                                     skipped_steps=skipped, tokens_per_step=8192, wall_s=200.0,
                                     peak_host_rss_bytes=6 * 10**9, peak_gpu_allocated_bytes=gpu)


def finetune_failed(run, before, after, machine, vocab=32000, diff=0.0, precision="fp16"):
    return failed(biggest_model.finetune_checks(run, before, after, diff, precision, machine,
                                                vocab=vocab))


def test_a_healthy_finetune_passes_from_a_random_or_a_pretrained_start(cpu):
    assert finetune_failed(finetune_run(RANDOM_START_LOSSES), 10.707, 5.718, cpu) == []
    assert finetune_failed(finetune_run(PRETRAINED_LOSSES), 2.30, 2.21, cpu) == []
    assert claims.pretrained_start(2.30, 32000)
    assert not claims.pretrained_start(10.707, 32000)
    assert not claims.pretrained_start(2.30, None)


def test_the_random_start_rule_would_fail_a_healthy_pretrained_finetune(cpu):
    """Why a pretrained start has its own rule: the trend rule reads batch noise as a failure."""
    bad = finetune_failed(finetune_run(PRETRAINED_LOSSES), 2.30, 2.21, cpu, vocab=None)
    assert any(c.startswith("fine-tune: the loss falls") for c in bad), bad


def test_a_finetune_that_did_not_learn_fails_from_either_start(cpu):
    flat = [10.6, 10.7, 10.65, 10.7, 10.68, 10.66, 10.7, 10.69]
    assert any("the loss falls" in c for c in finetune_failed(finetune_run(flat), 10.7, 10.6, cpu))
    bad = finetune_failed(finetune_run(PRETRAINED_LOSSES), 2.30, 2.34, cpu)
    assert bad == ["the held-out loss fell (2.3000 -> 2.3400)"]
    nan = PRETRAINED_LOSSES[:4] + [math.nan] + PRETRAINED_LOSSES[5:]
    bad = finetune_failed(finetune_run(nan), 2.30, 2.21, cpu)
    assert any("every one finite" in c for c in bad), bad


def test_fp16_overflow_from_a_pretrained_start_fails_and_says_what_to_do(cpu):
    run = finetune_run(PRETRAINED_LOSSES, skipped=6)
    assert any("skipped for fp16 overflow (6)" in c for c in finetune_failed(run, 2.30, 2.21, cpu))
    advice = biggest_model.overflow_advice(run, "fp16", 8)
    assert "6 of 8" in advice and "initial_scale_power" in advice and "bf16" in advice
    ok = biggest_model.overflow_advice(finetune_run(PRETRAINED_LOSSES, skipped=1), "fp16", 8)
    assert "1 of 8" in ok and "normal" in ok
    assert "no step skipped" in biggest_model.overflow_advice(run, "bf16", 8)


def test_a_reload_that_changed_the_logits_fails(cpu):
    bad = finetune_failed(finetune_run(RANDOM_START_LOSSES), 10.707, 5.718, cpu, diff=0.2)
    assert bad == ["the reloaded folder gives the trained model's logits (within 0.05)"]


def test_a_finetune_past_a_t4s_allocator_fails_on_any_gpu(cpu):
    over = finetune_run(RANDOM_START_LOSSES, gpu=int(14.74 * 2**30))
    assert not any("GPU" in c for c, _ in biggest_model.finetune_checks(
        over, 10.707, 5.718, 0.0, "fp16", cpu, vocab=32000))  # no GPU: no GPU claim
    for machine in (t4(cpu), dataclasses.replace(t4(cpu), emulation=None, gpu_name="Tesla T4")):
        bad = finetune_failed(over, 10.707, 5.718, machine)
        assert len(bad) == 1 and bad[0].startswith("peak GPU memory within the"), bad
        assert finetune_failed(finetune_run(RANDOM_START_LOSSES), 10.707, 5.718, machine) == []


def test_a_modern_rung_killed_for_host_ram_names_what_stopped_it(cpu):
    """Run 19's moonshot: Llama-3.2-3B-shaped killed inside deepspeed.initialize at 12.76 GB; the
    takeaways name the estimator's largest host consumers for it, not only the budget."""
    rungs = _ladder()
    for r in rungs:
        r.result.median_step_s = 2.0
    wall = _rung("llama-3.2-3b-shaped", "ZeRO-3 + NVMe optimizer, weights on GPU",
                 runner.KILLED_RAM)
    wall.result.peak_host_rss_bytes = 12_760_000_000
    wall.result.last_phase = "deepspeed.initialize"  # from the rank's marker (helpers.runner)
    wall.ram_limit_bytes = 10_630_000_000
    info = memory.ModelInfo.for_shape("llama-3.2-3b-shaped")  # as the ladder runs it
    ds = config.zero_infinity(info, config.t4_profile(env.describe()), 4, "/tmp/zero_kit_offload",
                              offload_param="none")
    wall.spec = runner.RunSpec(ds_config=ds, shape=info.name, zero_init=True)
    lines = biggest_model.takeaways(rungs + [wall], t4(cpu))  # the estimate of a T4's run
    line = next(x for x in lines
                if x.startswith("llama-3.2-3b-shaped under ZeRO-3 + NVMe optimizer"))
    assert "killed for host RAM at 12.8 GB (past 10.6), in deepspeed.initialize" in line, line
    assert "the fp16 gradient partition" in line and "the optimizer's swap buffers" in line, line
    # killed by the system (the budget never passed), no phase recorded: said so, no "past 0.0"
    wall.ram_limit_bytes, wall.result.last_phase, wall.result.rss_phases = None, "", []
    line = biggest_model.ram_wall_line(wall, t4(cpu))
    assert "at 12.8 GB (by the system's out-of-memory killer). The estimator's" in line, line
    # a ladder with no such rung says nothing of a wall
    assert not any("killed for host RAM" in x for x in biggest_model.takeaways(rungs, t4(cpu)))


def test_notebook_06_requires_async_io_wherever_nvme_will_run():
    assert biggest_model.ops_needed("cpu", nvme_ready=False) == ["cpu_adam"]
    assert biggest_model.ops_needed("nvme", nvme_ready=False) == ["cpu_adam", "async_io"]
    # the fine-tune on CPU RAM, but the ladder's NVMe rungs run where libaio is ready
    assert biggest_model.ops_needed("cpu", nvme_ready=True) == ["cpu_adam", "async_io"]
