"""Notebook 09's helpers (helpers.lessons.zero_or_lora) and what they rest on: LoRA in the memory
estimator, every method's config, the largest model per method on a T4, the checks fed good and
bad runs, the saved adapter's check, and (in smoke mode, in a fresh process) LoRA under ZeRO-3
through the Trainer: its saved adapter non-empty and reloaded with the same logits, while the
careless save (``model.save_pretrained`` on the partitioned model) comes out empty."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import config, env, memory, runner
from helpers.lessons import zero_or_lora as lesson

T4 = env.EMULATIONS["t4"]
#: LoRA's settings as notebook 09's lesson cell writes them (LORA_SETTINGS), handed to the runs.
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}


@pytest.fixture(scope="module")
def cpu():
    return env.describe()


# ---- LoRA in the estimator -------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["tiny", "llama-tiny"])
def test_lora_params_counts_what_peft_adds(shape):
    from peft import LoraConfig, get_peft_model

    from helpers import models

    model = get_peft_model(models.build_model(models.model_config(shape)),
                           LoraConfig(task_type="CAUSAL_LM", **LORA))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trained == memory.lora_params(memory.ModelInfo.for_shape(shape), LORA["r"]) > 0


def test_lora_bytes_per_param_is_frozen_fp16_weights_plus_the_adapters_full_states():
    assert memory.lora_bytes_per_param(1000, 1000) == 16  # everything trains: mixed-precision Adam
    assert memory.lora_bytes_per_param(1000, 0) == 2  # nothing trains: the fp16 weights
    assert memory.lora_bytes_per_param(1000, 0, half=False) == 4
    assert memory.lora_bytes_per_param(1000, 10) == pytest.approx(2 + 14 * 0.01)


def test_the_estimate_counts_gradients_and_states_of_the_trained_parameters_only():
    info = memory.ModelInfo.for_shape("gpt2-355m")
    ds = {"fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 4,
          "zero_optimization": {"stage": 0}}
    full = memory.estimate(info, ds, seq_len=512)
    lora = memory.estimate(info, ds, seq_len=512, trainable=memory.lora_params(info, 8))
    same = memory.estimate(info, ds, seq_len=512, trainable=info.n_params)
    assert same.parts == full.parts  # trainable = all is the full estimate
    states = memory.model_states(info, ds, trainable=1000)["gpu"]
    assert states == {"params": 2 * info.n_params, "grads": 2 * 1000, "optimizer": 12 * 1000}
    assert lora.total("gpu") < full.total("gpu") - 10 * info.n_params  # 14 bytes/param and more


# ---- the methods' configs ---------------------------------------------------------------------


@pytest.mark.parametrize("name", lesson.METHOD_NAMES)
def test_every_method_config_passes_the_kits_checker(name, cpu):
    m = lesson.method(name)
    ds = lesson.method_config(m, memory.ModelInfo.for_shape("tiny"), cpu, 4, 12, 1e-3)
    errors = [p for p in config.check(ds) if p.level == "error"]
    assert not errors, errors
    zero = ds["zero_optimization"]
    assert ds["optimizer"]["params"]["lr"] == 1e-3
    assert zero["stage"] == m.choice["stage"]
    if "offload_optimizer" in zero:
        assert zero["offload_optimizer"]["pin_memory"] is m.pinned
    assert ("zenflow" in zero) is (name == lesson.ZENFLOW_NAME)
    assert ds.get("fp16", {}).get("fp16_master_weights_and_grads", False) is (name == lesson.FP16_MASTER)
    assert ("ratio" in zero.get("offload_optimizer", {})) is (name == lesson.PARTIAL)


def test_an_unknown_method_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="choose from"):
        lesson.method("QLoRA")


def test_the_partial_offload_row_is_notebook_05s_variant(cpu):
    from helpers.lessons import stages_and_offload

    info = memory.ModelInfo.for_shape("tiny")
    mine = lesson.method_config(lesson.method(lesson.PARTIAL), info, cpu, 4, 12, 3e-4)
    theirs = stages_and_offload.variant_config(lesson.PARTIAL, info, cpu, 4, 12)
    theirs["zero_optimization"]["offload_optimizer"]["pin_memory"] = False
    theirs["scheduler"]["params"].update(warmup_min_lr=3e-4 / 10, warmup_max_lr=3e-4)  # its rate
    assert mine == theirs


# ---- the largest model per method on a T4 ------------------------------------------------------


def test_lora_trains_the_largest_model_on_a_t4_and_host_ram_caps_cpu_offload(cpu):
    info = memory.ModelInfo.for_shape("gpt2-355m")
    most = {}
    for name in (lesson.LORA_NAME, lesson.FULL, lesson.UNPINNED):
        m = lesson.method(name)
        ds = lesson.method_config(m, info, cpu, 4, 20, 1e-4)
        ds["fp16"] = {**ds.get("fp16", {}), "enabled": True}
        most[name] = lesson.largest_on_t4(m, ds, 4, 512, lora_rank=LORA["r"] if m.lora else None)
    assert most[lesson.LORA_NAME] > 3 * most[lesson.FULL] > 3 * 3.55e8
    # On free Colab host RAM binds before the T4 does: CPU offload's optimizer (16 bytes per
    # parameter in RAM) caps it below what stage 0 trains on the GPU alone (docs/deepspeed_gaps.md).
    assert 3.55e8 < most[lesson.UNPINNED] < most[lesson.FULL]
    # the answer is the edge: a model 3% larger does not fit
    m = lesson.method(lesson.FULL)
    ds = lesson.method_config(m, info, cpu, 4, 20, 1e-4)
    ds["fp16"] = {"enabled": True}
    est = memory.estimate(memory.ModelInfo.from_count(int(most[lesson.FULL] * 1.03)), ds, seq_len=512)
    assert memory.verdict(est.total("gpu"), T4.gpu_cap_bytes) != memory.FITS


def _configured(cpu, *names):
    info = memory.ModelInfo.for_shape("gpt2-355m")
    return [lesson.MethodRun(lesson.method(n), runner.RunResult(n, runner.OK),
                             lesson.method_config(lesson.method(n), info, cpu, 4, 20, 1e-4))
            for n in names]


def test_the_offload_limit_line_says_free_colabs_ram_binds_and_what_more_ram_trains(cpu, monkeypatch):
    runs = _configured(cpu, lesson.FULL, lesson.UNPINNED)
    largest = lesson.largest_models(runs, 4, 512)
    line = lesson.offload_limit_line(runs, largest, 4, 512)
    assert f"up to {largest[lesson.UNPINNED] / 1e9:.2f}B on a T4, less than stage 0's " in line
    assert "free Colab's RAM binds, not the T4" in line
    more = float(line.rsplit("up to ", 1)[1].removesuffix("B."))
    assert more > 2 * largest[lesson.UNPINNED] / 1e9  # RAM was the limit: more RAM, a bigger model
    # where the estimator fills the GPU's share more than the RAM's, the line says the GPU binds
    full = memory.Estimate(parts={"gpu": {"all": int(0.9 * T4.gpu_cap_bytes)},
                                  "cpu": {"all": int(0.5 * T4.ram_budget_bytes)}})
    monkeypatch.setattr(lesson, "_t4_estimate", lambda *args: full)
    assert "the T4's memory binds, not the RAM" in lesson.offload_limit_line(runs, largest, 4, 512)


def test_the_offload_limit_line_says_when_offload_did_not_run(cpu):
    runs = _configured(cpu, lesson.FULL)
    assert "no configuration ran here" in lesson.offload_limit_line(runs, {lesson.FULL: 1}, 4, 512)


# ---- the checks, fed good and bad runs ----------------------------------------------------------


def _run(name, losses, eval_loss=4.0, status=runner.OK, trainable=0, n_params=1_000_000, step_s=1.0,
         eval_before=None):
    result = runner.RunResult(name, status, "" if status == runner.OK else "it broke",
                              losses=losses, eval_loss=eval_loss, n_params=n_params,
                              n_trainable=trainable or n_params, median_step_s=step_s,
                              peak_host_rss_bytes=2**30, eval_loss_before=eval_before)
    return lesson.MethodRun(lesson.method(name), result, {},
                            lora=dict(LORA) if lesson.method(name).lora else None)


def _good_runs():
    falling = [6.0, 5.5, 5.1, 4.8, 4.6, 4.5]
    return [_run(lesson.LORA_NAME, [6.0, 5.8, 5.6, 5.5, 5.4, 5.3], trainable=10_000),
            _run(lesson.FULL, falling, step_s=1.0),
            _run(lesson.UNPINNED, falling, step_s=3.0),
            _run(lesson.PINNED, [], status=runner.NOT_TRIED),
            _run(lesson.PARTIAL, falling, step_s=2.5),
            _run(lesson.ZENFLOW_NAME, [6.0, 5.6, 5.3, 5.0, 4.8, 4.7], step_s=1.8),
            _run(lesson.FP16_MASTER, [6.0, 5.52, 5.12, 4.83, 4.62, 4.52], step_s=3.1),
            # QLoRA's 4-bit base starts above the model as loaded (5.3 > 5.0): held to its own start
            _run(lesson.QLORA_NAME, [6.2, 6.0, 5.8, 5.7, 5.6, 5.5], eval_loss=5.1, trainable=10_000,
                 eval_before=5.3),
            _run(lesson.ADAM_8BIT, [6.0, 5.51, 5.12, 4.82, 4.61, 4.5])]


LARGEST = {lesson.LORA_NAME: 2_000_000_000, lesson.FULL: 500_000_000}
#: The model before training: pretrained (5.0, well below 0.6 x ln(50,257) = 6.5), and fresh.
START = lesson.Start(5.0, 50_257)
RANDOM_START = lesson.Start(10.9, 50_257)


def _failed(runs, cpu, start=START):
    from helpers import claims

    return claims.failed(lesson.checks(runs, cpu, start))


def test_a_good_set_of_runs_passes_every_check(cpu):
    assert _failed(_good_runs(), cpu) == []


def test_zenflow_that_scrambled_its_weights_fails(cpu):
    runs = _good_runs()
    runs[5] = _run(lesson.ZENFLOW_NAME, [6.1, 5.6, 5.3, 5.0, 4.8, 4.7])  # first loss moved
    assert any(lesson.ZENFLOW_NAME in s for s in _failed(runs, cpu))


def test_fp16_master_weights_are_refused_below_stage_1():
    # DeepSpeed 0.19.8's own rule (runtime/config.py): ZeRO 1-3 only (and, at initialize, with the
    # optimizer offloaded to DeepSpeed's CPU Adam): notebook 09 runs it with ZeRO-2 + CPU offload.
    from deepspeed.runtime.config import DeepSpeedConfig

    ds = {"train_batch_size": 4, "fp16": {"enabled": True, "fp16_master_weights_and_grads": True},
          "zero_optimization": {"stage": 0}}
    with pytest.raises(AssertionError, match="only supported with ZeRO Stage 1, 2, or 3"):
        DeepSpeedConfig(ds)
    ds["zero_optimization"]["stage"] = 2
    assert DeepSpeedConfig(ds).float16_config.fp16_master_weights_and_grads


@pytest.mark.parametrize("bad", ["lora trains everything", "no eval loss", "stage 0 broke",
                                 "not pretrained", "held-out loss rose", "held-out loss missing",
                                 "a training loss not finite",
                                 "offload parted", "fp16 masters parted early",
                                 "fp16 masters ended worse",
                                 "an error without a message", "pinned offload crashed",
                                 "qlora trained other adapters", "qlora rose from its own start",
                                 "8-bit adam parted"])
def test_each_bad_run_fails_a_check(bad, cpu):
    runs = _good_runs()
    if bad == "lora trains everything":
        runs[0] = _run(lesson.LORA_NAME, runs[0].result.losses)
    elif bad == "no eval loss":
        runs[2].result.eval_loss = float("nan")
    elif bad == "stage 0 broke":
        runs[1] = _run(lesson.FULL, [], status=runner.ERROR)
    elif bad == "not pretrained":  # a freshly initialised model: nothing for LoRA to adapt
        assert any("starts pretrained" in s for s in _failed(runs, cpu, RANDOM_START))
        return
    elif bad == "held-out loss rose":  # LoRA ended above the pretrained model's 5.0
        runs[0].result.eval_loss = 5.2
    elif bad == "held-out loss missing":
        runs[0].result.eval_loss = None
    elif bad == "a training loss not finite":
        runs[0].result.losses = [6.0, 5.8, float("inf"), 5.5, 5.4, 5.3]
    elif bad == "offload parted":
        runs[2].result.losses = [6.0, 5.5, 5.3, 4.8, 4.6, 4.5]
    elif bad == "fp16 masters parted early":
        runs[6].result.losses = [6.0, 6.2, 5.1, 4.8, 4.6, 4.5]
    elif bad == "fp16 masters ended worse":
        runs[6].result.eval_loss = 4.5
    elif bad == "qlora trained other adapters":
        runs[7].result.n_trainable = 20_000
    elif bad == "qlora rose from its own start":  # below the loaded model's 5.0 is not the test
        runs[7].result.eval_loss_before, runs[7].result.eval_loss = 4.8, 4.9
    elif bad == "8-bit adam parted":
        runs[8].result.losses = [6.0, 6.3, 5.1, 4.8, 4.6, 4.5]
    elif bad == "pinned offload crashed":  # an error with a message explains nothing here
        runs[3] = _run(lesson.PINNED, [], status=runner.ERROR)
        runs[3].result.message = "RuntimeError: something broke"
    else:
        runs[3] = _run(lesson.PINNED, [], status=runner.ERROR)
        runs[3].result.message = ""
    assert _failed(runs, cpu), bad


@pytest.fixture
def fp16(cpu):
    """The CPU's environment as a T4's would read: fp16 (notebook 05's 10% tolerance)."""
    import dataclasses

    return dataclasses.replace(cpu, precision="fp16")


def test_each_run_is_held_to_the_pretrained_models_held_out_loss(cpu):
    runs = [r for r in _good_runs() if r.method.name != lesson.ADAM_8BIT]  # held to stage 0's
    runs[1].result.eval_loss = 5.0  # stage 0 no better than before training: a failure
    failed = _failed(runs, cpu)
    assert failed == [f"{lesson.FULL}: the held-out loss fell below its loss before training "
                      "(5.0000 -> 5.0000)"], failed


def test_from_a_pretrained_start_noisy_training_losses_pass_and_from_a_random_one_they_fail(cpu):
    runs = _good_runs()
    runs[0].result.losses = [2.9, 3.1, 2.8, 3.0, 2.95, 3.05]  # batch noise around a level
    assert _failed(runs, cpu) == []
    failed = _failed(runs, cpu, RANDOM_START)
    assert any(lesson.LORA_NAME in s and "the loss falls" in s for s in failed), failed


def test_a_held_out_loss_that_rose_after_fp16_overflow_says_what_to_do(fp16):
    runs = _good_runs()
    runs[1].ds_config = {"fp16": {"enabled": True}}
    runs[1].result.eval_loss, runs[1].result.skipped_steps = 5.3, 5
    runs[1].result.steps_done = 6
    failed = [s for s in _failed(runs, fp16) if s.startswith(lesson.FULL + ":")]
    assert len(failed) == 1 and "barely trained" in failed[0] and "initial_scale_power" in failed[0]
    lines = lesson.takeaways(runs, LARGEST, fp16, START)
    assert any(l.startswith(f"{lesson.FULL}: fp16: 5 of 6") for l in lines), lines
    assert lesson.precision_of({"bf16": {"enabled": True}}) == "bf16"
    assert lesson.precision_of(None) == "fp32"


def test_the_summary_says_whether_the_model_started_pretrained_and_every_run_gained(cpu):
    runs = _good_runs()
    text = lesson.summary(runs, [("a", True)], [("b", True)], START)
    assert "the model starts pretrained: True" in text
    assert "ended below its held-out loss before training: True" in text
    runs[2].result.eval_loss = 5.1
    assert "before training: False" in lesson.summary(runs, [], [("b", True)], START)
    assert "pretrained: False" in lesson.summary(runs, [], [], RANDOM_START)
    lines = lesson.takeaways(_good_runs(), LARGEST, cpu, START)
    assert "from 5.000 (the pretrained model) to 4.000 (-1.000) with LoRA" in lines[0], lines
    # QLoRA's gain counted from its own 4-bit start (5.3 -> 5.1), LoRA's from the model as loaded
    assert any(l.startswith("QLoRA trained the same adapters") and "5.100 (-0.200 from its 4-bit "
               "base's 5.300)" in l and "4.000 (-1.000)" in l for l in lines), lines
    assert any(l.startswith("8-bit Adam: held-out loss 4.000 (-1.000)") for l in lines), lines


def test_in_fp16_plain_offload_follows_stage_0_within_notebook_05s_tolerance(fp16):
    runs = _good_runs()
    runs[2].result.losses = [6.0, 5.6, 5.2, 4.9, 4.7, 4.6]  # 2% apart at every step
    runs[4].result.losses = list(runs[2].result.losses)  # partial offload follows plain offload
    assert _failed(runs, fp16) == []
    runs[2].result.losses = [6.0, 5.6, 5.2, 4.9, 4.7, 4.0]  # parts at the end (11%)
    runs[4].result.losses = list(runs[2].result.losses)
    assert any(lesson.UNPINNED in s and lesson.FULL in s for s in _failed(runs, fp16))


def test_partial_and_pinned_offload_follow_plain_offload_every_step(fp16):
    runs = _good_runs()
    runs[4].result.losses = [6.0, 5.5, 5.1, 4.8, 4.6, 3.9]  # partial offload parts at the end
    assert any(lesson.PARTIAL in s for s in _failed(runs, fp16))


def test_zenflow_gone_nan_in_fp16_is_a_row_saying_so_and_still_checked_at_its_first_loss(fp16, cpu):
    nan = float("nan")
    ds16, ds32 = {"fp16": {"enabled": True}}, {}
    zen = lesson.method(lesson.ZENFLOW_NAME)
    went = _run(lesson.ZENFLOW_NAME, [6.0] + [nan] * 5).result
    went.skipped_steps = 5
    row = lesson.diverged_in_fp16(zen, went, ds16)
    assert row.status == lesson.DIVERGED_FP16 and "step 2" in row.message and "5 steps" in row.message
    runs = _good_runs()
    runs[5] = lesson.MethodRun(zen, row, ds16)
    assert _failed(runs, fp16) == []
    runs[5].result.losses = [6.3] + [nan] * 5  # and its weights moved at initialize
    assert any(lesson.ZENFLOW_NAME in s for s in _failed(runs, fp16))
    # in fp32, or for a method DeepSpeed never refuses, a non-finite loss stays a failed run
    assert lesson.diverged_in_fp16(zen, went, ds32) is went
    full = _run(lesson.FULL, [6.0] + [nan] * 5).result
    assert lesson.diverged_in_fp16(lesson.method(lesson.FULL), full, ds16) is full
    runs = _good_runs()
    runs[5] = lesson.MethodRun(zen, went, ds32)
    assert any(lesson.ZENFLOW_NAME in s for s in _failed(runs, cpu))


def test_a_refusal_of_zenflow_is_a_row_with_deepspeeds_words_not_a_failure(cpu):
    runs = _good_runs()
    runs[5] = _run(lesson.ZENFLOW_NAME, [], status=runner.ERROR)
    runs[5].result.message = "AssertionError: ZenFlow requires bf16 (DeepSpeed's words)"
    assert _failed(runs, cpu) == []
    runs[5].result.message = ""
    assert _failed(runs, cpu)


def test_the_benchmark_reports_the_fastest_offload_against_stage_0():
    ratio, line = lesson.offload_benchmark(_good_runs())
    assert ratio == pytest.approx(1.8) and "met" in line and "ZenFlow" in line
    assert lesson.offload_benchmark(_good_runs()[:2])[0] is None


def test_the_benchmark_says_where_offload_spends_its_extra_time():
    runs = _good_runs()
    runs[1].result.optimizer_step_s = [0.5, 0.2, 0.2, 0.2]  # stage 0: 1.0 s, 0.2 of it stepping
    runs[5].result.optimizer_step_s = [2.0, 1.4, 1.4, 1.4]  # ZenFlow: 1.8 s, 1.4 of it stepping
    line = lesson.offload_benchmark(runs)[1]
    assert "of the 0.80 s it adds, 1.20 s are the optimizer step" in line
    assert "-0.40 s the forward and backward" in line and "would still make 2.20x" in line
    runs[5].result.optimizer_step_s = [0.0, 0.0, 0.0, 0.1]  # overlapped: no floor from the step
    line = lesson.offload_benchmark(runs)[1]
    assert "no slower than stage 0's (0.20 s)" in line and "take 1.00 s longer" in line
    assert "would still make" not in line
    runs[1].result.optimizer_step_s = []  # a run that did not time its step: no breakdown
    assert "optimizer step" not in lesson.offload_benchmark(runs)[1]


def test_the_benchmark_says_what_the_machine_did_not_emulate(cpu):
    import dataclasses

    on_cpu = lesson.offload_benchmark(_good_runs(), cpu)[1]
    # a T4's goal is neither met nor missed by CPU runs: the T4-emulation record stands beside
    assert "no GPU" in on_cpu and "not judged from CPU runs" in on_cpu and "met here" not in on_cpu
    assert lesson.RECORDED_T4_OFFLOAD_RATIO in on_cpu
    gpu = dataclasses.replace(cpu, gpu_name="NVIDIA H200", emulation=T4)
    many, two = (dataclasses.replace(gpu, cpu_cores=n) for n in (16, 2))
    assert "CPU cores: 16, not emulated: a Colab T4 has 2" in lesson.offload_benchmark(
        _good_runs(), many)[1]
    assert "cores" not in lesson.offload_benchmark(_good_runs(), two)[1]  # Colab's own 2
    assert ": met here" in lesson.offload_benchmark(_good_runs(), two)[1]  # 1.8x, judged on a GPU
    assert "not emulated" in dict((w, n) for w, _, n in many.rows())["CPU cores"]


def test_the_decision_table_has_one_row_per_method_and_says_when_to_pick_it(cpu):
    table = lesson.decision_table(_good_runs(), LARGEST, cpu, START)
    text = str(table)
    assert len(table.rows) == len(lesson.METHODS)
    assert "2.00B" in text and "pick it when" in text and "not tried" in text
    assert "before: 5.000" in text and "4.000 (-1.000)" in text
    assert "4.000 (-1.000)" in str(lesson.runs_table(_good_runs(), cpu, START))


# ---- the saved adapter ------------------------------------------------------------------------


def _save(folder, tensors):
    from safetensors.torch import save_file

    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_an_adapter_with_an_empty_tensor_fails_its_check(tmp_path):
    import torch

    from helpers import claims

    good = _save(tmp_path / "good", {"a.lora_A.weight": torch.ones(8, 64),
                                     "a.lora_B.weight": torch.zeros(64, 8)})
    empty = _save(tmp_path / "empty", {"a.lora_A.weight": torch.ones(0),
                                       "a.lora_B.weight": torch.zeros(64, 8)})
    assert claims.failed(lesson.adapter_claims(good)) == []
    assert claims.failed(lesson.adapter_claims(empty))
    with pytest.raises(FileNotFoundError, match="save with trainer.save_model"):
        lesson.adapter_tensors(tmp_path)


# ---- a measured LoRA run --------------------------------------------------------------------


def test_a_lora_run_trains_the_adapters_only_and_scores_held_out_text(cpu, tmp_path):
    from helpers import data, models

    folder = models.save_offline_model(tmp_path / "model", "tiny")
    text = data.write_offline_text(tmp_path / "train.txt", 60_000)
    four = {**LORA, "r": 4, "lora_alpha": 8}  # the lesson's settings, whatever they say, are run
    runs = lesson.run_methods(str(folder), str(text), cpu, 2, 32, 4, 2, 1e-3, 1e-2, lora=four,
                              names=[lesson.LORA_NAME], progress=False)
    result = runs[0].result
    assert result.status == runner.OK, result.message
    info = memory.ModelInfo.from_pretrained(str(folder))
    assert runs[0].lora == four and runs[0].lora_rank == 4
    assert result.n_trainable == memory.lora_params(info, 4) < memory.lora_params(info, 8)
    assert result.n_params == info.n_params + result.n_trainable
    assert result.eval_loss is not None and 0 < result.eval_loss < 20
    # the adapters trained through the checkpointed layers (added before checkpointing, as the
    # lesson does): the held-out loss moved from the untrained model's (a run whose adapters got
    # no gradient would leave B at 0 and the loss where it was)
    start = lesson.held_out_before(str(folder), str(text), 32, 2, 2)
    assert abs(result.eval_loss - start.eval_loss) > 1e-4, (result.eval_loss, start.eval_loss)


def test_the_loss_before_training_is_scored_on_the_blocks_every_run_scores(cpu, tmp_path):
    """A LoRA run at learning rate 0 changes nothing (B stays 0): its held-out loss after training
    is the model's before, so held_out_before must read the runner's very blocks."""
    from helpers import data, models

    folder = models.save_offline_model(tmp_path / "model", "tiny")
    text = data.write_offline_text(tmp_path / "train.txt", 60_000)
    start = lesson.held_out_before(str(folder), str(text), 32, 2, 2)
    assert start.vocab == memory.ModelInfo.from_pretrained(str(folder)).vocab
    assert not start.pretrained  # freshly initialised: about ln(vocab)
    runs = lesson.run_methods(str(folder), str(text), cpu, 2, 32, 3, 2, 0.0, 0.0, lora=LORA,
                              names=[lesson.LORA_NAME], progress=False)
    assert runs[0].result.status == runner.OK, runs[0].result.message
    assert runs[0].result.eval_loss == pytest.approx(start.eval_loss, abs=1e-5)
    other = lesson.held_out_before(str(folder), str(text), 32, 2, 2, seed=1)
    assert other.eval_loss != pytest.approx(start.eval_loss, abs=1e-5)  # other blocks differ


# ---- LoRA under ZeRO-3 through the Trainer, saved and reloaded ----------------------------------

# One fresh process, smoke sizes on the CPU: LoRA under ZeRO-3 through the Trainer (the notebook's
# config), saved with trainer.save_model and, as the trap, with the partitioned model's own
# save_pretrained; the first reloaded with PeftModel.from_pretrained and compared in logits.
ZERO3_LORA = r"""
import json, os, sys, torch
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(__import__("helpers.env").env.free_port()),
                  RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments, default_data_collator
from helpers import data, deepspeed_fixes, models
from helpers.lessons import zero2_training, zero_or_lora
for _, fix in deepspeed_fixes.FIXES:  # every fix
    fix()
out = sys.argv[1]
folder = str(models.save_offline_model(os.path.join(out, "model"), "tiny"))
tok = models.offline_tokenizer()
blocks = data.chunk(tok.encode(data.offline_corpus(30_000)), 32)
dataset = [{"input_ids": b, "labels": b} for b in blocks]
torch.manual_seed(0)
model = get_peft_model(AutoModelForCausalLM.from_pretrained(folder),
                       LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16,
                                  lora_dropout=0.0, target_modules="all-linear"))
ds = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
      "gradient_accumulation_steps": "auto", "steps_per_print": 10**9,
      "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                            "stage3_gather_16bit_weights_on_model_save": True}}
args = TrainingArguments(output_dir=out, deepspeed=ds, per_device_train_batch_size=2, max_steps=3,
                         learning_rate=1e-2, report_to="none", save_strategy="no", use_cpu=True)
trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=default_data_collator)
trainer.train()
saved, careless = os.path.join(out, "adapter"), os.path.join(out, "careless")
trainer.save_model(saved)
trainer.model.save_pretrained(careless)
from transformers.integrations import unset_hf_deepspeed_config
unset_hf_deepspeed_config()  # else from_pretrained loads partitioned, for another ZeRO-3 run
reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder), saved)
probe = torch.tensor([blocks[0]])
diff = zero2_training.logit_difference(trainer.model, reloaded, probe)
untrained = zero2_training.logit_difference(trainer.model, AutoModelForCausalLM.from_pretrained(folder),
                                            probe)
print("RESULT", json.dumps({"diff": diff, "untrained": untrained, "saved": zero_or_lora.adapter_claims(saved),
                            "careless": zero_or_lora.adapter_claims(careless)}))
"""


@pytest.fixture(scope="module")
def zero3_lora(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero3_lora")
    done = subprocess.run([sys.executable, "-c", ZERO3_LORA, str(out)], capture_output=True,
                          text=True, timeout=900, cwd=str(env.REPO_ROOT),
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def test_lora_under_zero3_saves_a_non_empty_adapter_that_reloads_with_the_same_logits(zero3_lora):
    assert all(held for _, held in zero3_lora["saved"]), zero3_lora["saved"]
    assert zero3_lora["diff"] <= 1e-3
    assert zero3_lora["untrained"] > 100 * max(zero3_lora["diff"], 1e-6)  # the adapter did train


def test_the_careless_save_of_a_partitioned_model_is_empty_and_fails_the_check(zero3_lora):
    # The trap the check is for: save_pretrained on the ZeRO-3 model writes shape-(0,) tensors.
    # When PEFT or DeepSpeed gather there themselves this fails: then say so in notebook 09.
    assert not all(held for _, held in zero3_lora["careless"]), zero3_lora["careless"]


def test_adapters_that_never_trained_change_no_logit_and_trained_ones_do(tmp_path):
    """The notebook's "it trained" claim: a reload of untrained adapters gives the trained model's
    logits too (LoRA's B starts at 0), so the reload check alone cannot fail on them."""
    from helpers import claims

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = get_peft_model(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)),
                           LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
    probe = torch.randint(0, 64, (1, 8))
    assert lesson.adapter_effect(model, probe) == 0.0
    model.save_pretrained(tmp_path / "untrained")
    failed = claims.failed(lesson.reload_claims(tmp_path / "untrained", model, model, probe, "fp32"))
    assert failed and all("it trained" in c for c in failed), failed  # only that claim can tell
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.1)
    assert lesson.adapter_effect(model, probe) > 1e-3
    model.save_pretrained(tmp_path / "trained")
    assert claims.failed(lesson.reload_claims(tmp_path / "trained", model, model, probe, "fp32")) == []


def test_fp16_master_weights_gone_nan_in_fp16_fail_their_check(fp16):
    """Only ZenFlow's non-finite fp16 loss is a row saying so: fp16 master weights run only in
    fp16, and going NaN there is what their check is for."""
    nan = float("nan")
    master = lesson.method(lesson.FP16_MASTER)
    went = _run(lesson.FP16_MASTER, [6.0] + [nan] * 5).result
    assert lesson.diverged_in_fp16(master, went, {"fp16": {"enabled": True}}) is went
    runs = _good_runs()
    runs[6] = lesson.MethodRun(master, went, {"fp16": {"enabled": True}})
    assert any(lesson.FP16_MASTER in s for s in _failed(runs, fp16))


def test_notebook_09s_one_silenced_warning_is_the_one_peft_triggers():
    """The lesson silences one FutureWarning by its words: transformers must still say them when
    PEFT reads model.is_gradient_checkpointing (if it stops, drop the filter)."""
    import re
    import warnings

    import lesson_code
    from helpers import models

    cell = next(s for s in lesson_code.lesson_sources("09_zero_or_lora") if "get_peft_model" in s)
    pattern = re.search(r'filterwarnings\("ignore", message="([^"]+)"', cell).group(1)
    model = models.build_model(models.gpt2_config("tiny", vocab_size=256))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert model.is_gradient_checkpointing is False
    assert [w for w in seen if w.category is FutureWarning and re.match(pattern, str(w.message))]


def test_the_measured_lora_row_runs_the_lesson_cells_settings():
    """One definition of LoRA's settings: the lesson cell builds its LoraConfig from LORA_SETTINGS
    and the notebook hands that same dict to the measured runs (an edit to it changes both)."""
    import ast
    import json as json_module
    from pathlib import Path

    import lesson_code

    cell = next(s for s in lesson_code.lesson_sources("09_zero_or_lora") if "get_peft_model" in s)
    assert "LORA_SETTINGS = {" in cell
    assert 'LoraConfig(task_type="CAUSAL_LM", **LORA_SETTINGS)' in cell
    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "09_zero_or_lora.ipynb"
    calls = [node for c in json_module.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"
             for node in ast.walk(ast.parse("".join(c["source"])))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run_methods"]
    assert len(calls) == 1
    given = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    assert given.get("lora") == "LORA_SETTINGS", given
    assert given.get("trainer_args") == "training_args()", given  # the lesson's Trainer arguments


# ---- the rows run the lesson Trainer's schedule, precision and clipping --------------------------


def _lesson_training_args(tmp_path, **values):
    """Notebook 09's own training_args(), defined as its lesson cell defines it."""
    import torch
    from lesson_code import lesson_functions

    names = dict(torch=torch, OUT_DIR=str(tmp_path), MICRO_BATCH=2, STEPS=20, LORA_LR=1e-3, PRECISION="fp16",
                 GRAD_CKPT=True, LORA_RANK=8, PROMPT="?", ANSWER_TOKENS=1, MODEL_NAME="-")
    names.update(values)
    space = lesson_functions("09_zero_or_lora", ["training_args"], **names)
    return space["training_args"]()


def test_the_trainers_schedule_precision_and_clipping_reach_every_rows_config(cpu, tmp_path):
    """What the lesson's TrainingArguments say (constant_with_warmup over STEPS // 10, fp16,
    clipping 1.0) is what each row runs: its "scheduler" gone in favour of transformers'
    get_scheduler with the Trainer's warm-up, its precision the Trainer's whatever the machine's."""
    args = _lesson_training_args(tmp_path)
    settings = lesson.trainer_settings(args, 20)
    assert settings == {"lr_schedule": {"name": "constant_with_warmup", "num_warmup_steps": 2,
                                        "num_training_steps": 20},
                        "precision": "fp16", "gradient_clipping": 1.0}
    info = memory.ModelInfo.for_shape("tiny")
    for m in lesson.METHODS:
        ds = lesson.method_config(m, info, cpu, 4, 20, 1e-4, settings)
        assert "scheduler" not in ds and ds["fp16"]["enabled"] and not ds["bf16"]["enabled"], m.name
        assert ds["gradient_clipping"] == 1.0 and ds["optimizer"]["params"]["lr"] == 1e-4, m.name
    other = lesson.trainer_settings(_lesson_training_args(tmp_path, PRECISION="bf16", STEPS=40), 40)
    assert other["precision"] == "bf16" and other["lr_schedule"]["num_warmup_steps"] == 4


def test_a_run_given_the_trainers_schedule_steps_its_learning_rate_by_it(monkeypatch, tmp_path):
    """The runner hands get_scheduler's schedule to deepspeed.initialize: with 2 warm-up steps of
    4, constant_with_warmup's rates are 0, 0.5, 1, 1 x lr (DeepSpeed's WarmupLR of the config
    would give others), read from the engine at every step."""
    import deepspeed

    from helpers import config

    seen = []
    original = deepspeed.initialize

    def spy(*a, **k):
        engine, *rest = original(*a, **k)
        step = engine.step

        def recorded(*sa, **sk):
            seen.append(engine.get_lr()[0])
            return step(*sa, **sk)

        engine.step = recorded
        return (engine, *rest)

    monkeypatch.setattr(deepspeed, "initialize", spy)
    ds = config.build(stage=0, trainer=False, precision="fp32", pin_memory=False, micro_batch=2, lr=1e-2)
    assert "scheduler" in ds
    spec = runner.RunSpec(ds_config=ds, shape="tiny", steps=4, lr_schedule={
        "name": "constant_with_warmup", "num_warmup_steps": 2, "num_training_steps": 4})
    result = {}
    runner.train_steps(spec, result)
    assert seen == pytest.approx([0.0, 5e-3, 1e-2, 1e-2]), seen


# ---- QLoRA and the 8-bit optimizer --------------------------------------------------------------


def test_a_qlora_row_needs_the_lessons_quantization_and_bitsandbytes(cpu, monkeypatch):
    with pytest.raises(ValueError, match="quantize="):
        lesson.run_methods("-", "-", cpu, 4, 64, 2, 1, 1e-4, 1e-3, lora=dict(LORA),
                           names=[lesson.QLORA_NAME])
    real = lesson.importlib.util.find_spec
    monkeypatch.setattr(lesson.importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    info = memory.ModelInfo.for_shape("tiny")
    for name in (lesson.QLORA_NAME, lesson.ADAM_8BIT):
        why = lesson._not_run(lesson.method(name), cpu, {}, info, 4, 64)
        assert "pip install bitsandbytes" in why, name
    assert lesson._not_run(lesson.method(lesson.LORA_NAME), cpu, {}, info, 4, 64) == ""


def test_the_lesson_hands_its_quantization_and_8bit_optim_to_the_measured_rows():
    """One definition: QLORA_QUANT builds the lesson's BitsAndBytesConfig and reaches run_methods;
    the lesson's optim name for the 8-bit optimizer is the one the measured row runs."""
    import ast
    import json as json_module
    from pathlib import Path

    import lesson_code

    cell = next(s for s in lesson_code.lesson_sources("09_zero_or_lora") if "QLORA_QUANT = {" in s)
    assert "BitsAndBytesConfig(**QLORA_QUANT)" in cell
    assert "get_peft_model(base, lora_config)" in cell
    assert f'training_args(optim="{lesson.method(lesson.ADAM_8BIT).optimizer}")' in cell
    notebook = Path(__file__).resolve().parent.parent / "notebooks" / "09_zero_or_lora.ipynb"
    cells = json_module.loads(notebook.read_text())["cells"]
    calls = [node for c in cells if c["cell_type"] == "code"
             for node in ast.walk(ast.parse("".join(c["source"])))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run_methods"]
    assert {k.arg: ast.unparse(k.value) for k in calls[0].keywords}.get("quantize") == "QLORA_QUANT"


def test_the_8bit_optimizer_is_the_one_the_trainer_builds_with_the_configs_settings():
    import bitsandbytes as bnb
    import torch

    weight = torch.nn.Parameter(torch.zeros(8, 8))
    section = {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.9], "eps": 1e-6,
                                           "weight_decay": 0.05}}
    opt = runner.client_optimizer("adamw_bnb_8bit", [weight], section)
    assert isinstance(opt, bnb.optim.AdamW) and opt.args.optim_bits == 8  # Adam's moments in 8 bits
    group = opt.param_groups[0]
    assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]) == \
        (3e-4, (0.8, 0.9), 1e-6, 0.05)
    assert runner.quantized(None) == {}


