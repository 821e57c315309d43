"""Notebook 01's checks and advice: is this machine ready for the kit? Each check is measured here
(a matmul in the kit's precision, DeepSpeed's accelerator, a one-process group, the offload folder,
the emulated GPU cap) and can fail; the verdict says in sentences what the machine can do.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from helpers import claims, colab, env, memory
from helpers.env import Environment
from helpers.show import Table, GB, GiB


def check_gpu_cap(environment: Environment) -> bool | None:
    """Prove the emulated cap holds: asking for more than the cap must raise OutOfMemoryError.

    Returns True when it did, False when the allocation went through (no cap), None with no cap to test.
    """
    if environment.gpu_cap_bytes is None:
        return None
    import torch

    over = environment.gpu_cap_bytes + GiB // 2
    try:
        block = torch.empty(over, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return True
    del block
    torch.cuda.empty_cache()
    return False


def package_table(packages: tuple[str, ...] = ("torch", "deepspeed", "transformers", "datasets", "accelerate")) -> Table:
    """Import each package and show its version, or the exact command that installs it."""
    import importlib

    rows = []
    for name in packages:
        try:
            module = importlib.import_module(name)
            rows.append((name, getattr(module, "__version__", colab.version_of(name) or "?"), "imported"))
        except ImportError as err:
            rows.append((name, "missing", f"{colab.install_command(name)}   ({err})"))
    return Table(["package", "version", "status"], rows, title="The libraries the kit uses")


def precision_error(precision: str, size: int = 256, seed: int = 0) -> float:
    """Run a matmul in ``precision`` on the device the kit trains on, return its largest error
    relative to float64 on the CPU (scaled by the largest entry). Proves the precision works here."""
    import torch

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(size, size, generator=gen, dtype=torch.float64) for _ in range(2))
    exact = a @ b
    got = (a.to(device, dtype) @ b.to(device, dtype)).double().cpu()
    return float((got - exact).abs().max() / exact.abs().max())


#: The largest relative matmul error each precision may show (fp16 has a 10-bit mantissa, bf16 7).
PRECISION_TOL = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}


def _accelerator_name() -> str | None:
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        return None
    return get_accelerator().device_name()


def check_invariants(environment: Environment) -> list[tuple[str, bool]]:
    """The facts notebook 01 asserts, each (claim, held), each measured here and able to fail."""
    import importlib

    checks = []
    try:
        importlib.import_module("deepspeed")
        checks.append(("DeepSpeed imports", True))
    except ImportError:
        checks.append((f"DeepSpeed imports (fix: {colab.install_command('deepspeed')})", False))
    device = "cuda" if environment.has_gpu else "cpu"
    accel = _accelerator_name()
    checks.append((f"DeepSpeed's accelerator is '{device}', like torch's (it says {accel!r}; "
                   "fix: unset DS_ACCELERATOR)", accel == device))
    error = precision_error(environment.precision)
    checks.append((f"a {environment.precision} matmul on the {device} matches float64 "
                   f"(error {error:.1e} <= {PRECISION_TOL[environment.precision]:g})",
                   error <= PRECISION_TOL[environment.precision]))
    checks.append(("a one-process distributed group starts on the probed port", env.dist_roundtrip()))
    folder = Path(environment.offload_dir)
    checks.append((f"the offload folder {folder} is writable", _writable_folder(folder)))
    if environment.emulation and environment.has_gpu:
        checks.append((f"GPU memory is capped at {environment.emulation.gpu_cap_bytes / GiB:.2f} GiB "
                       "(a larger allocation fails)", bool(check_gpu_cap(environment))))
    return checks


def _writable_folder(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def summary(environment: Environment, checks: list[tuple[str, bool]]) -> str:
    """Facts that read the same on a CPU and on a T4: what notebook 01 compares with nbval. Each line
    is a measured check's outcome, not a constant."""
    def held(start: str) -> bool:
        return claims.every(ok for claim, ok in checks if claim.startswith(start))

    lines = {
        "all checks held": claims.every(ok for _, ok in checks),
        "DeepSpeed imports": held("DeepSpeed imports"),
        "DeepSpeed's accelerator matches torch's device": held("DeepSpeed's accelerator"),
        "the kit's precision computes correctly here": held(f"a {environment.precision} matmul"),
        "single-process distributed group works": held("a one-process distributed group"),
        "offload folder writable": held("the offload folder"),
    }
    return "\n".join(f"{what}: {value}" for what, value in lines.items())


