"""helpers.lessons.biggest_model: the derived NVMe config, the disk refusal, the ladder's bookkeeping."""

import dataclasses
import json
import types

import pytest

from helpers import config, env, memory, runner
from helpers.lessons import biggest_model

XL = memory.ModelInfo.for_shape("gpt2-1.5b")


def test_nvme_config_fits_the_largest_parameter_and_a_small_ram(tmp_path):
    t4 = __import__("helpers.config", fromlist=["x"]).t4_profile(env.describe())
    c = config.zero_infinity(XL, t4, 4, tmp_path)
    zero = c["zero_optimization"]
    assert zero["offload_param"]["buffer_size"] >= XL.largest_param_numel
    assert zero["stage3_max_reuse_distance"] == 0 and zero["offload_param"]["pin_memory"] is False
    assert zero["offload_optimizer"]["nvme_path"] == str(tmp_path) and zero["sub_group_size"] <= 100_000_000


def test_not_enough_disk_is_refused_before_training_with_the_bytes(monkeypatch, tmp_path):
    monkeypatch.setattr(env, "disk_free_bytes", lambda path: 10 * 10**9)
    with pytest.raises(env.KitSetupError, match=r"needs about 35\.4 GB at .* only 10\.0 GB are free"):
        biggest_model.check_disk(XL, tmp_path)
    assert "are free there" in biggest_model.refusal_message(tmp_path)


def test_disk_bandwidth_is_positive_and_leaves_nothing(tmp_path):
    write, read = biggest_model.disk_bandwidth(tmp_path, megabytes=8)
    assert write > 0 and read > 0 and list(tmp_path.iterdir()) == []


def test_ladder_stops_a_method_after_its_first_failure(monkeypatch, tmp_path):
    def fake(spec):
        oom = spec.shape == "mini" and spec.ds_config["zero_optimization"]["stage"] == 0
        return runner.RunResult(spec.label, runner.OOM if oom else runner.OK, "OOM" if oom else "", losses=[10.8, 10.0],
                               steps_done=2, median_step_s=1.0)

    monkeypatch.setattr(runner, "measure", fake)
    rungs = biggest_model.run_ladder(["tiny", "mini", "gpt2-124m"], env.describe(), 2, 64, 2, tmp_path, True, None, progress=False)
    status = {(r.shape, r.method): r.result.status for r in rungs}
    assert status[("mini", "stage 0 (no ZeRO)")] == runner.OOM and status[("gpt2-124m", "stage 0 (no ZeRO)")] == "not tried"
    assert status[("gpt2-124m", "ZeRO-3 + NVMe")] == runner.OK
    best = biggest_model.largest_per_method(rungs)
    assert best["stage 0 (no ZeRO)"].shape == "tiny" and best["ZeRO-3 + NVMe"].shape == "gpt2-124m"
    assert "not tried" in str(biggest_model.ladder_table(rungs))


def test_starting_loss_rule():
    assert biggest_model.starting_loss_ok(runner.RunResult("x", runner.OK, losses=[11.0]), 50257)
    assert not biggest_model.starting_loss_ok(runner.RunResult("x", runner.OK, losses=[120.0]), 50257)


def _fake_measure(oom_shapes_stage0=("mini",), wall_s=10.0):
    def fake(spec):
        oom = spec.shape in oom_shapes_stage0 and spec.ds_config["zero_optimization"]["stage"] == 0
        return runner.RunResult(spec.label, runner.OOM if oom else runner.OK, "OOM" if oom else "", losses=[10.8, 10.0],
                               steps_done=2, median_step_s=1.0, wall_s=wall_s,
                               peak_gpu_allocated_bytes=2**30)
    return fake


def test_ladder_tries_stage_0_at_the_headline_size_after_a_smaller_failure(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "measure", _fake_measure(("mini", "gpt2-124m")))
    rungs = biggest_model.run_ladder(["tiny", "mini", "gpt2-124m"], env.describe(), 2, 64, 2, tmp_path, True, None,
                                headline="gpt2-124m", progress=False)
    status = {(r.shape, r.method): r.result.status for r in rungs}
    assert status[("gpt2-124m", "stage 0 (no ZeRO)")] == runner.OOM
    gpu = dataclasses.replace(env.describe(), gpu_name="T4", gpu_count=1, capability=(7, 5), precision="fp16")
    claims = dict(biggest_model.checks(rungs, gpu, "gpt2-124m", nvme_ready=True))
    assert claims["gpt2-124m under stage 0 runs out of GPU memory"]


