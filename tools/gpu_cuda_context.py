"""How much GPU memory a PyTorch process's CUDA context takes outside PyTorch's allocator: the
figure T4 emulation subtracts from a T4's memory (helpers.env.EMULATIONS). Run it on an idle GPU:

    python tools/gpu_cuda_context.py

It reads the device's used memory (cudaMemGetInfo) before this process exists on the GPU (through
NVML where it answers), after the context is made, and after a first cuBLAS matmul (cuBLAS's
workspace is PyTorch's allocation; its handle and kernels are not), and subtracts what PyTorch's
allocator reserved.
"""

import json

import torch


def used_by_device() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def main() -> None:
    before = None
    try:
        import pynvml

        pynvml.nvmlInit()
        before = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    except Exception as err:  # NVML missing: the context is measured from the first reading
        print("NVML:", err)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    after_init = used_by_device()
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    (a @ a).sum().item()
    after_matmul = used_by_device()
    reserved = torch.cuda.memory_reserved()
    props = torch.cuda.get_device_properties(0)
    out = {"gpu": props.name, "total_bytes": props.total_memory, "used_before": before,
           "used_after_init": after_init, "used_after_matmul": after_matmul, "reserved": reserved,
           "context_bytes": after_matmul - reserved - (before or 0), "torch": torch.__version__,
           "cuda": torch.version.cuda}
    print(json.dumps(out))
    print(f"CUDA context outside PyTorch's allocator: {out['context_bytes'] / 2**30:.3f} GiB")


if __name__ == "__main__":
    main()