def test_a_4bit_parameter_counts_the_weights_it_stands_for():
    import types

    import torch

    packed = torch.nn.Parameter(torch.zeros(32, 1, dtype=torch.uint8), requires_grad=False)
    assert runner.numel(packed) == 32
    packed.quant_state = types.SimpleNamespace(shape=torch.Size([8, 8]))
    assert runner.numel(packed) == 64


def test_qlora_and_8bit_adam_shrink_what_the_estimator_says_they_shrink(cpu):
    info = memory.ModelInfo.for_shape("smollm2-135m-shaped")
    # the blocks' linear weights: the model less its embedding and norms
    assert memory.linear_params(info) == 106_168_320
    ds = config.for_row({"stage": 0}, info, cpu, 4)
    ds["fp16"] = {"enabled": True}
    plain = memory.model_states(info, ds)["gpu"]
    quant = memory.model_states(info, ds, trainable=1_000, quantized=True)["gpu"]
    linear = memory.linear_params(info)
    assert quant["params"] == int((info.n_params - linear) * 2 + linear * memory.NF4_BYTES)
    assert plain["params"] == info.n_params * 2
    adam8 = memory.model_states(info, ds, adam_8bit=True)["gpu"]
    assert plain["optimizer"] - adam8["optimizer"] == info.n_params * (8 - memory.ADAM_8BIT_BYTES)
    # a quantized base is loaded straight to the GPU: no fp32 build in host RAM
    est = memory.estimate(info, ds, trainable=1_000, quantized=True)
    assert "model build" not in est.parts["cpu"]
    assert "model build" in memory.estimate(info, ds, trainable=1_000).parts["cpu"]