def test_ladder_stops_a_method_whose_next_rung_would_pass_the_time_budget(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "measure", _fake_measure((), wall_s=50.0))
    rungs = biggest_model.run_ladder(["tiny", "gpt2-124m"], env.describe(), 2, 64, 2, tmp_path, True, None,
                                budget_minutes=5, progress=False)
    big = [r for r in rungs if r.shape == "gpt2-124m"]
    assert [r.result.status for r in big] == ["not tried"] * len(biggest_model.METHODS)
    assert all("past the ladder's budget of 5 min" in r.result.message for r in big
               if r.method != biggest_model.NVME_FROZEN)
    table = str(biggest_model.largest_table(rungs))
    assert "tiny" in table and "gpt2-124m" not in table


def test_the_budget_stops_only_the_climb_past_the_headline(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "measure", _fake_measure((), wall_s=50.0))
    rungs = biggest_model.run_ladder(["tiny", "mini", "gpt2-124m"], env.describe(), 2, 64, 2, tmp_path, True, None,
                                headline="mini", budget_minutes=0, progress=False)
    status = {(r.shape, r.method): r.result.status for r in rungs}
    whole = [m for m, _ in biggest_model.METHODS if m != biggest_model.NVME_FROZEN]
    assert all(status[("mini", m)] == runner.OK for m in whole)
    assert all(status[("gpt2-124m", m)] == "not tried" for m, _ in biggest_model.METHODS)


def test_the_ladder_scales_the_learning_rate_with_size_and_warms_up_over_the_run(monkeypatch, tmp_path):
    seen = {}

    def fake(spec, log_path=None):
        seen[spec.label] = spec.ds_config["scheduler"]["params"]
        return runner.RunResult(spec.label, runner.OK, losses=[10.8, 10.0, 9.5], steps_done=3, median_step_s=1.0)

    monkeypatch.setattr(runner, "measure", fake)
    biggest_model.run_ladder(["tiny", "gpt2-355m"], env.describe(), 2, 64, 3, tmp_path, True, None, progress=False)
    tiny, medium = seen["tiny ZeRO-3 + NVMe"], seen["gpt2-355m ZeRO-3 + NVMe"]
    assert tiny["warmup_max_lr"] == 1e-3 and medium["warmup_max_lr"] == pytest.approx(3e-4 * (768 / 1024) ** 2)
    assert tiny["warmup_num_steps"] == 3 and seen["tiny stage 0 (no ZeRO)"]["warmup_max_lr"] == 1e-3
    rates = [config.learning_rate_for(n) for n in (1e6, 2e8, 5e8, 1e9, 2e9, 3e9)]
    assert rates == sorted(rates, reverse=True) and len(set(rates)) == 6


def test_the_ladders_configs_are_sized_to_the_ram_each_run_has(monkeypatch, tmp_path):
    """After the fine-tune the kernel holds more, so a run has less than the budget measured at the
    top: pinned buffers chosen from the larger figure would be killed. With plenty of RAM at the top
    and little left for the runs, the NVMe configs do not pin."""
    import dataclasses

    pins = {}

    def fake(spec, log_path=None):
        offload = spec.ds_config["zero_optimization"].get("offload_optimizer") or {}
        pins[spec.label] = offload.get("pin_memory")
        return runner.RunResult(spec.label, runner.OK, losses=[10.8, 10.0, 9.5], steps_done=3,
                                median_step_s=1.0)

    monkeypatch.setattr(runner, "measure", fake)
    roomy = dataclasses.replace(env.describe(), ram_budget_bytes=4 * config.PIN_MEMORY_MIN_RAM)
    biggest_model.run_ladder(["tiny"], roomy, 2, 64, 3, tmp_path, True, None, progress=False)
    assert pins["tiny ZeRO-3 + NVMe"] is True  # no kill limit: the top's figure
    tight = config.PIN_MEMORY_MIN_RAM // 2
    biggest_model.run_ladder(["tiny"], roomy, 2, 64, 3, tmp_path, True, tight, progress=False)
    assert pins["tiny ZeRO-3 + NVMe"] is False


