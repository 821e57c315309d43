"""helpers.lessons.stages_and_offload, faster offload: the variants' configs are what DeepSpeed accepts, and the checks fail on a
comparison that did not happen (no baseline, no variant, a silent failure, a different start)."""

import pytest

from helpers import claims, config, env, memory, runner
from helpers.lessons import stages_and_offload

NAMES = [name for name, _, _ in stages_and_offload.VARIANTS]


@pytest.fixture(scope="module")
def cpu():
    return env.describe()  # this machine (CI's has no GPU: fp32, ZeRO exact)


@pytest.mark.parametrize("name", NAMES)
def test_each_variant_config_is_valid_and_carries_its_feature(cpu, name):
    ds = stages_and_offload.variant_config(name, memory.ModelInfo.for_shape("gpt2-355m"), cpu, 4, 6)
    assert [p for p in config.check(ds) if p.level == "error"] == []
    zero = ds["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert ("zenflow" in zero) == ("ZenFlow" in name)
    assert zero["offload_optimizer"].get("ratio", 1.0) == (stages_and_offload.PARTIAL_RATIO if "partial" in name else 1.0)
    row = _matrix_row(choice_of(name), memory.ModelInfo.for_shape("gpt2-355m"), cpu)
    differ = {k for k, _, _ in stages_and_offload.config_differences(row, ds)}
    assert differ <= {"zero_optimization.offload_optimizer.ratio"}, differ  # the matrix's config, else


def _matrix_row(choice: dict, info: memory.ModelInfo, cpu) -> dict:
    """The config notebook 05's matrix runs for a row of ``choice`` (the lesson's stage 0 with the
    row's stage and offload devices, tuned), whether or not the lesson has such a row."""
    from helpers import taught

    zero = {"stage": choice["stage"], **{k: {"device": v} for k, v in choice.items() if k != "stage"}}
    written = taught.row_config(taught.stage0_config(4, cpu.precision), zero)
    rows = [c for c in config.lesson_row_configs(4, cpu.precision).values()
            if config.row_choice(c["zero_optimization"]) == choice]
    assert all(r == written for r in rows)  # where the lesson has the row, it is this one
    return config.tuned_row(written, info, cpu, 4)


def choice_of(name: str) -> dict:
    return next(choice for n, choice, _ in stages_and_offload.VARIANTS if n == name)


def test_plain_offload_is_the_matrixs_row_and_the_zero3_variant_differs_from_it_in_offload_param(cpu):
    """Issue 27: one name, two configs (4.36 s against 1.36 s at 355M). The variants run the
    matrix's row configs; the ZeRO-3 variant keeps its weights on the GPU, which its name says."""
    info = memory.ModelInfo.for_shape("gpt2-355m")
    rows = dict(config.STAGE_ROWS)
    plain = stages_and_offload.variant_config(stages_and_offload.PLAIN, info, cpu, 4, 8)
    assert plain == _matrix_row(rows["stage 2 + CPU offload"], info, cpu)
    zero3 = stages_and_offload.variant_config(stages_and_offload.ZERO3_OPTIMIZER_ONLY, info, cpu, 4, 8)
    differ = stages_and_offload.config_differences(_matrix_row(rows["stage 3 + CPU offload"], info, cpu),
                                                   zero3)
    assert {k.rsplit(".", 1)[0] for k, _, _ in differ} == {"zero_optimization.offload_param"}
    assert all(b is None for _, _, b in differ) and "weights on the GPU" in stages_and_offload.ZERO3_OPTIMIZER_ONLY


def _v(shape, name, status=runner.OK, step=1.0, losses=(10.8, 10.0, 9.0), message=""):
    r = runner.RunResult(name, status, message, losses=list(losses) if status == runner.OK else [],
                        median_step_s=step if status == runner.OK else None, peak_host_rss_bytes=2**30)
    return stages_and_offload.Variant(shape, name, r, 1)


def _good():
    return [_v(s, n, step=1.0 - 0.1 * i) for s in ("tiny", "mini") for i, n in enumerate(NAMES)]


def failed(found):
    return claims.failed(found)


def test_a_good_comparison_passes_and_names_the_winner_per_size(cpu):
    variants = _good()
    assert failed(stages_and_offload.offload_checks(variants, cpu)) == []
    assert {s: v.name for s, v in stages_and_offload.winners(variants).items()} == {"tiny": NAMES[-1], "mini": NAMES[-1]}
    lines = stages_and_offload.offload_takeaways(variants, cpu)
    assert lines[0] == f"tiny: fastest was {NAMES[-1]} at 0.80 s/step (1.25x plain CPU offload), 1.0 GiB host RSS."
    assert "1.25x" in str(stages_and_offload.offload_table(variants, cpu))


def test_a_variant_that_fails_with_its_error_is_a_row_not_a_failure(cpu):
    variants = _good()
    variants[1] = _v("tiny", NAMES[1], runner.ERROR, message="RuntimeError: partial offload needs bf16")
    assert failed(stages_and_offload.offload_checks(variants, cpu)) == []
    assert any("partial offload needs bf16" in line for line in stages_and_offload.offload_takeaways(variants, cpu))


@pytest.mark.parametrize("break_it, claim", [
    (lambda vs: vs.__setitem__(0, _v("tiny", NAMES[0], runner.OOM, message="oom")), "plain CPU offload ran at every size"),
    (lambda vs: vs.__setitem__(2, _v("tiny", NAMES[2], runner.ERROR)), "every variant ran, or its row shows"),
    (lambda vs: [vs.__setitem__(i, _v(v.shape, v.name, runner.OOM, message="oom")) for i, v in enumerate(vs)
                 if v.name != stages_and_offload.PLAIN], "at least one faster-offload variant ran"),
    (lambda vs: vs.__setitem__(2, _v("tiny", NAMES[2], losses=(12.0, 10.0, 9.0))), f"tiny {NAMES[2]}: losses match"),
    (lambda vs: vs.__setitem__(1, _v("tiny", NAMES[1], losses=(10.8, float("nan")))), f"tiny {NAMES[1]}: losses match"),
    # GPT-2 124M in GPU run 16: every variant alike, so matching plain's losses did not catch it
    (lambda vs: [vs.__setitem__(i, _v("tiny", v.name, losses=(11.016, 8.230, 7.236, 5.292, 11.507)))
                 for i, v in enumerate(vs) if v.shape == "tiny"], f"tiny {NAMES[0]}: the loss falls"),
])
def test_a_bad_comparison_fails(cpu, break_it, claim):
    variants = _good()
    break_it(variants)
    assert any(c.startswith(claim) for c in failed(stages_and_offload.offload_checks(variants, cpu)))


def test_no_runs_at_all_fail(cpu):
    assert failed(stages_and_offload.offload_checks([], cpu))


def test_a_variant_whose_losses_part_from_plain_fails_and_says_why(cpu):
    # Partial offload without helpers.deepspeed_fixes (GPU, GPT-2 124M): same first loss, then its
    # GPU share trained at the peak rate and the losses parted. And a run that skipped steps.
    variants = _good()
    variants[2] = _v("tiny", NAMES[2], losses=(10.8, 9.0, 8.0))
    skipped = _v("mini", NAMES[1], losses=(10.8, 10.8, 10.8))
    skipped.result.skipped_steps = 2
    variants[4] = skipped
    bad = [b for b in failed(stages_and_offload.offload_checks(variants, cpu)) if "losses match" in b]
    assert [b.split(":")[0] for b in bad] == [f"tiny {NAMES[2]}", f"mini {NAMES[1]}"]
    assert "skipped 2 step(s) for fp16 overflow" in bad[1] and "skipped" not in bad[0]


def _result(label: str, step_s: float, gpu_gib: float, host_gib: float) -> runner.RunResult:
    return runner.RunResult(label, runner.OK, step_times_s=[step_s] * 4, median_step_s=step_s,
                            peak_gpu_allocated_bytes=int(gpu_gib * 2**30),
                            peak_host_rss_bytes=int(host_gib * 2**30))


def test_the_offload_takeaway_claims_a_cost_only_from_gpu_runs(cpu):
    """On a CPU, offload moves nothing (0.5x 'cost' and RSS 0.7 -> 0.7 GiB once read as the
    lesson's opposite): the line says so and quotes the T4-emulation record; on a GPU it is
    this run's figures."""
    import dataclasses

    plain, off = _result("stage 2", 2.0, 0, 0.7), _result("stage 2 + CPU offload", 1.0, 0, 0.7)
    no_gpu = dataclasses.replace(cpu, gpu_name=None, gpu_count=0)
    line = stages_and_offload.offload_line(plain, off, no_gpu)
    assert "cost" not in line and "nothing to move" in line and "2.6x the step time" in line
    assert "GPU 7.34 -> 2.07 GiB" in line
    gpu = dataclasses.replace(cpu, gpu_name="NVIDIA H200", gpu_count=1)
    line = stages_and_offload.offload_line(_result("stage 2", 0.2, 7.3, 2.5),
                                           _result("stage 2 + CPU offload", 0.6, 2.1, 8.5), gpu)
    assert "cost 3.0x the step time" in line and "from 7.30 to 2.10 GiB" in line
    unmeasured = runner.RunResult("stage 2", runner.OK, median_step_s=0.2, peak_host_rss_bytes=2**30)
    assert "from - to 2.10 GiB" in stages_and_offload.offload_line(  # no GPU peak: no crash
        unmeasured, _result("stage 2 + CPU offload", 0.6, 2.1, 8.5), gpu)
