"""Workarounds for DeepSpeed bugs the kit runs into: each one small, applied by an explicit call,
safe to call twice, and listed in the README under "where DeepSpeed falls short".

Call :func:`apply_all` once per process before ``deepspeed.initialize`` (helpers.bench and
helpers.train do). In your own project you need them only where the bug bites (see each function).
"""

from __future__ import annotations

_MARK = "_zero_kit_fixed"


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

    setattr(_set_dtype, _MARK, True)
    _set_dtype.__wrapped__ = original
    Init._set_dtype = _set_dtype
    return True


def apply_all() -> list[str]:
    """Install every workaround; returns the names of those this call installed."""
    return [name for name, fix in (("zero.Init keeps the given dtype", fix_zero_init_dtype),) if fix()]