def test_the_nvme_table_puts_each_step_against_the_disk_and_host_ram_by_phase():
    phases = [{"name": n, "start_bytes": 2**30, "peak_bytes": (i + 1) * 2**30, "entries": 1}
              for i, (n, _) in enumerate(biggest_model.RSS_PHASES)]
    ran = runner.RunResult("x", runner.OK, median_step_s=10.0, peak_host_rss_bytes=5 * 2**30, rss_phases=phases)
    spec = runner.RunSpec(ds_config={"train_micro_batch_size_per_gpu": 4, "fp16": {"enabled": True},
                                     "zero_optimization": {"stage": 3, "sub_group_size": 10**6,
                                                           "offload_param": {"device": "nvme"}}},
                          shape="gpt2-124m")
    rungs = [biggest_model.Rung("gpt2-124m", "ZeRO-3 + NVMe", ran, 124_000_000, spec=spec),
             biggest_model.Rung("gpt2-124m", "stage 0 (no ZeRO)", ran, 124_000_000),
             biggest_model.Rung("gpt2-355m", "ZeRO-3 + NVMe", runner.RunResult("y", runner.KILLED_RAM, "RAM"), 1)]
    bound = biggest_model.predicted_nvme_step_s(memory.ModelInfo.for_shape("gpt2-124m"), 1000.0, 2000.0)
    table = biggest_model.nvme_table(rungs, 1000.0, 2000.0)
    assert len(table.rows) == 1  # NVMe rungs that ran only
    row = dict(zip(table.header, table.rows[0]))
    assert row["vs bound"] == f"{10.0 / bound:.1f}x"
    assert ([row[f"RSS {label}"] for _, label in biggest_model.RSS_PHASES]
            == ["1.00", "2.00", "3.00", "4.00", "5.00", "6.00"])
    assert row["reload logit diff"] == "-"  # this rung did not save
    lines = biggest_model.takeaways(rungs, env.describe())
    assert not any(line.startswith("Saved at") for line in lines)
    ran.reload_logit_diff, ran.saved_bytes, ran.save_s = 0.012, 248_000_000, 3.0
    row = dict(zip(table.header, biggest_model.nvme_table(rungs, 1000.0, 2000.0).rows[0]))
    assert row["reload logit diff"] == "1.2e-02"
    lines = biggest_model.takeaways(rungs, env.describe())
    assert ("Saved at gpt2-124m: 0.25 GB of fp16 shards in 3 s, host RAM 5.0 GiB while saving; "
            "from_pretrained's reload gives its logits within 1.2e-02.") in lines
    # GPT-2's embedding (50257 x 768) is its largest sub-group: DeepSpeed never splits a parameter
    assert any("optimizer step +1.00 GiB over forward and backward (27.8 bytes per element of its "
               "largest optimizer sub-group, 38.6M)" in l for l in lines), lines


def _nvme_rung(shape: str, rise: int) -> biggest_model.Rung:
    info = memory.ModelInfo.for_shape(shape)
    ds = config.zero_infinity(info, config.t4_profile(env.describe()), 4, "/tmp/x")
    phases = [{"name": "forward and backward", "start_bytes": 0, "peak_bytes": 6 * 2**30, "entries": 5},
              {"name": "optimizer step", "start_bytes": 0, "peak_bytes": 6 * 2**30 + rise, "entries": 5}]
    result = runner.RunResult("x", runner.OK, rss_phases=phases)
    spec = runner.RunSpec(ds_config=ds, shape=shape)
    return biggest_model.Rung(shape, biggest_model.NVME, result, info.n_params, spec=spec)


@pytest.mark.parametrize("shape, measured", [("qwen2.5-0.5b-shaped", 1_089_000_000),
                                             ("tinyllama-1.1b-shaped", 524_000_000)])
def test_the_step_rise_check_holds_run_20s_rungs_and_fails_the_whole_buffer_overflow_check(
        shape, measured):
    """Run 20 (T4 emulation): the step rose 8 bytes per element of the largest sub-group, the
    embedding. DeepSpeed's whole-buffer overflow check (3 bytes per parameter more) must fail."""
    assert biggest_model.step_rise_ok(_nvme_rung(shape, measured))
    whole = measured + 3 * memory.ModelInfo.for_shape(shape).n_params
    assert not biggest_model.step_rise_ok(_nvme_rung(shape, whole))
    assert not biggest_model.step_rise_ok(_nvme_rung(shape, int(1.3 * measured)))  # past the margin


# ---- modern shapes, the weights-on-GPU method, and the estimator held to the ladder (issue 26) ----


def test_the_optimizer_only_method_keeps_the_weights_on_the_gpu_and_prefetches(tmp_path):
    t4 = config.t4_profile(env.describe())
    both = config.zero_infinity(XL, t4, 4, tmp_path)["zero_optimization"]
    only = config.zero_infinity(XL, t4, 4, tmp_path, offload_param="none")["zero_optimization"]
    assert both["offload_param"]["device"] == "nvme" and only["offload_param"] == {"device": "none"}
    assert only["offload_optimizer"]["device"] == "nvme"
    # NVMe prefetch took every free swap buffer ("Not enough buffers 0 for swapping 1", run 18)
    assert both["stage3_prefetch_bucket_size"] == 0 and only["stage3_prefetch_bucket_size"] > 0
    # a step moves the optimizer's states either way; the weights' reads only when they are on NVMe
    gib_s = 1024.0
    on_gpu = biggest_model.predicted_nvme_step_s(XL, gib_s, gib_s, weights_on_nvme=False)
    assert on_gpu == pytest.approx(24 * XL.n_params / 1e6 / gib_s)
    assert biggest_model.predicted_nvme_step_s(XL, gib_s, gib_s) > on_gpu
    assert (biggest_model.nvme_bytes_needed(XL, weights_on_nvme=False)
            < biggest_model.nvme_bytes_needed(XL))


