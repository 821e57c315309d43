"""helpers.memory: the CPU-offload host-RAM rule against the measurements it was fitted on."""

import pytest

from helpers import memory

GiB = 2**30


@pytest.mark.parametrize("params, measured_gib", [(354_823_168, 9.8), (1_557_611_200, 35.8)])
def test_cpu_offload_rule_matches_the_measured_runs(params, measured_gib):
    assert memory.cpu_offload_host_bytes(params) / GiB == pytest.approx(measured_gib, rel=0.05)


def test_cpu_offload_limit_inverts_the_rule():
    budget = int(12.7e9)
    limit = memory.cpu_offload_max_params(budget)
    assert 300e6 < limit < 600e6  # GPT-2 medium fits in free Colab's RAM, GPT-2 large does not
    assert memory.cpu_offload_host_bytes(limit) <= budget < memory.cpu_offload_host_bytes(limit + 10**6)
    assert memory.cpu_offload_max_params(GiB) == 0
