"""helpers.memory: the CPU-offload host-RAM answer (the same estimate) against measured runs."""

import pytest

from helpers import memory

GiB = 2**30


# Measured runs: DeepSpeed's default pinned offload buffers (0.19.5 and later).
@pytest.mark.parametrize("params, measured_gib", [(354_823_168, 9.8), (1_557_611_200, 35.8)])
def test_pinned_cpu_offload_matches_the_shared_measurements(params, measured_gib):
    assert memory.cpu_offload_host_bytes(params, pin_memory=True) / GiB == pytest.approx(
        measured_gib, rel=0.06
    )


# The kit's own configs, pin_memory off: docs/gpu_runs.md run 6 (notebook 06's ladder) for 124M and run 2
# for 355M. (Run 2's 124M figure, 4.81, was the first CPU-offload run of the session: it JIT-built
# cpu_adam, and the compiler's processes count in the run's tree RSS.)
@pytest.mark.parametrize("params, measured_gib", [(124_439_808, 3.99), (354_823_168, 7.94)])
def test_unpinned_cpu_offload_matches_the_kits_measurements(params, measured_gib):
    assert memory.cpu_offload_host_bytes(params) / GiB == pytest.approx(measured_gib, rel=0.10)


def test_cpu_offload_limit_inverts_the_estimate():
    budget = int(12.7e9)
    limit = memory.cpu_offload_max_params(budget)
    assert 355e6 < limit < 774e6  # GPT-2 medium fits in free Colab's RAM, GPT-2 large does not
    assert (
        memory.cpu_offload_host_bytes(limit)
        <= budget
        < memory.cpu_offload_host_bytes(limit + 10**7)
    )
    assert memory.cpu_offload_max_params(GiB) == 0
    assert memory.cpu_offload_max_params(budget, pin_memory=True) < limit


def test_optimizer_sub_groups_never_split_a_parameter_and_close_past_their_size():
    """DeepSpeed's ZeRO-3 sub-groups (stage3.py ``_create_fp16_sub_groups``): parameters in order,
    a group closed once it reaches sub_group_size; the NVMe optimizer's 4 swap buffers take the
    largest group's size, so a big embedding sets them."""
    info = memory.ModelInfo(n_params=175, largest_param_numel=100, n_layer=1, hidden=1, heads=1, vocab=1,
                            param_numels=(100, 30, 30, 10, 5))
    assert memory.largest_sub_group_numel(info, 50) == 100  # the embedding alone
    assert memory.largest_sub_group_numel(info, 40) == 100
    small = memory.ModelInfo(**{**info.__dict__, "param_numels": (10, 30, 30, 10, 5)})
    assert memory.largest_sub_group_numel(small, 35) == 40  # 10 + 30: closed past 35
    assert memory.largest_sub_group_numel(small, 1000) == 85  # everything in one group
    assert memory.largest_sub_group_numel(info, 50, world_size=2) == 50  # each rank's partition
    bare = memory.ModelInfo.from_count(10**9)
    assert memory.largest_sub_group_numel(bare, 10**7) == 10**7 + bare.largest_param_numel  # a bound
    llama = memory.ModelInfo.for_shape("llama-3.2-3b-shaped")
    assert llama.param_numels[0] == llama.largest_param_numel == 128256 * 3072
    ds = {"fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {
        "stage": 3, "sub_group_size": 10**8, "offload_optimizer": {"device": "nvme", "buffer_count": 4}}}
    host = memory.estimate(llama, ds, zero_init=True).parts["cpu"]
    assert host["optimizer swap buffers"] == 4 * 4 * 128256 * 3072  # not 4 x 4 x sub_group_size