def _ran(shape, method, gpu, host, status=runner.OK, limit=None):
    info = memory.ModelInfo.for_shape(shape)
    t4 = config.t4_profile(env.describe())
    choice = dict(biggest_model.METHODS)[method]
    ds = (config.zero_infinity(info, t4, 4, "/tmp/x", 5, offload_param=choice.get("offload_param", "none"))
          if biggest_model.is_nvme(method) else
          config.build(**choice, micro_batch=4, trainer=False, environment=t4, pin_memory=False))
    spec = runner.RunSpec(ds_config=ds, shape=shape, seq_len=512, steps=5, grad_ckpt=True,
                          zero_init=choice["stage"] == 3)
    result = runner.RunResult(shape, status, "" if status == runner.OK else status,
                              losses=[11.0, 9.0, 8.0, 7.0, 6.0] if status == runner.OK else [],
                              steps_done=5, median_step_s=60.0, peak_gpu_allocated_bytes=int(gpu * 2**30),
                              peak_host_rss_bytes=int(host * 2**30))
    return biggest_model.Rung(shape, method, result, info.n_params, limit, spec)


def _gpu_t4():
    return dataclasses.replace(config.t4_profile(env.describe()), gpu_name="NVIDIA H200", gpu_count=1)


def test_the_estimator_is_held_to_what_each_rung_did():
    gpu = _gpu_t4()
    # SmolLM2-1.7B-shaped, weights on the GPU: 4.63 GiB GPU, 7.52 GiB host (docs/gpu_runs.md run 19)
    good = _ran("smollm2-1.7b-shaped", biggest_model.NVME_OPTIMIZER, 4.63, 7.52)
    assert claims_failed(biggest_model.prediction_claims([good], gpu)) == []
    # a host RAM far from the prediction fails on a GPU
    off = _ran("smollm2-1.7b-shaped", biggest_model.NVME_OPTIMIZER, 4.63, 10.0)
    assert any("predicted within 10% on the GPU and 15% on host RAM" in c
               for c in claims_failed(biggest_model.prediction_claims([off], gpu)))
    # a rung called "fits" that ran out of memory fails, wherever it ran
    small = _ran("gpt2-124m", "stage 0 (no ZeRO)", 0, 0, status=runner.OOM)
    assert biggest_model.rung_verdict(small, gpu) == memory.FITS
    assert claims_failed(biggest_model.prediction_claims([small], gpu))
    # nothing tried proves nothing
    assert claims_failed(biggest_model.prediction_claims([], gpu))
    table = biggest_model.prediction_table([good, small], gpu)
    assert len(table.rows) == 2 and table.rows[0][2] == memory.FITS


def test_a_3b_llama_is_predicted_past_the_budget_even_with_its_weights_on_the_gpu():
    """Killed for host RAM at 12.8 GB (docs/gpu_runs.md run 19): the fp16 gradient partition and the
    optimizer's swap buffers (sized to the 394M-element embedding) alone pass a run's budget."""
    gpu = _gpu_t4()
    killed = _ran("llama-3.2-3b-shaped", biggest_model.NVME_OPTIMIZER, 0, 11.88, runner.KILLED_RAM,
                  limit=int(10.63e9))
    assert biggest_model.rung_verdict(killed, gpu) == memory.NO_FIT
    host = biggest_model.rung_estimate(killed, gpu).parts["cpu"]
    assert host["grads"] + host["optimizer swap buffers"] > 10.63e9
    assert host["optimizer swap buffers"] == 4 * 4 * memory.ModelInfo.for_shape("llama-3.2-3b-shaped").largest_param_numel
    table = biggest_model.host_breakdown_table(["llama-3.2-3b-shaped", "smollm2-1.7b-shaped"], gpu, 4, 512, "/tmp/x")
    # the frozen embedding's row only where the optimizer on NVMe does not fit whole: the 3B's
    frozen = biggest_model.NVME_FROZEN.removeprefix("ZeRO-3 + ")
    assert [r[3] for r in table.rows] == ["NVMe", "NVMe optimizer, weights on GPU", frozen,
                                          "NVMe", "NVMe optimizer, weights on GPU"]
    assert "fp16 grads" in table.header and "optimizer buffers" in table.header
    total = table.header.index("host total")
    assert float(table.rows[2][total]) * 2**30 < gpu.ram_budget_bytes < float(table.rows[1][total]) * 2**30


def test_the_t4_host_table_is_a_t4s_on_a_cpu_too():
    """Its title says T4: fp16 gradients at 2 bytes a parameter even on an fp32 CPU machine (a
    CPU's precision made every host total 35-48% too high), the same figures as on a GPU."""
    cpu = dataclasses.replace(env.describe(), precision="fp32", gpu_name=None, gpu_count=0)
    shapes = ["smollm2-1.7b-shaped"]
    on_cpu = biggest_model.host_breakdown_table(shapes, cpu, 4, 512, "/tmp/x")
    on_gpu = biggest_model.host_breakdown_table(shapes, _gpu_t4(), 4, 512, "/tmp/x")
    grads = on_cpu.header.index("fp16 grads")
    n_params = memory.ModelInfo.for_shape("smollm2-1.7b-shaped").n_params
    assert float(on_cpu.rows[0][grads]) == pytest.approx(2 * n_params / 2**30, abs=0.01)
    assert on_cpu.rows == on_gpu.rows


