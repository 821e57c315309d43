"""What one rank holds: bytes of parameters, gradients and optimizer states in a DeepSpeed engine,
counted from the tensors themselves (views of one flat buffer counted once). helpers.bench records
it after the first step of every run; notebook 05 compares it across 1 and 2 ranks.
"""

from __future__ import annotations


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _unique_bytes(tensors, exclude: list | None = None) -> tuple[int, list]:
    """Bytes covered by ``tensors``, overlaps (views of one buffer) counted once, minus ``exclude``.

    Views are counted at their own extent, not their storage's: ZeRO's partitions are views into
    flat buffers, and a rank holds only its view's worth. Returns (bytes, the intervals counted).
    """
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size())
                   for t in tensors if t is not None and t.numel() > 0)
    merged: list[list[int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    total = sum(hi - lo for lo, hi in merged)
    for lo, hi in exclude or []:
        total -= sum(max(0, min(hi, b) - max(lo, a)) for a, b in merged)
    return total, merged


def held_bytes(engine) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer states this rank holds (call after backward).

    Parameters: the model's weights as stored here (ZeRO-3: this rank's partition, ``ds_tensor``).
    Gradients: the model's .grad plus the ZeRO optimizer's gradient partitions and buffers.
    Optimizer states: the inner optimizer's state (Adam's moments) plus fp32 master weights that are
    distinct from the model's weights. Offloaded tensors count too: the split by device is in
    ``*_gpu`` keys.
    """
    model, opt = engine.module, engine.optimizer
    params = [getattr(p, "ds_tensor", None) if hasattr(p, "ds_tensor") else p.data for p in model.parameters()]
    param_bytes, param_keys = _unique_bytes(params)
    grads = [p.grad for p in model.parameters()]
    for name in ("grads_in_partition", "grad_partitions_flat_buffer", "averaged_gradients"):
        grads += list(_tensors(getattr(opt, name, None)))
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat"):
        grads += [t.grad for t in _tensors(getattr(opt, name, None))]
    grad_bytes, _ = _unique_bytes(grads, exclude=param_keys)
    inner = getattr(opt, "optimizer", opt)
    masters = [p for group in getattr(inner, "param_groups", []) for p in group["params"]]
    # ZeRO-3 hands the inner optimizer one sub-group at a time and empties its param_groups after
    # the step: its fp32 master partitions live in fp32_partitioned_groups_flat.
    masters += list(_tensors(getattr(opt, "fp32_partitioned_groups_flat", None)))
    states = list(_tensors(list(getattr(inner, "state", {}).values())))
    opt_bytes, _ = _unique_bytes(masters + states, exclude=param_keys)
    gpu = lambda ts: sum(t.numel() * t.element_size() for t in ts if t is not None and t.is_cuda)
    return {"params_bytes": param_bytes, "grads_bytes": grad_bytes, "optimizer_bytes": opt_bytes,
            "params_gpu_bytes": gpu(params), "optimizer_gpu_bytes": gpu(masters + states)}
