"""Memory: how many bytes a ZeRO setup needs on the GPU, in host RAM and on NVMe.

So far: the host-RAM rule for ZeRO-2 with CPU optimizer offload, used by notebook 01's verdict.

The ZeRO paper's accounting (mixed-precision Adam) puts 16 bytes per parameter in model states:
fp16 parameters (2) and gradients (2) plus fp32 master parameters, momentum and variance (12).
With the optimizer offloaded, the fp32 states (12), the fp32 gradients DeepSpeed's CPU Adam reads
(4) and pinned fp16 transfer buffers live in host RAM. On our GPU machine (H200 capped to a T4's
15 GiB, fp16, GPT-2 355M and 1.56B) peak host RSS was 9.8 GiB and 35.8 GiB: a straight line of
about 23.2 bytes per parameter over a 2.1 GiB base (CUDA context, torch, Python). Those two
measured points set the constants below.
"""

from __future__ import annotations

GiB = 2**30

#: Host bytes per parameter under ZeRO-2 + CPU optimizer offload (fitted; see module docstring).
CPU_OFFLOAD_HOST_BYTES_PER_PARAM = 23.2
#: Host RSS of a training process before model states (CUDA context, libraries), in bytes.
PROCESS_BASE_HOST_BYTES = int(2.1 * GiB)


def cpu_offload_host_bytes(n_params: int) -> int:
    """Predicted peak host RSS of ZeRO-2 with CPU optimizer offload for ``n_params`` parameters."""
    return int(PROCESS_BASE_HOST_BYTES + CPU_OFFLOAD_HOST_BYTES_PER_PARAM * n_params)


def cpu_offload_max_params(ram_bytes: int) -> int:
    """The largest parameter count whose ZeRO-2 CPU-offload run fits in ``ram_bytes`` of host RAM."""
    room = ram_bytes - PROCESS_BASE_HOST_BYTES
    return max(0, int(room / CPU_OFFLOAD_HOST_BYTES_PER_PARAM))