def test_the_largest_model_plot_names_a_t4_only_where_runs_had_one():
    assert "T4 envelope" in biggest_model.largest_title(_gpu_t4())
    cpu = dataclasses.replace(env.describe(), gpu_name=None, gpu_count=0, emulation=None)
    assert "T4" not in biggest_model.largest_title(cpu)
    assert "CPU" in biggest_model.largest_title(cpu)
    unemulated = dataclasses.replace(_gpu_t4(), emulation=None)
    assert "T4" not in biggest_model.largest_title(unemulated)


def test_throughput_spreads_the_optimizers_disk_traffic_over_accumulated_micro_batches():
    rung = _ran("smollm2-1.7b-shaped", biggest_model.NVME_OPTIMIZER, 4.63, 7.52)
    table = biggest_model.throughput_table([rung], 1432.0, 1710.0)
    row = dict(zip(table.header, table.rows[0]))
    one, sixteen = (float(row[f"tok/s, {k} micro"].replace(",", "")) for k in (1, 16))
    assert one == pytest.approx(2048 / 60.0, rel=0.02)
    # the step's optimizer I/O (its disk bound) is paid once for 16 micro-batches
    fixed = biggest_model.predicted_nvme_step_s(memory.ModelInfo.for_shape("smollm2-1.7b-shaped"),
                                                1432.0, 1710.0, weights_on_nvme=False)
    assert sixteen == pytest.approx(16 * 2048 / (fixed + 16 * (60.0 - fixed)), rel=0.02)
    assert sixteen > one
    # not a rung that did not run
    assert biggest_model.throughput_table([_ran("gpt2-124m", biggest_model.NVME, 1, 1, runner.KILLED_RAM)],
                                          1000, 1000).rows == []


def test_the_kernel_hands_freed_memory_back_before_the_ladder():
    import torch

    class Cycle:  # only the garbage collector frees a cycle
        pass

    a, b = Cycle(), Cycle()
    a.other, b.other, a.data = b, a, torch.ones(64 * 2**20)  # 256 MiB
    del a, b
    before, after = biggest_model.release_kernel_memory()
    assert before - after > 128 * 2**20, (before, after)


def claims_failed(held):
    from helpers import claims

    return claims.failed(held)


# ---- Colab life: the resumed step held to the uninterrupted run's -------------------------------


LOSSES = [3.4, 3.1, 2.9, 2.7, 2.5, 2.2, 2.1, 2.0]  # steps 1 to 8 of an uninterrupted run


@pytest.mark.parametrize("resumed, losses, first_step, held", [
    (2.5, LOSSES, 0, True),             # the same weights and micro-batches: step 5's loss
    (2.5 * 1.0005, LOSSES, 0, True),    # kernels' rounding
    (2.7, LOSSES, 0, False),            # stale weights: the step before the kept one
    (2.2, LOSSES, 0, False),            # micro-batches past where the kept step stopped
    (float("nan"), LOSSES, 0, False),
    (2.5, LOSSES[2:], 2, True),         # a run that itself began at step 3
    (2.5, LOSSES[6:], 6, False),        # a run that began after step 5: nothing to compare
])
def test_the_resume_check_holds_only_the_uninterrupted_runs_loss_at_the_kept_step(
        resumed, losses, first_step, held):
    claim, ok = biggest_model.resume_claim(resumed, losses, 4, first_step)
    assert ok is held, claim
    assert "step 5" in claim


def test_the_gpu_finetune_part_resumes_from_the_kept_weights_and_checks_it():
    from tools import gpu_finetune

    sources = [c.source for c in gpu_finetune.finetune_part().cells]
    assert not any(s.startswith(gpu_finetune.LADDER_HEADING) for s in sources)
    assert [s for s in sources if s.startswith("## ")][-1].startswith(gpu_finetune.COLAB_LIFE_HEADING)
    assert any("resumed_loss = train_step(" in s for s in sources)
    assert "lesson.resume_claim(" in sources[-1] and "finetune_claims" in sources[-1]


