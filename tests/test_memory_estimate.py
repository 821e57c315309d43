"""helpers.memory.estimate: the ZeRO paper's model-state formulas, offload placement, the GPU
fit."""

import pytest

from helpers import config, memory

P = 1_000_000_000


def states_on_gpu(stage, n):
    info = memory.ModelInfo(P, 10, 1, 8, 1, 8)
    c = config.build(
        stage=stage,
        world_size=n,
        micro_batch=1,
        trainer=False,
        precision="fp16",
        pin_memory=False,
        reduce_bucket_size=0,
        prefetch_bucket_size=0,
    )
    return sum(memory.model_states(info, c, world_size=n)["gpu"].values()) / P


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_states_follow_the_zero_paper_and_deepspeeds_stage_1(stage, n):
    # The ZeRO paper's bytes per parameter (Table 1, mixed-precision Adam), written out here rather
    # than read from helpers.memory: the estimate must reproduce them from its own parts.
    paper = {0: 16, 1: 4 + 12 / n, 2: 2 + 14 / n, 3: 16 / n}[stage]
    deepspeed = (
        2 + 14 / n if stage == 1 else paper
    )  # DeepSpeed's stage 1 keeps only its gradient partition
    assert states_on_gpu(stage, n) == pytest.approx(deepspeed, rel=1e-6)


def test_offload_moves_optimizer_states_to_host_or_nvme():
    info = memory.ModelInfo.for_shape("gpt2-355m")
    cpu = memory.estimate(
        info,
        config.build(
            stage=2, offload_optimizer="cpu", trainer=False, precision="fp16", pin_memory=False
        ),
    )
    assert (
        "optimizer" not in cpu.parts["gpu"] and cpu.parts["cpu"]["optimizer"] == 12 * info.n_params
    )
    nvme = memory.estimate(
        info,
        config.build(
            stage=3,
            offload_optimizer="nvme",
            offload_param="nvme",
            trainer=False,
            precision="fp16",
            pin_memory=False,
        ),
        zero_init=True,
    )
    assert (
        nvme.parts["nvme"]["optimizer"] == 12 * info.n_params
        and "model build" not in nvme.parts["cpu"]
    )


# Measured on an H200 capped to a T4's 15 GiB (fp16, 4 x 512, gradient checkpointing; docs/gpu_runs.md).
MEASURED_GPU_GIB = {
    ("gpt2-124m", 0): 2.88,
    ("gpt2-124m", 2): 2.88,
    ("gpt2-124m", 3): 3.20,
    ("gpt2-355m", 0): 8.00,
    ("gpt2-355m", 2): 7.34,
    ("gpt2-355m", 3): 6.70,
}


@pytest.mark.parametrize("shape, stage", sorted(MEASURED_GPU_GIB))
def test_gpu_prediction_within_15_percent_of_the_recorded_measurements(shape, stage):
    info = memory.ModelInfo.for_shape(shape)
    c = config.build(stage=stage, micro_batch=4, trainer=False, precision="fp16", pin_memory=False)
    predicted = memory.estimate(info, c, micro_batch=4, seq_len=512).total("gpu") / 2**30
    assert predicted == pytest.approx(MEASURED_GPU_GIB[(shape, stage)], rel=0.15)


def test_fits_and_model_info_from_count():
    info = memory.ModelInfo.from_count(7_000_000_000)
    est = memory.estimate(
        info, config.build(stage=0, trainer=False, precision="fp16", pin_memory=False)
    )
    assert memory.verdict(est.total("gpu"), 15 * 2**30) == memory.NO_FIT
    assert 6e9 < info.n_params < 8e9 and info.hidden % 64 == 0


# Per rank with 2 GPUs, GPT-2 355M, same settings (docs/gpu_runs.md, Run 6: notebook 05 on 2 H200s
# capped at 15 GiB).
MEASURED_2GPU_GIB = {0: 8.00, 1: 4.04, 2: 4.04, 3: 4.24}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_gpu_prediction_within_15_percent_of_the_recorded_measurements(stage):
    info = memory.ModelInfo.for_shape("gpt2-355m")
    c = config.build(
        stage=stage, world_size=2, micro_batch=4, trainer=False, precision="fp16", pin_memory=False
    )
    predicted = (
        memory.estimate(info, c, world_size=2, micro_batch=4, seq_len=512, grad_ckpt=True).total(
            "gpu"
        )
        / 2**30
    )
    assert predicted == pytest.approx(MEASURED_2GPU_GIB[stage], rel=0.15)


def test_gpu_prediction_claim_holds_within_tolerance_and_not_without_a_measurement():
    assert (
        memory.gpu_prediction_claim("x", 110, 100)[1]
        and not memory.gpu_prediction_claim("x", 120, 100)[1]
    )
    claim, held = memory.gpu_prediction_claim("stage 2", 7 * 2**30, None)
    assert not held and "not measured" in claim


def test_the_estimate_reads_the_batch_from_the_config_and_refuses_other_numbers():
    info = memory.ModelInfo.for_shape("gpt2-124m")
    ds = config.build(stage=2, trainer=False, precision="fp16", micro_batch=2, world_size=2)
    assert memory.estimate(info, ds).total("gpu") == memory.estimate(info, ds, 2, 2).total("gpu")
    assert memory.estimate(info, ds).total("gpu") != memory.estimate(info, ds, 2, 2, seq_len=64).total("gpu")
    with pytest.raises(ValueError, match="micro_batch 4 but the config's train_micro_batch_size_per_gpu is 2"):
        memory.estimate(info, ds, micro_batch=4)
    with pytest.raises(ValueError, match="world_size 1 but"):
        memory.estimate(info, ds, world_size=1)