def test_qlora_is_held_to_a_4bit_start_near_the_model_as_loaded_and_its_peak_to_the_estimate(cpu):
    from helpers import claims

    runs = _good_runs()
    runs[7].result.eval_loss_before = 9.0  # a quantization that broke the model
    assert any("4-bit base scored" in s for s in _failed(runs, cpu)), _failed(runs, cpu)
    runs[7].result.eval_loss_before = None  # its start not measured: not held either
    assert any("4-bit base scored" in s for s in _failed(runs, cpu))
    # on a GPU the estimator answers for QLoRA's and 8-bit Adam's peaks as for LoRA's and stage 0's
    assert {lesson.QLORA_NAME, lesson.ADAM_8BIT} <= set(lesson.PREDICTED)
    gpu = __import__("dataclasses").replace(cpu, gpu_name="Tesla T4", gpu_count=1)
    runs = _good_runs()
    for r in runs:
        r.result.peak_gpu_allocated_bytes = 2 * 2**30 if r.method.name != lesson.QLORA_NAME else 2**30
        r.estimate = memory.Estimate()
        r.estimate.add("gpu", "params", r.result.peak_gpu_allocated_bytes)
    runs[0].result.peak_gpu_allocated_bytes = 1.5 * 2**30  # LoRA below stage 0, above QLoRA
    runs[0].estimate = memory.Estimate()
    runs[0].estimate.add("gpu", "params", int(1.5 * 2**30))
    runs[8].result.peak_gpu_allocated_bytes = 1.8 * 2**30  # 8-bit Adam below stage 0
    assert claims.failed(lesson.checks(runs, gpu, START)) == []
    runs[8].estimate = memory.Estimate()
    runs[8].estimate.add("gpu", "params", 2**30)  # predicted 1.0 against 1.8 measured
    assert any(s.startswith(lesson.ADAM_8BIT) and "predicted" in s
               for s in claims.failed(lesson.checks(runs, gpu, START)))