def test_a_frozen_embedding_leaves_the_gradient_buffer_and_the_swap_buffers():
    """The 3B lever: frozen, the 394M-element embedding trains no more, so the host's fp16 gradient
    partition counts the rest and the optimizer's swap buffers the largest sub-group without it.
    An estimate that ignored the freeze (the same figures) fails here."""
    gpu = _gpu_t4()
    info = memory.ModelInfo.for_shape("llama-3.2-3b-shaped")
    rung = _ran("llama-3.2-3b-shaped", biggest_model.NVME_OPTIMIZER, 0, 0, runner.KILLED_RAM)
    whole = biggest_model.rung_estimate(rung, gpu).parts["cpu"]
    rung.spec.freeze_embeddings = True
    frozen = biggest_model.rung_estimate(rung, gpu).parts["cpu"]
    embedding = memory.embedding_numel(info)
    assert embedding == info.largest_param_numel
    assert frozen["grads"] == whole["grads"] - 2 * embedding
    sub_group = rung.spec.ds_config["zero_optimization"]["sub_group_size"]
    assert frozen["optimizer swap buffers"] <= 4 * 4 * (sub_group + info.largest_param_numel // 10)
    assert frozen["optimizer swap buffers"] < whole["optimizer swap buffers"] / 3
    # a bare count (no parameter list) loses the embedding too
    bare = dataclasses.replace(info, param_numels=())
    assert memory.without_embedding(bare).n_params == info.n_params - embedding
    assert memory.without_embedding(bare).largest_param_numel < embedding


def test_a_frozen_embedding_needs_less_disk_and_a_lever_named_method_is_still_nvme(tmp_path):
    info = memory.ModelInfo.for_shape("llama-3.2-3b-shaped")
    trained = info.n_params - memory.embedding_numel(info)
    assert biggest_model.nvme_bytes_needed(info, False, frozen_embeddings=True) == int(16.0 * trained)
    assert (biggest_model.nvme_bytes_needed(info, True, frozen_embeddings=True)
            == int(18.2 * trained + 2 * memory.embedding_numel(info)))
    assert biggest_model.is_nvme(f"{biggest_model.NVME_OPTIMIZER}, embedding frozen")
    assert not biggest_model.is_nvme("ZeRO-2 + CPU offload")
    on_gpu = _ran("smollm2-1.7b-shaped", biggest_model.NVME_OPTIMIZER, 4.63, 7.52)
    on_nvme = _ran("smollm2-1.7b-shaped", biggest_model.NVME, 4.63, 7.52)
    assert not biggest_model.weights_on_nvme(on_gpu) and biggest_model.weights_on_nvme(on_nvme)
    whole = biggest_model.predicted_nvme_step_s(XL, 1000.0, 1000.0, weights_on_nvme=False)
    assert biggest_model.predicted_nvme_step_s(XL, 1000.0, 1000.0, weights_on_nvme=False,
                                               trained=XL.n_params // 2) == pytest.approx(whole / 2)


def test_the_ladder_saves_and_reloads_its_nvme_runs_from_the_headline_up(monkeypatch, tmp_path):
    """The top of the ladder (the headline and past it) saves and reloads under ZeRO-3 + NVMe; no
    smaller size and no other method spends the time; the disk check counts the save's bytes."""
    monkeypatch.setattr(runner, "measure", _fake_measure(()))
    checked = []
    real = biggest_model.check_disk
    monkeypatch.setattr(biggest_model, "check_disk", lambda info, path, **k: (
        checked.append((info.name, k["saved_bytes_per_param"])), real(info, path, **k))[1])
    rungs = biggest_model.run_ladder(["tiny", "mini", "gpt2-124m"], env.describe(), 2, 64, 2, tmp_path,
                                     True, None, headline="mini", progress=False)
    saved = {(r.shape, r.method) for r in rungs if r.spec and r.spec.save_reload_dir}
    nvme = [m for m, _ in biggest_model.METHODS if m != biggest_model.NVME_FROZEN and biggest_model.is_nvme(m)]
    assert saved == {(shape, m) for shape in ("mini", "gpt2-124m") for m in nvme}
    assert all(str(tmp_path) in r.spec.save_reload_dir for r in rungs if (r.shape, r.method) in saved)
    assert sorted(set(checked)) == [("gpt2-124m", 4), ("mini", 4), ("tiny", 0)]  # fp32 on the CPU
    assert not biggest_model.saves(["tiny", "mini"], "tiny", None)  # no headline: no save


def test_the_disk_check_adds_the_save_exactly_to_the_files_and_their_margin(monkeypatch, tmp_path):
    info = memory.ModelInfo.for_shape("gpt2-124m")
    need = int(biggest_model.nvme_bytes_needed(info) * 1.25) + 2 * info.n_params
    monkeypatch.setattr(env, "disk_free_bytes", lambda path: need)
    biggest_model.check_disk(info, tmp_path, saved_bytes_per_param=2)  # exactly enough
    monkeypatch.setattr(env, "disk_free_bytes", lambda path: need - 1)
    with pytest.raises(env.KitSetupError, match="GB for the saved weights"):
        biggest_model.check_disk(info, tmp_path, saved_bytes_per_param=2)
    biggest_model.check_disk(info, tmp_path)  # without the save it fits


def test_a_failed_reload_leaves_no_saved_folder_and_says_why(monkeypatch, tmp_path):
    """The runner's save and reload on a plain model standing in for an engine: the reload raises,
    the folder the save wrote is gone all the same, and the error reaches the caller (which
    records it as the run's save_error, the training's status standing)."""
    import torch
    import transformers

    from helpers import models

    class Engine:  # what save_and_reload uses of a DeepSpeed engine
        module = models.build_model(models.model_config("llama-tiny"))
        device = torch.device("cpu")

        def eval(self):
            self.module.eval()

        def __call__(self, **kw):
            return self.module(**kw)

        def destroy(self):
            pass

    def refuse(*a, **k):
        raise OSError("disk full while reading")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)  # reload_saved's
    folder, result, phases = tmp_path / "saved", {}, []
    with pytest.raises(OSError, match="disk full"):
        runner.save_and_reload(Engine(), torch.tensor([[1, 2, 3]]), str(folder), "fp32", result,
                               phases.append)
    assert not folder.exists() and result["saved_bytes"] > 0
    assert phases == [runner.SAVE_PHASE, runner.RELOAD_PHASE] and "reload_logit_diff" not in result


def test_a_run_saves_reloads_and_compares_logits_under_zero3_nvme(tmp_path):
    """A real ZeRO-3 run with the optimizer on NVMe and the embedding frozen, on the CPU: notebook
    06's sharded save, the engine freed, from_pretrained's reload gives the trained logits; the
    save's RSS is its own phase and the folder is gone after."""
    info = memory.ModelInfo.for_shape("llama-tiny")
    ds = config.zero_infinity(info, env.describe(), 2, tmp_path / "nvme", 2, frozen_embeddings=True)
    spec = runner.RunSpec(ds_config=ds, shape="llama-tiny", steps=2, grad_ckpt=True, zero_init=True,
                          freeze_embeddings=True, save_reload_dir=str(tmp_path / "saved"), force_cpu=True)
    r = runner.measure(spec)
    assert r.status == runner.OK, r.message
    assert r.reload_logit_diff is not None and r.reload_logit_diff <= biggest_model.RELOAD_TOL["fp32"]
    assert r.saved_bytes >= 4 * info.n_params * 0.99 and r.save_s > 0
    assert [p["name"] for p in r.rss_phases][-2:] == [runner.SAVE_PHASE, runner.RELOAD_PHASE]
    assert not (tmp_path / "saved").exists()


def test_the_ladder_freezes_the_embedding_only_where_the_optimizer_on_nvme_failed_whole(
        monkeypatch, tmp_path):
    """The lever is tried at a size the same method could not train with every parameter (killed
    for RAM at "mini" here), with the embedding frozen and sub-groups of the largest tensor that
    trains; at a size that trained whole it is not tried, and says why."""
    seen = []

    def fake(spec):
        seen.append(spec)
        killed = (spec.shape == "mini" and not spec.freeze_embeddings
                  and spec.label.endswith(biggest_model.NVME_OPTIMIZER))
        return runner.RunResult(spec.label, runner.KILLED_RAM if killed else runner.OK,
                                losses=[] if killed else [10.8, 10.0], steps_done=2,
                                median_step_s=1.0, wall_s=1.0)

    monkeypatch.setattr(runner, "measure", fake)
    monkeypatch.setattr(biggest_model, "METHODS", [
        m for m in biggest_model.METHODS if m[0].startswith(biggest_model.NVME_OPTIMIZER)])
    rungs = biggest_model.run_ladder(["tiny", "mini"], env.describe(), 2, 32, 2, tmp_path, True, None,
                                     progress=False)
    status = {(r.shape, r.method): r.result for r in rungs}
    skipped = status[("tiny", biggest_model.NVME_FROZEN)]
    assert skipped.status == runner.NOT_TRIED and skipped.message == biggest_model.LEVER_NOT_NEEDED
    assert status[("mini", biggest_model.NVME_FROZEN)].status == runner.OK
    frozen = [s for s in seen if s.freeze_embeddings]
    assert [s.shape for s in frozen] == ["mini"]
    assert "freeze_embeddings" not in json.dumps(frozen[0].ds_config)
    mini = memory.ModelInfo.for_shape("mini")
    trained = memory.without_embedding(mini).largest_param_numel
    assert frozen[0].ds_config["zero_optimization"]["sub_group_size"] == trained < mini.largest_param_numel
    top = next(r for r in rungs if r.result.status == runner.OK and r.spec.freeze_embeddings)
    grouped = memory.largest_sub_group_numel(memory.without_embedding(mini), trained)
    assert biggest_model.largest_sub_group(top) == grouped < memory.largest_sub_group_numel(mini, trained)
    lines = biggest_model.takeaways(rungs, env.describe())
    assert any(line.startswith(f"{biggest_model.NVME_FROZEN}: up to mini") for line in lines)


def _whole_fails_at(shapes, wall_s=1.0):
    """A fake measure: the optimizer on NVMe trained whole is killed for RAM at ``shapes``."""
    def fake(spec):
        killed = (spec.shape in shapes and not spec.freeze_embeddings
                  and spec.label.endswith(biggest_model.NVME_OPTIMIZER))
        return runner.RunResult(spec.label, runner.KILLED_RAM if killed else runner.OK,
                                losses=[] if killed else [10.8, 10.0], steps_done=2,
                                median_step_s=1.0, wall_s=wall_s)
    return fake


def _nvme_optimizer_methods(monkeypatch):
    monkeypatch.setattr(biggest_model, "METHODS", [
        m for m in biggest_model.METHODS if m[0].startswith(biggest_model.NVME_OPTIMIZER)])


def test_the_lever_climbs_past_the_first_size_that_failed_whole(monkeypatch, tmp_path):
    # killed whole at tiny, the optimizer on NVMe is not tried at mini: the lever is, at both
    monkeypatch.setattr(runner, "measure", _whole_fails_at({"tiny"}))
    _nvme_optimizer_methods(monkeypatch)
    rungs = biggest_model.run_ladder(["tiny", "mini"], env.describe(), 2, 32, 2, tmp_path, True, None,
                                     progress=False)
    status = {(r.shape, r.method): r.result.status for r in rungs}
    assert status[("mini", biggest_model.NVME_OPTIMIZER)] == runner.NOT_TRIED
    assert status[("tiny", biggest_model.NVME_FROZEN)] == status[("mini", biggest_model.NVME_FROZEN)] == runner.OK


def test_the_lever_keeps_to_the_time_budget_past_the_headline(monkeypatch, tmp_path):
    # whole, tiny took 20 s and mini was killed after 250 s; the lever at mini, predicted from
    # tiny's run (20 s x 4.8), would end past the 5-minute budget: not tried
    clock = [0.0]
    monkeypatch.setattr(biggest_model, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def fake(spec):
        killed = spec.shape == "mini" and not spec.freeze_embeddings
        clock[0] += 250.0 if killed else 20.0
        return runner.RunResult(spec.label, runner.KILLED_RAM if killed else runner.OK,
                                losses=[] if killed else [10.8, 10.0], steps_done=2,
                                median_step_s=1.0, wall_s=250.0 if killed else 20.0)

    monkeypatch.setattr(runner, "measure", fake)
    monkeypatch.setattr(biggest_model, "METHODS", [
        m for m in biggest_model.METHODS if m[0].startswith(biggest_model.NVME_OPTIMIZER)])
    rungs = biggest_model.run_ladder(["tiny", "mini"], env.describe(), 2, 32, 2, tmp_path, True, None,
                                     headline="tiny", budget_minutes=5, progress=False)
    status = {(r.shape, r.method): r for r in rungs}
    assert status[("mini", biggest_model.NVME_OPTIMIZER)].result.status == runner.KILLED_RAM
    lever = status[("mini", biggest_model.NVME_FROZEN)]
    assert lever.result.status == runner.NOT_TRIED and "past the ladder's budget" in lever.result.message
    assert lever.spec is None


def test_without_libaio_the_lever_is_not_called_unneeded(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "measure", _fake_measure(()))
    rungs = biggest_model.run_ladder(["tiny"], env.describe(), 2, 32, 2, tmp_path, False, None,
                                     progress=False)
    lines = biggest_model.takeaways(rungs, env.describe())
    assert not any("not needed here" in line for line in lines)
    assert f"{biggest_model.NVME_FROZEN}: no size trained here." in lines


def test_a_ladder_of_the_frozen_method_alone_runs_it(monkeypatch, tmp_path):
    # tools/gpu_nvme_rung.py runs one method: with no whole method beside it, the lever runs
    seen = []
    monkeypatch.setattr(runner, "measure", lambda spec: seen.append(spec) or runner.RunResult(
        spec.label, runner.OK, losses=[10.8, 10.0], steps_done=2, median_step_s=1.0))
    monkeypatch.setattr(biggest_model, "METHODS", [
        m for m in biggest_model.METHODS if m[0] == biggest_model.NVME_FROZEN])
    biggest_model.run_ladder(["mini"], env.describe(), 2, 32, 2, tmp_path, True, None, progress=False)
    assert [s.freeze_embeddings for s in seen] == [True]


def test_the_takeaways_say_the_frozen_lever_was_not_needed_where_nothing_failed(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "measure", _fake_measure(()))
    rungs = biggest_model.run_ladder(["tiny"], env.describe(), 2, 32, 2, tmp_path, True, None,
                                     progress=False)
    lines = biggest_model.takeaways(rungs, env.describe())
    assert any(line.startswith(f"{biggest_model.NVME_FROZEN}: not needed here") for line in lines)