def verdict(environment: Environment) -> list[str]:
    """Plain sentences: what this machine can do with the kit, and why."""
    lines = []
    if not environment.has_gpu:
        lines.append(
            "No GPU: the kit runs in smoke mode on the CPU (fp32, tiny models). DeepSpeed uses its "
            "CPU accelerator, so ZeRO stages and CPU offload still run, slowly."
        )
    else:
        label = environment.emulation.label if environment.emulation else environment.gpu_name
        bf16 = "native bf16" if environment.native_bf16 else "no native bf16"
        ready = "ZeRO 1-3 and CPU offload ready" if environment.deepspeed_version else "DeepSpeed missing"
        lines.append(f"{label}: {environment.precision} ({bf16}), {ready}.")
    fits, tight = cpu_offload_limits(environment.ram_budget_bytes)
    lines.append(
        f"{environment.ram_budget_bytes / GB:.1f} GB of RAM: ZeRO-2 CPU offload {memory.FITS} up to "
        f"about {fits / 1e6:,.0f}M parameters, is {memory.TIGHT} up to {tight / 1e6:,.0f}M (within "
        f"{memory.VERDICT_MARGIN:.0%} of the budget) and {memory.NO_FIT} beyond (notebook 06 goes further with "
        "NVMe offload; `python -m helpers sizing --model <name>` sizes any model)."
    )
    lines.append(offload_host_sentence())
    if environment.gpu_count > 1:
        lines.append(
            f"{environment.gpu_count} GPUs: ZeRO partitions across them when launched with one process per GPU "
            "(the `deepspeed` launcher or torchrun from a cell, notebook 05). Kaggle offers 2 x T4 for free."
        )
    elif environment.platform != "kaggle":
        lines.append("One process, one device: stages 1-3 have nothing to partition across; offload is what saves memory here.")
    if not environment.deepspeed_version:
        lines.append(f"DeepSpeed is not installed: run  {colab.install_command('deepspeed')}")
    if environment.has_gpu and not environment.nvcc:
        lines.append("No nvcc: DeepSpeed cannot JIT-build CUDA ops such as FusedAdam (notebook 02 explains the fix).")
    return lines


#: What each kind of host-RAM bytes of a ZeRO-2 + CPU offload run is, in a sentence's words.
HOST_KIND_WORDS = {
    "optimizer": "fp32 master weights and Adam's two moments",
    "grads": "the fp32 gradient partition the CPU optimizer reads",
    "model build": "what stays of the fp32 model built on the host",
    "pinned buffers": "pinned (page-locked) transfer buffers",
}


def offload_host_bytes_per_param(pin_memory: bool) -> dict[str, float]:
    """Host bytes per parameter of ZeRO-2 + CPU offload by kind, as helpers.memory.estimate counts
    them (the per-parameter slope between 1B and 2B parameters; the process base is left out)."""
    config = {"fp16": {"enabled": True},
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                                      "pin_memory": pin_memory}}}
    small, large = (memory.estimate(memory.ModelInfo.from_count(n), config).parts["cpu"]
                    for n in (10**9, 2 * 10**9))
    slopes = {kind: (large[kind] - small.get(kind, 0)) / 10**9 for kind in large}
    return {kind: round(value, 2) for kind, value in slopes.items() if round(value, 2)}


def offload_host_sentence() -> str:
    """The estimator's host RAM per parameter for ZeRO-2 + CPU offload, in words, unpinned and
    pinned (DeepSpeed's default since 0.19.5; the kit's configs turn pinning off)."""
    plain, pinned = offload_host_bytes_per_param(False), offload_host_bytes_per_param(True)
    largest_first = sorted(plain, key=plain.get, reverse=True)
    parts = " + ".join(f"{plain[kind]:g} ({HOST_KIND_WORDS.get(kind, kind)})"
                       for kind in largest_first)
    extra = {kind: value for kind, value in pinned.items() if kind not in plain}
    extras = ", ".join(f"{value:g} more for {HOST_KIND_WORDS.get(kind, kind)}"
                       for kind, value in extra.items())
    return (f"ZeRO-2 + CPU offload, host RAM per parameter (helpers.memory.estimate): {parts} = "
            f"{sum(plain.values()):g} bytes; with pin_memory true (DeepSpeed's default since "
            f"0.19.5), {extras or 'nothing more'}: {sum(pinned.values()):g} bytes; over a process "
            f"base of about {memory.HOST_BASE_GPU / GiB:.1f} GiB on a GPU machine.")


def cpu_offload_limits(ram_bytes: int) -> tuple[int, int]:
    """(largest parameter count whose ZeRO-2 CPU-offload run "fits", largest that is only "tight")
    in ``ram_bytes`` of host RAM: the estimator's host figure against the three-way verdict."""
    return (memory.cpu_offload_max_params(int((1 - memory.VERDICT_MARGIN) * ram_bytes)),
            memory.cpu_offload_max_params(ram_bytes))


def takeaways(environment: Environment, checks: list[tuple[str, bool]]) -> list[str]:
    """Notebook 01's summary: what this machine showed, each figure from this run."""
    device = environment.gpu_name or "no GPU (the CPU)"
    emulated = f", emulating a {environment.emulation.label}" if environment.emulation else ""
    limit, _ = cpu_offload_limits(environment.ram_budget_bytes)
    matmul = next((claim for claim, _ in checks if " matmul " in claim), "")
    return [
        f"This machine: {device}{emulated}; the kit trains in {environment.precision} here ({matmul}).",
        f"{environment.ram_budget_bytes / GB:.1f} GB of RAM budget: ZeRO-2 with CPU offload fits up to about "
        f"{limit / 1e6:,.0f}M parameters; NVMe offload goes further ({environment.disk_free_bytes / GB:,.0f} GB "
        f"free at {environment.offload_dir}).",
        f"DeepSpeed {environment.deepspeed_version or 'is missing'}; {sum(ok for _, ok in checks)} of "
        f"{len(checks)} checks held, the one-process distributed group included (a notebook needs no launcher).",
        "Next: 02 · ds_report explained: which of DeepSpeed's compiled ops build here, and the fixes.",
    ]
