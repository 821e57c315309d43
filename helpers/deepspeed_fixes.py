"""Workarounds for DeepSpeed bugs the kit runs into: each one small, applied by an explicit call,
safe to call twice, and explained in docs/deepspeed_gaps.md.

The kit's measured runs install, before ``deepspeed.initialize``, only the fixes their config
needs (:func:`install_needed`; helpers.runner does, and records them with the run). A lesson
calls, in its own visible code, each fix its results depend on
(:func:`needed_by` says which a config needs; :func:`lesson_claim` checks that the lesson did);
the notebooks' kit cells install only what changes no result (:func:`apply_kit_only`). In your own
project: ``pip install "zero-kit @ git+https://github.com/zero-kit/zero-kit"`` (or copy this one
file: it imports nothing else of the kit), then ``from helpers import deepspeed_fixes`` and call
the fixes your run needs, before the engine starts.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

_MARK = "_zero_kit_fixed"


def _install(owner, name: str, fixed) -> bool:
    """Put ``fixed`` in place of ``owner.name``, marked (so a second call sees the fix) and with the
    original under ``__wrapped__``; True, for the fix functions to return."""
    setattr(fixed, _MARK, True)
    fixed.__wrapped__ = getattr(owner, name)
    setattr(owner, name, fixed)
    return True


#: The fixes called in this process so far (installed by the call, or found in place).
_IN_PLACE: set[str] = set()


def _recorded(fix):
    """A fix that notes, whenever it is called, that it is in place in this process."""
    @functools.wraps(fix)
    def call(*args, **kwargs):
        installed = fix(*args, **kwargs)
        _IN_PLACE.add(fix.__name__)
        return installed
    return call


def install_for_kit(fix) -> bool:
    """Install ``fix`` for the kit's own code (a helper that frees a Trainer's engine), not as the
    lesson's: :func:`lesson_claim` still asks whether the lesson's own code installed it."""
    return fix.__wrapped__()


#: Elements checked at a time by :func:`inf_or_nan_in_slices` (16 Mi: 32 MiB of fp16 per check).
OVERFLOW_SLICE_NUMEL = 1 << 24


@_recorded
def fix_zero_init_dtype() -> bool:
    """Make ``deepspeed.zero.Init`` keep the dtype it is given (DeepSpeed 0.19.8 and earlier).

    ``Init._set_dtype`` (runtime/zero/partition_parameters.py) evaluates
    ``dtype or torch.float16 if fp16_supported else torch.bfloat16 if is_bf16_supported else fp32``:
    by operator precedence a given dtype counts only when the accelerator has fp16, and
    ``is_bf16_supported`` is a method that is never called (so always true). On a CPU without
    mkldnn fp16 (an AMD EPYC with avx512_bf16, say) even an explicit float32 becomes bfloat16, and
    ZeRO-3 + NVMe offload then fails with "expected m1 and m2 to have the same dtype, but got:
    float != c10::BFloat16". ``deepspeed.initialize`` hits it whenever it partitions a model that
    was built outside ``zero.Init`` (it passes the model's own dtype). GPUs have fp16, so the
    given dtype wins there and nothing changes.

    Returns True when this call installed the fix, False when it was already in place.
    """
    from deepspeed.runtime.zero.partition_parameters import Init

    if getattr(Init._set_dtype, _MARK, False):
        return False
    original = Init._set_dtype

    def _set_dtype(self, ds_config, dtype):
        if dtype is not None:  # what the caller asked for, whatever the accelerator
            self.dtype = dtype
        elif ds_config is not None:  # DeepSpeed's own branch: the config's fp16/bf16 sections
            original(self, ds_config, dtype)
        else:
            import torch
            from deepspeed.accelerator import get_accelerator

            accel = get_accelerator()
            self.dtype = (torch.float16 if accel.is_fp16_supported() else
                          torch.bfloat16 if accel.is_bf16_supported() else torch.float32)

    return _install(Init, "_set_dtype", _set_dtype)


def inf_or_nan_in_slices(flat, slice_numel: int | None = None) -> bool:
    """Whether a tensor holds an inf or a NaN, checked a slice at a time so that the temporaries
    (``abs``, the boolean masks) stay the size of a slice, not of the tensor."""
    import torch

    slice_numel = slice_numel or OVERFLOW_SLICE_NUMEL
    flat = flat.reshape(-1)
    for start in range(0, flat.numel(), slice_numel):
        if not bool(torch.isfinite(flat.narrow(0, start, min(slice_numel, flat.numel() - start))).all()):
            return True
    return False


@_recorded
def fix_stage3_overflow_check() -> bool:
    """Check ZeRO-3's offloaded gradients for inf/NaN in slices (DeepSpeed 0.19.8 and earlier).

    ``DeepSpeedZeroOptimizer_Stage3.has_overflow`` runs ``torch.isinf(buffer).any()`` and
    ``torch.isnan(buffer).any()`` over the whole flat gradient buffer at once. With the optimizer
    offloaded that buffer lives in host RAM, and ``isinf`` materialises ``abs(buffer)`` plus a
    boolean mask: about 3 bytes per parameter for an fp16 buffer, for a moment, inside
    ``engine.step()`` (+4.35 GiB at GPT-2 XL's 1.56B parameters, the largest transient of the step:
    it decides whether 2.7B fits in Colab's 12.7 GB). The fix checks a host-RAM buffer slice by
    slice (:func:`inf_or_nan_in_slices`), records the answer where DeepSpeed keeps it, and lets
    DeepSpeed's own method do the rest (the all-reduce of the flag across ranks) on a one-element
    stand-in. Buffers on the GPU take DeepSpeed's path unchanged.

    Returns True when this call installed the fix, False when it was already in place.
    """
    import torch
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    if getattr(Stage3.has_overflow, _MARK, False):
        return False
    original = Stage3.has_overflow

    def has_overflow(self, partition_gradients=True):
        flat = getattr(self, "grad_partitions_flat_buffer", None)
        if not (partition_gradients and isinstance(flat, torch.Tensor) and flat.device.type == "cpu"):
            return original(self, partition_gradients)
        if inf_or_nan_in_slices(flat):
            self.inf_or_nan_tracker.fill_(True)
        self.grad_partitions_flat_buffer = torch.zeros(1, dtype=flat.dtype)  # finite: adds nothing
        try:
            return original(self, partition_gradients)
        finally:
            self.grad_partitions_flat_buffer = flat

    return _install(Stage3, "has_overflow", has_overflow)


#: What :func:`fix_partial_offload_schedule` copies from the CPU optimizer's groups to the GPU's.
SCHEDULED_KEYS = ("lr", "betas", "eps", "weight_decay")


@_recorded
def fix_partial_offload_schedule() -> bool:
    """Make ZeRO-3's partial optimizer offload follow the learning-rate schedule on its GPU part
    (``offload_optimizer.ratio`` < 1; DeepSpeed 0.19.8 and earlier).

    With a ratio below 1, ``DeepSpeedZeroOptimizer_Stage3.__init__`` (runtime/zero/stage3.py) steps
    the sub-groups kept on the GPU with a separate ``torch.optim.AdamW``, the "backup optimizer",
    built with ``lr=self.optimizer.param_groups[0]["lr"]``: a copy of the config's rate taken
    before the scheduler exists, in a param-group dict of its own. The scheduler (WarmupLR, say)
    then updates only the CPU optimizer's groups, so the GPU's share trains at the peak rate from
    step 1 and never warms up or decays. Measured (notebook 05, GPT-2 124M, T4 emulation): partial
    offload's loss parted from plain offload's at step 2 (8.59 against 8.23). The fix copies each
    group's ``lr``, ``betas``, ``eps`` and ``weight_decay`` from the CPU optimizer to the backup
    optimizer before every sub-group step, then runs DeepSpeed's own step.

    Returns True when this call installed the fix, False when it was already in place.
    """
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    if getattr(Stage3._optimizer_step, _MARK, False):
        return False
    original = Stage3._optimizer_step

    def _optimizer_step(self, sub_group_id):
        backup = getattr(self, "backup_optimizer", None)
        if backup is not None:
            for gpu_group, cpu_group in zip(backup.param_groups, self.optimizer.param_groups):
                if gpu_group is not cpu_group:
                    gpu_group.update({k: cpu_group[k] for k in SCHEDULED_KEYS if k in cpu_group})
        return original(self, sub_group_id)

    return _install(Stage3, "_optimizer_step", _optimizer_step)


@_recorded
def fix_library_probe_in_kernels() -> bool:
    """Make DeepSpeed's library probe work inside a Jupyter kernel (DeepSpeed 0.19.8 and earlier).

    ``OpBuilder.has_function`` (ops/op_builder/builder.py), which ``AsyncIOBuilder.is_compatible``
    uses to find libaio, silences the compiler by redirecting ``sys.stderr.fileno()``. In a kernel
    ``sys.stderr`` is the kernel's stream, and any error on the way is swallowed into "False": the
    probe then says libaio is missing while it is there, and ``AsyncIOBuilder().load()`` raises
    "Unable to JIT load the async_io op due to it not being compatible" (seen under nbval, and in
    JupyterLab). The fix runs the probe with the process's own ``sys.__stderr__``.

    Returns True when this call installed the fix, False when it was already in place.
    """
    import sys

    from deepspeed.ops.op_builder.builder import OpBuilder

    original = OpBuilder.has_function
    if getattr(original, _MARK, False):
        return False

    def has_function(self, funcname, libraries, library_dirs=None, verbose=False):
        shown, sys.stderr = sys.stderr, sys.__stderr__ or sys.stderr
        try:
            return original(self, funcname, libraries, library_dirs, verbose)
        finally:
            sys.stderr = shown

    return _install(OpBuilder, "has_function", has_function)


def _cpu_key() -> str:
    """What py-cpuinfo's answer depends on, without the lines that change (the clock): the
    vendor, model and flags of each CPU in /proc/cpuinfo, and the machine's architecture."""
    import hashlib
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    kept = sorted({line for line in lines
                   if line.split(":")[0].strip() in {"vendor_id", "model name", "flags", "Features"}})
    return hashlib.sha256("\n".join([platform.machine(), *kept]).encode()).hexdigest()[:16]


@_recorded
def fix_cpu_info_once(folder: str | os.PathLike | None = None) -> bool:
    """Ask py-cpuinfo once per machine, not twice per op load (DeepSpeed 0.19).

    ``OpBuilder.cpu_arch`` and ``OpBuilder.simd_width`` (ops/op_builder/builder.py) each call
    ``cpuinfo.get_cpu_info()``, which starts a Python subprocess to read the CPU: about 1.2 s on 2
    cores, so loading one compiled op takes 2.5 s and a run that loads two takes 5 s before it
    trains, in every process. The fix keeps the answer for the process and in a JSON file in
    ``folder`` (default: ``TORCH_EXTENSIONS_DIR``, where the ops it describes are kept), keyed by
    the CPU's model and flags, so that later processes on the machine read it. The answer is the
    same, so the compile flags (``-march``, SIMD width) and the ops' builds stay as they were.

    Returns True when this call installed the fix, False when it was already in place.
    """
    import json

    import cpuinfo

    if getattr(cpuinfo.get_cpu_info, _MARK, False):
        return False
    original = cpuinfo.get_cpu_info
    folder = folder or os.environ.get("TORCH_EXTENSIONS_DIR")
    path = (Path(folder) / f"zero-kit-cpuinfo-{cpuinfo.CPUINFO_VERSION_STRING}-{_cpu_key()}.json"
            if folder else None)
    kept: dict = {}

    def get_cpu_info():
        if not kept and path is not None and path.is_file():
            try:
                kept.update(json.loads(path.read_text()))
            except ValueError:  # a torn file: ask again
                pass
        if not kept:
            kept.update(original())
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    scratch = path.with_suffix(f".{os.getpid()}.tmp")
                    scratch.write_text(json.dumps(kept))
                    os.replace(scratch, path)
                except OSError:  # a read-only cache: this process still keeps its answer
                    pass
        return dict(kept)

    return _install(cpuinfo, "get_cpu_info", get_cpu_info)


@_recorded
def fix_engine_destroy_frees_memory() -> bool:
    """Make ``engine.destroy()`` free a ZeRO-3 engine's host memory (DeepSpeed 0.19.8 and earlier).

    ZeRO-3's parameter offload pushes its model onto a module-level list,
    ``deepspeed.runtime.zero.parameter_offload.FWD_MODULE_STACK``, when the engine is built, and
    nothing takes it off: the model, its hooks, the engine and the optimizer stay reachable after
    ``destroy()`` and ``del``, with every offload buffer they hold. Measured in notebook 06's
    kernel (T4 emulation, 2026-12-02; docs/gpu_runs.md): 5.82 GB still held after a TinyLlama-1.1B fine-tune, so the
    runs started after it were killed at 5.7 GB. A second root outlives that one (held from C,
    found by a reachability search from every module), so this fix also empties the optimizer,
    its NVMe swapper, the weights' swapper and the weights' partitions: what is left is empty
    objects, not buffers. The model is unusable afterwards, as a destroyed ZeRO-3 engine's is
    (save first: ``save_16bit_model``). A second ``destroy()`` (Accelerate's ``free_memory`` calls
    it again) does nothing; engines below stage 3 are left as DeepSpeed leaves them.
    (DeepSpeed issue 7204: "whenever the engine is destroyed and reinitialized, RAM seems to
    accumulate".) Call nothing on the engine after ``destroy()``.
    """
    from deepspeed.runtime.engine import DeepSpeedEngine

    if getattr(DeepSpeedEngine.destroy, _MARK, False):
        return False
    original = DeepSpeedEngine.destroy

    def destroy(self):
        if getattr(self, "_zero_kit_destroyed", False):
            return
        original(self)
        if self.zero_optimization_stage() != 3:
            return
        self._zero_kit_destroyed = True
        from deepspeed.runtime.zero import parameter_offload

        module = getattr(self, "module", None)
        parameter_offload.FWD_MODULE_STACK[:] = [m for m in parameter_offload.FWD_MODULE_STACK
                                                 if m is not module]
        optimizer = getattr(self, "optimizer", None)
        holders = [getattr(optimizer, "optimizer_swapper", None)]
        if module is not None:  # the weights' NVMe swapper, shared by every parameter
            holders += list({id(s): s for p in module.parameters()
                             if (s := getattr(p, "nvme_swapper", None)) is not None}.values())
        for holder in [*holders, optimizer]:
            if holder is not None and hasattr(holder, "__dict__"):
                vars(holder).clear()
        if module is not None:
            import torch

            for param in module.parameters():  # the partitions, and any gathered copy
                if getattr(param, "ds_tensor", None) is not None:
                    param.ds_tensor = None
                param.data = torch.empty(0, dtype=param.dtype, device=param.device)

    return _install(DeepSpeedEngine, "destroy", destroy)


@_recorded
def fix_zenflow_weights() -> bool:
    """Keep the model's weights as they are when ZenFlow flattens them (ZeRO-1/2 with
    ``zero_optimization.zenflow``; DeepSpeed 0.19.8 and earlier).

    ZenFlow's ``_flatten_dense_tensors`` (runtime/zenflow/zenflow_utils.py) stores every 2-D tensor
    transposed in the flat fp16 buffer (its top-k gradient selection works on columns), but
    ``DeepSpeedZeroOptimizer._update_model_bit16_weights`` (runtime/zero/stage_1_and_2.py) points
    each parameter at its slice with a plain ``view(shape)``: every matrix then reads its
    transposed data row by row, at ``deepspeed.initialize`` and after every step. Measured on
    GPT-2 tiny (CPU, fp32): every 2-D weight changed, square ones exactly transposed, the first loss
    10.8408 before and 10.8330 after. The fix views a 2-D slice as the transposed matrix it holds
    and transposes the view back (``view(cols, rows).t()``): the parameter reads the weights it had,
    and still shares the flat buffer, so the optimizer's updates reach it. Engines without ZenFlow
    take DeepSpeed's path unchanged.

    Returns True when this call installed the fix, False when it was already in place.
    """
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer as Zero12

    if getattr(Zero12._update_model_bit16_weights, _MARK, False):
        return False
    original = Zero12._update_model_bit16_weights

    def _update_model_bit16_weights(self, group_index):
        if not getattr(self, "zenflow", False):
            return original(self, group_index)
        flat_group = self.bit16_groups_flat[group_index]
        for p, meta, offset in zip(self.round_robin_bit16_groups[group_index],
                                   self.round_robin_bit16_meta[group_index],
                                   self.round_robin_bit16_offsets[group_index]):
            piece = flat_group.narrow(0, offset, meta.numel())
            shape = meta.shape
            p.data = piece.view(shape[1], shape[0]).t() if len(shape) == 2 else piece.view(shape)
        for param_index, param in enumerate(self.bit16_groups[group_index]):
            new_index = self.round_robin_bit16_indices[group_index][param_index]
            param.data = self.round_robin_bit16_groups[group_index][new_index].data

    return _install(Zero12, "_update_model_bit16_weights", _update_model_bit16_weights)


@_recorded
def fix_stage0_fp16_loss_scale() -> bool:
    """Scale the loss before backward for fp16 without ZeRO (stage 0; DeepSpeed 0.19.8).

    ``DeepSpeedEngine.backward`` scales the loss only for ZeRO's optimizers (``isinstance(...,
    ZeROOptimizer)``); stage 0 in fp16 runs ``FP16_Optimizer``, which is not one, so its loss goes
    to ``backward`` unscaled, while ``FP16_Optimizer.step`` still divides every gradient by the
    loss scale. Every update then sees gradients ``loss_scale`` times too small (4,096 times at
    ``initial_scale_power`` 12): Adam's ``eps`` outweighs the small ones, gradient clipping never
    engages (the norm reads 1/4,096 of itself), and fp16 gradients lose the range loss scaling is
    for. Measured in notebook 09 on a GPU (GPT-2 355M, 20 steps, the same batches): stage 0 ended
    at a held-out loss of 3.84 where ZeRO-2 + CPU offload reached 1.80; on the CPU (GPT-2 tiny,
    fp16, tests/test_deepspeed_fixes.py) stage 0's gradient norm read 0.00055 against stage 2's
    2.2444 after the first step. The fix multiplies the loss, in fp32, by the optimizer's loss
    scale before DeepSpeed's backward (what ``FP16_Optimizer.backward`` would do) and returns
    the loss as DeepSpeed would have. DeepSpeed pull request 8393 fixes the same in the engine.
    Engines with ZeRO, bf16 or fp32 take DeepSpeed's path unchanged.
    """
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    if getattr(DeepSpeedEngine.backward, _MARK, False):
        return False
    original = DeepSpeedEngine.backward

    def backward(self, loss, *args, **kwargs):
        scale = (getattr(self.optimizer, "loss_scale", None)
                 if isinstance(self.optimizer, (FP16_Optimizer, FP16_UnfusedOptimizer)) else None)
        if not scale or scale == 1:
            return original(self, loss, *args, **kwargs)
        return original(self, loss.float() * scale, *args, **kwargs) / scale  # as its backward

    return _install(DeepSpeedEngine, "backward", backward)


@_recorded
def fix_stage0_fp16_adam_step_count() -> bool:
    """Start stage 0's fp16 optimizer at step 0 (DeepSpeed 0.19.8).

    ``FP16_Optimizer`` (and ``FP16_UnfusedOptimizer``) build Adam's states by running one
    ``optimizer.step()`` on zero gradients when they are created
    (``initialize_optimizer_states``): Adam's moments stay zero, but its step count becomes 1, so
    every real step uses the bias correction of the next one. The first update is then 0.744 of
    the learning rate (``(0.1 / 0.19) / sqrt(0.001 / 0.002)`` with betas 0.9 and 0.999), the
    next ones less short, and ZeRO's optimizers, which count from 0, part from stage 0 at once.
    Measured on GPT-2 tiny in fp16 on the CPU: every weight moved 7.44e-4 in stage 0's first step
    at a learning rate of 1e-3, and 1.00e-3 at stage 2. The fix sets the step count of every
    state (and of every parameter group that holds one) back to 0 after the states are built.
    (With weight decay the zero-gradient step also shrinks each weight once by ``lr x decay``;
    the kit's configs use no decay.)
    """
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    if getattr(FP16_Optimizer.initialize_optimizer_states, _MARK, False):
        return False

    def restarted(original):
        def initialize_optimizer_states(self):
            out = original(self)
            for state in self.optimizer.state.values():
                step = state.get("step")
                if step is not None:
                    state["step"] = step.zero_() if hasattr(step, "zero_") else 0
            for group in self.optimizer.param_groups:
                if "step" in group:
                    group["step"] = 0
            return out
        return initialize_optimizer_states

    for owner in (FP16_Optimizer, FP16_UnfusedOptimizer):
        _install(owner, "initialize_optimizer_states",
                 restarted(owner.initialize_optimizer_states))
    return True


#: torch 2.13's deprecation messages for the collectives DeepSpeed 0.19.8 calls every step
#: (deepspeed/comm/torch.py picks them by name): one FutureWarning per step, nothing a user can act on.
COLLECTIVE_DEPRECATIONS = (r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
                           r"`torch\.distributed\.reduce_scatter_tensor` is deprecated")


@_recorded
def quiet_collective_deprecations() -> bool:
    """Silence exactly torch's FutureWarnings about ``all_gather_into_tensor`` and
    ``reduce_scatter_tensor``, which DeepSpeed 0.19.8 calls in every ZeRO step (16 warnings in
    one fine-tune's cell); every other warning still shows. In your project:
    ``warnings.filterwarnings("ignore", message=..., category=FutureWarning)`` with these messages."""
    import warnings

    installed = {f[1].pattern for f in warnings.filters if f[0] == "ignore" and f[1] is not None}
    missing = [m for m in COLLECTIVE_DEPRECATIONS if m not in installed]
    for message in missing:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    return bool(missing)


#: Every workaround, by what it does, in the order :func:`install_needed` installs them.
FIXES = (("zero.Init keeps the given dtype", fix_zero_init_dtype),
         ("ZeRO-3 checks offloaded gradients for overflow in slices", fix_stage3_overflow_check),
         ("partial offload's GPU part follows the learning-rate schedule", fix_partial_offload_schedule),
         ("DeepSpeed's libaio probe works inside a notebook kernel", fix_library_probe_in_kernels),
         ("the CPU is read once per machine, not twice per op load", fix_cpu_info_once),
         ("engine.destroy() frees a ZeRO-3 engine's host memory", fix_engine_destroy_frees_memory),
         ("ZenFlow keeps the model's weights as they were", fix_zenflow_weights),
         ("stage 0 in fp16 scales its loss before backward", fix_stage0_fp16_loss_scale),
         ("stage 0 in fp16 starts Adam's step count at 0", fix_stage0_fp16_adam_step_count),
         ("torch's deprecation of the collectives DeepSpeed calls each step is not repeated",
          quiet_collective_deprecations))


#: The fixes that change no result (time and noise only): what a notebook's kit cell installs.
KIT_ONLY = ("fix_cpu_info_once", "quiet_collective_deprecations")


def apply_kit_only() -> list[str]:
    """Install the fixes of :data:`KIT_ONLY`; returns the names of those this call installed."""
    return [fix.__name__ for _, fix in FIXES if fix.__name__ in KIT_ONLY and fix()]


def _offload_devices(zero: dict) -> set[str]:
    return {str((zero.get(key) or {}).get("device", "none")).lower()
            for key in ("offload_optimizer", "offload_param")} - {"none"}


def needed_by(config: dict, *, in_kernel: bool, on_cpu: bool, destroys: bool) -> dict[str, str]:
    """The fixes a run of DeepSpeed ``config`` needs for its results, each with what goes wrong
    without it. ``in_kernel``: the engine starts in a notebook's kernel; ``on_cpu``: no GPU (the
    accelerator lacks fp16); ``destroys``: the process goes on after ``engine.destroy()``.
    An ``"auto"`` fp16 switch (the Trainer's) counts as on."""
    zero = config.get("zero_optimization") or {}
    stage = int(zero.get("stage", 0) or 0)
    devices = _offload_devices(zero)
    fp16 = (config.get("fp16") or {}).get("enabled", False) in (True, "auto")
    ratio = float((zero.get("offload_optimizer") or {}).get("ratio", 1.0) or 1.0)
    needs = {}
    if stage == 3 and devices:
        needs["fix_stage3_overflow_check"] = ("ZeRO-3's overflow check over the offloaded gradients "
                                              "takes about 3 bytes per parameter of host RAM")
    if stage == 3 and destroys:
        needs["fix_engine_destroy_frees_memory"] = ("engine.destroy() leaves a ZeRO-3 engine's model, "
                                                    "optimizer and buffers in host RAM")
    if "nvme" in devices and in_kernel:
        needs["fix_library_probe_in_kernels"] = ("in a notebook kernel the libaio probe can answer no, "
                                                 "and NVMe offload fails to load its op")
    if stage == 3 and "nvme" in devices and on_cpu:
        needs["fix_zero_init_dtype"] = ("on a CPU without fp16, zero.Init makes fp32 weights bf16 and "
                                        "NVMe offload fails on a dtype mismatch")
    if stage == 3 and ratio < 1:
        needs["fix_partial_offload_schedule"] = ("the GPU's share of the optimizer never follows the "
                                                 "learning-rate schedule")
    if stage in (1, 2) and zero.get("zenflow"):
        needs["fix_zenflow_weights"] = "ZenFlow transposes every 2-D weight at deepspeed.initialize"
    if stage == 0 and fp16:
        needs["fix_stage0_fp16_loss_scale"] = "stage 0 in fp16 never scales its loss"
        needs["fix_stage0_fp16_adam_step_count"] = "stage 0 in fp16 starts Adam's step count at 1"
    return needs


def install_needed(config: dict, *, in_kernel: bool, on_cpu: bool, destroys: bool) -> None:
    """Install the fixes :func:`needed_by` names for ``config`` and those of :data:`KIT_ONLY`
    (:func:`in_place` then names the first)."""
    needs = needed_by(config, in_kernel=in_kernel, on_cpu=on_cpu, destroys=destroys)
    for _, fix in FIXES:
        if fix.__name__ in needs or fix.__name__ in KIT_ONLY:
            fix()


def in_place() -> list[str]:
    """The fixes called in this process so far that can change a result (not :data:`KIT_ONLY`)."""
    return sorted(_IN_PLACE - set(KIT_ONLY))


def lesson_claim(configs: list[dict], *, in_kernel: bool, on_cpu: bool,
                 destroys: bool) -> tuple[str, bool]:
    """(claim, held): every fix the lesson's ``configs`` need (:func:`needed_by`) is in place, as
    the lesson's own code installed it (a kit cell installs none of these)."""
    needs: dict[str, str] = {}
    for config in configs:
        needs.update(needed_by(config, in_kernel=in_kernel, on_cpu=on_cpu, destroys=destroys))
    missing = [name for name in needs if name not in _IN_PLACE]
    if not needs:
        return "the lesson's DeepSpeed configs need none of the kit's DeepSpeed fixes here", True
    claim = f"the lesson's code installs the DeepSpeed fixes its configs need: {', '.join(needs)}"
    if missing:
        claim += "; missing: " + "; ".join(f"{name} ({needs[name]})" for name in missing)
    return claim, not missing
