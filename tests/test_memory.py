"""helpers.memory: the CPU-offload host-RAM answer (the same estimate) against measured runs."""

import pytest

from helpers import memory

GiB = 2**30


# DESIGN.md's runs: DeepSpeed's default pinned offload buffers (0.19.5 and later).
@pytest.mark.parametrize("params, measured_gib", [(354_823_168, 9.8), (1_557_611_200, 35.8)])
def test_pinned_cpu_offload_matches_the_shared_measurements(params, measured_gib):
    assert memory.cpu_offload_host_bytes(params, pin_memory=True) / GiB == pytest.approx(
        measured_gib, rel=0.06
    )


# The kit's own configs, pin_memory off: GPU_RUNS.md run 6 (notebook 06's ladder) for 124M and run 2
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
