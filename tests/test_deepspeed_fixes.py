"""helpers.deepspeed_fixes: zero.Init keeps a given dtype whatever the accelerator says about fp16
(ZeRO-3 + NVMe training on the CPU with it: tests/test_config.py's preset test)."""

import json
import subprocess
import sys

import pytest

from helpers import env


def run_probe(code: str, *args: str, timeout: int = 900) -> dict:
    """Run a probe script in a fresh process (from the repository's root) and return the JSON of
    its ``RESULT`` line; no such line fails the test with the probe's exit code and output (with
    Python's traceback of every thread, should the probe crash in C code)."""
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=str(env.REPO_ROOT))
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, (f"the probe exited {done.returncode} with no RESULT line:\n"
                  + done.stdout[-2000:] + done.stderr[-3000:])
    return json.loads(line[len("RESULT "):])

# One fresh process: partition a tiny model with zero.Init(dtype=float32) while the accelerator is
# made to answer fp16 = True, then False, with and without the fix. Prints {case: dtype}.
PROBE = r"""
import json, os, torch, torch.distributed as dist
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import deepspeed
from deepspeed.accelerator import get_accelerator
from helpers import deepspeed_fixes
accel, out = get_accelerator(), {}
for fixed in (False, True):
    if fixed:
        for _, fix in deepspeed_fixes.FIXES:  # every fix
            fix()
    for fp16 in (True, False):
        accel.is_fp16_supported = lambda fp16=fp16: fp16
        # The dtype Init keeps is what NVMe parameter swapping allocates its buffers in.
        init = deepspeed.zero.Init(module=torch.nn.Linear(8, 8), dtype=torch.float32)
        out[f"fixed={fixed} fp16={fp16}"] = str(init.dtype)
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def dtypes():
    return run_probe(PROBE, timeout=600)


@pytest.mark.parametrize("fp16", [True, False])
def test_the_fix_keeps_float32_whatever_the_accelerator_says(dtypes, fp16):
    assert dtypes[f"fixed=True fp16={fp16}"] == "torch.float32"


def test_without_the_fix_deepspeed_turns_float32_into_bfloat16_when_fp16_is_missing(dtypes):
    # The bug the fix is for. When a DeepSpeed release fixes it this fails: then drop the workaround.
    assert dtypes["fixed=False fp16=True"] == "torch.float32"
    assert dtypes["fixed=False fp16=False"] == "torch.bfloat16"


def test_every_fix_is_idempotent():
    from helpers import deepspeed_fixes

    for _, fix in deepspeed_fixes.FIXES:
        fix()
    assert [name for name, fix in deepspeed_fixes.FIXES if fix()] == []


# One fresh process: ZeRO-3 with the optimizer offloaded to the CPU (the gradient buffer in host
# RAM), one step without the fix and one with it, recording the largest tensor DeepSpeed's overflow
# check hands to torch.isinf / isnan / isfinite, and whether an inf planted in a gradient is seen.
# (Its all-reduce of the flag runs too: the fix hands that part back to DeepSpeed.)
OVERFLOW_PROBE = r"""
import json, os, torch, torch.distributed as dist
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import deepspeed
from helpers import config, deepspeed_fixes, models
deepspeed_fixes.fix_zero_init_dtype()
deepspeed_fixes.OVERFLOW_SLICE_NUMEL = 4096
seen = []
for name in ("isinf", "isnan", "isfinite"):
    def probe(x, *a, _f=getattr(torch, name), **k):
        seen.append(x.numel())
        return _f(x, *a, **k)
    setattr(torch, name, probe)
ds = config.build(stage=3, offload_optimizer="cpu", micro_batch=1, trainer=False, pin_memory=False)
ds.pop("fp16", None), ds.pop("bf16", None)
out = {}
for fixed in (False, True):
    if fixed:
        deepspeed_fixes.fix_stage3_overflow_check()
    model = models.build_model(models.model_config("tiny"), seed=0)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    batch = torch.randint(0, 100, (1, 16))
    for plant in (False, True):
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        if plant:
            engine.optimizer.grad_partitions_flat_buffer[7] = float("inf")
        # engine.step() runs this check for fp16 only (which a CPU lacks): call it as step() would.
        seen.clear()
        overflow = engine.optimizer.has_overflow(partition_gradients=True)
        out[f"fixed={fixed} plant={plant}"] = {
            "largest": max(seen, default=0), "overflow": overflow,
            "buffer": engine.optimizer.grad_partitions_flat_buffer.numel()}
        engine.optimizer.grad_partitions_flat_buffer.zero_()
        engine.step()
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def overflow_checks():
    return run_probe(OVERFLOW_PROBE)


def test_without_the_fix_the_overflow_check_takes_the_whole_gradient_buffer_at_once(overflow_checks):
    # The bug: a temporary the size of every gradient in host RAM. When DeepSpeed fixes it this
    # fails: then drop the workaround.
    case = overflow_checks["fixed=False plant=False"]
    assert case["largest"] == case["buffer"] > 4096


@pytest.mark.parametrize("plant", [False, True])
def test_the_fix_checks_in_slices_and_still_sees_an_inf(overflow_checks, plant):
    case = overflow_checks[f"fixed=True plant={plant}"]
    assert 0 < case["largest"] <= 4096 < case["buffer"]
    assert case["overflow"] is plant
    assert overflow_checks[f"fixed=False plant={plant}"]["overflow"] is plant


def test_slices_find_an_inf_or_nan_anywhere():
    import torch

    from helpers import deepspeed_fixes

    for bad in (float("inf"), float("-inf"), float("nan")):
        for where in (0, 4095, 4096, 9999):
            x = torch.zeros(10_000, dtype=torch.float16)
            x[where] = bad
            assert deepspeed_fixes.inf_or_nan_in_slices(x, slice_numel=4096)
    assert not deepspeed_fixes.inf_or_nan_in_slices(torch.zeros(10_000), slice_numel=4096)


def _gpu_share_step(step, scheduled_lr: float) -> float:
    """One sub-group step of ZeRO-3's partial offload through DeepSpeed's real ``_optimizer_step``
    (``step``), on a stand-in optimizer holding what stage3.py's ``__init__`` builds: the GPU's
    share of the sub-groups stepped by a ``torch.optim.AdamW`` whose lr was copied from the CPU
    optimizer before the scheduler set it to ``scheduled_lr``. Returns how far Adam's first step
    moved the weights (about the lr it used)."""
    import torch
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    weights = torch.nn.Parameter(torch.zeros(4))
    weights.grad = torch.ones(4)
    cpu = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)  # DeepSpeedCPUAdam's place
    opt = Stage3.__new__(Stage3)
    group = cpu.param_groups[0]
    opt.backup_optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=group["lr"],
                                             betas=group["betas"], eps=group["eps"],
                                             weight_decay=group["weight_decay"])
    group["lr"] = scheduled_lr  # what the scheduler (WarmupLR) does to the CPU optimizer's groups
    opt.optimizer, opt.sub_group_to_group_id, opt.fp32_partitioned_groups_flat = cpu, {0: 0}, [weights]
    opt.offload_optimizer, opt.subgroup_to_device = True, {0: "cuda"}  # a sub-group kept on the GPU
    opt.use_muon, opt.torch_autocast_gradscaler, opt.zenflow = False, None, False
    step(opt, 0)
    return float(weights.detach().abs().max())


def test_partial_offload_gpu_share_follows_the_schedule_only_with_the_fix():
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    from helpers import deepspeed_fixes

    deepspeed_fixes.fix_partial_offload_schedule()
    fixed = Stage3._optimizer_step
    deepspeeds_own = fixed.__wrapped__
    # The bug: DeepSpeed's GPU share steps at the rate copied at init (1e-2), not the scheduled 1e-4.
    # When a release fixes it this fails: then drop the workaround.
    assert _gpu_share_step(deepspeeds_own, 1e-4) == pytest.approx(1e-2, rel=1e-3)
    assert _gpu_share_step(fixed, 1e-4) == pytest.approx(1e-4, rel=1e-3)
    assert deepspeed_fixes.fix_partial_offload_schedule() is False  # installed once


def test_the_library_probe_uses_the_processs_own_stderr(monkeypatch):
    """A kernel's sys.stderr has no usable file descriptor: DeepSpeed's probe then answers False
    for libaio even where it links. With the fix the probe sees sys.__stderr__ and answers True."""
    import io
    import sys

    from deepspeed.ops.op_builder.builder import OpBuilder
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    from helpers import deepspeed_fixes

    assert env.libaio_available(), "libaio is missing: apt-get install -y libaio-dev"
    builder = ALL_OPS["async_io"]
    kernel_like = io.StringIO()  # fileno() raises io.UnsupportedOperation, as a kernel stream can
    monkeypatch.setattr(sys, "stderr", kernel_like)
    original = getattr(OpBuilder.has_function, "__wrapped__", OpBuilder.has_function)
    assert original(builder, "io_submit", ("aio",)) is False  # the bug
    deepspeed_fixes.fix_library_probe_in_kernels()
    assert builder.has_function("io_submit", ("aio",)) is True
    assert sys.stderr is kernel_like  # put back afterwards


# One fresh process per case: DeepSpeed's CPU op builders ask py-cpuinfo for the CPU's arch and
# flags twice per op load. Prints the number of real asks and the compile flags the builder made.
CPU_INFO_PROBE = r"""
import json, sys
import cpuinfo
from deepspeed.ops.op_builder.all_ops import ALL_OPS
from helpers import deepspeed_fixes
real, asked = cpuinfo.get_cpu_info, []
def counted():
    asked.append(1)
    if sys.argv[2] == "broken":
        raise RuntimeError("asked again")
    return real()
cpuinfo.get_cpu_info = counted
if sys.argv[1] != "none":
    assert deepspeed_fixes.fix_cpu_info_once(sys.argv[1]) is True
    assert deepspeed_fixes.fix_cpu_info_once(sys.argv[1]) is False
flags = [ALL_OPS[name].cxx_args() for name in ("cpu_adam", "fused_adam")]
print("RESULT", json.dumps({"asked": len(asked), "flags": flags}))
"""


def _cpu_info_probe(folder: str, mode: str = "real") -> dict:
    return run_probe(CPU_INFO_PROBE, folder, mode, timeout=300)


def test_the_cpu_is_read_once_per_machine_and_the_compile_flags_stay_the_same(tmp_path):
    """Without the fix two op builders ask py-cpuinfo four times (a subprocess each, ~1.2 s); with
    it the first process asks once and writes the answer, the next asks never (asking would fail
    here); every process gets the same -march and SIMD flags, so no op is rebuilt."""
    deepspeeds_own = _cpu_info_probe("none")
    assert deepspeeds_own["asked"] == 4  # the cost; when DeepSpeed caches it, drop the fix
    first = _cpu_info_probe(str(tmp_path))
    assert first["asked"] == 1 and len(list(tmp_path.glob("zero-kit-cpuinfo-*.json"))) == 1
    later = _cpu_info_probe(str(tmp_path), "broken")
    assert later["asked"] == 0
    assert deepspeeds_own["flags"] == first["flags"] == later["flags"]
    assert any(flag.startswith("-march") or "AVX" in flag for flag in first["flags"][0])


# One fresh process: a ZeRO-3 engine with its optimizer offloaded to the CPU, one step, destroy()
# and del, without the fix and then with it: is the engine still alive, is its model still on
# DeepSpeed's module stack, and how much host RAM did the optimizer's buffers keep.
DESTROY_PROBE = r"""
import ctypes, gc, json, os, weakref, psutil, torch, torch.distributed as dist
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import deepspeed
from deepspeed.runtime.zero import parameter_offload
from helpers import config, deepspeed_fixes, models
deepspeed_fixes.fix_zero_init_dtype()
ds = config.build(stage=3, offload_optimizer="cpu", micro_batch=1, trainer=False, pin_memory=False)
ds.pop("fp16", None), ds.pop("bf16", None)
rss = lambda: psutil.Process().memory_info().rss
out = {}
for fixed in (False, True):
    if fixed:
        deepspeed_fixes.fix_engine_destroy_frees_memory()
    model = models.build_model(models.model_config("gpt2-124m"), seed=0)
    engine = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)[0]
    batch = torch.randint(0, 100, (1, 16))
    engine.backward(engine(input_ids=batch, labels=batch).loss)
    engine.step()
    optimizer = weakref.ref(engine.optimizer)
    held = sum(t.numel() * t.element_size() for t in engine.optimizer.fp32_partitioned_groups_flat)
    engine.destroy()
    engine.destroy()  # as Accelerate's free_memory does: harmless
    on_stack = any(m is model for m in parameter_offload.FWD_MODULE_STACK)
    del engine, model
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    left = optimizer()
    out[str(fixed)] = {"on_stack": on_stack, "fp32_bytes": held,
                       "optimizer_buffers": 0 if left is None else sum(
                           t.numel() * t.element_size() for t in vars(left).get(
                               "fp32_partitioned_groups_flat", []))}
print("RESULT", json.dumps(out))
"""


def test_destroy_leaves_the_model_on_deepspeeds_stack_and_the_fix_frees_the_buffers():
    """Without the fix (DeepSpeed 0.19.8) the model stays on ``FWD_MODULE_STACK`` after
    ``destroy()`` and the optimizer keeps its fp32 partitions (4 x 124M bytes here); with it, the
    stack lets go and the buffers are gone. When DeepSpeed fixes its stack the first assertion
    fails: then drop the workaround."""
    out = run_probe(DESTROY_PROBE)
    assert out["False"]["on_stack"] and out["False"]["optimizer_buffers"] == out["False"]["fp32_bytes"] > 4e8
    assert not out["True"]["on_stack"] and out["True"]["optimizer_buffers"] == 0


#: ZenFlow's losses in its full-update warm-up rounds against plain CPU offload's (relative): the
#: same updates, in another order of float additions (measured: 6e-5 at most over 8 steps).
ZENFLOW_WARM_RTOL = 1e-4
# One fresh process: GPT-2 tiny (fp32, CPU) through ZeRO-2 + CPU offload with ZenFlow, without
# the fix and with it, and plain ZeRO-2 + CPU offload beside them: which 2-D weights
# deepspeed.initialize changed, and the losses of a few steps on the same batches.
ZENFLOW_PROBE = r"""
import copy, json, os, torch, torch.distributed as dist
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import deepspeed
from helpers import config, data, deepspeed_fixes, models
from helpers.lessons import zero_or_lora
deepspeed_fixes.fix_cpu_info_once()
plain = config.build(stage=2, offload_optimizer="cpu", micro_batch=2, trainer=False,
                     pin_memory=False, precision="fp32", lr=1e-3)
zenflow = copy.deepcopy(plain)
zenflow["zero_optimization"]["zenflow"] = dict(zero_or_lora.ZENFLOW)
warm = copy.deepcopy(zenflow)  # every step a full update (warm-up rounds): plain offload's math
warm["zero_optimization"]["zenflow"]["full_warm_up_rounds"] = 100
text = data.offline_corpus(50_000)
batches = data.batches(text, models.ByteTokenizer(), 32, 2, 8)
out = {}
for case, ds in (("zenflow", zenflow), ("fixed", zenflow), ("warm", warm), ("plain", plain)):
    if case == "fixed":
        assert deepspeed_fixes.fix_zenflow_weights()
    model = models.build_model(models.model_config("tiny"), seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    after = dict(engine.module.named_parameters())
    matrices = [n for n, p in before.items() if p.dim() == 2]
    changed = [n for n in matrices if not torch.equal(before[n], after[n].detach())]
    losses = []
    for batch in batches:
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    out[case] = {"matrices": len(matrices), "changed": len(changed), "losses": losses}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def zenflow_runs():
    return run_probe(ZENFLOW_PROBE)


def test_without_the_fix_zenflow_scrambles_every_weight_matrix_at_initialize(zenflow_runs):
    # The bug. When a DeepSpeed release fixes it this fails: then drop the workaround.
    case = zenflow_runs["zenflow"]
    assert case["changed"] == case["matrices"] > 0
    assert case["losses"][0] != zenflow_runs["plain"]["losses"][0]


def test_with_the_fix_zenflow_keeps_the_weights_and_its_loss_falls(zenflow_runs):
    from helpers import claims

    fixed, plain = zenflow_runs["fixed"], zenflow_runs["plain"]
    assert fixed["changed"] == 0 and fixed["matrices"] > 0
    assert fixed["losses"][0] == pytest.approx(plain["losses"][0], rel=1e-6)  # the same weights
    assert claims.loss_falls(fixed["losses"])


def test_with_the_fix_zenflow_s_full_updates_are_plain_offloads_steps(zenflow_runs):
    # In its warm-up rounds ZenFlow updates every weight every step: with the weights read back
    # right, after every step too, that is plain CPU offload, loss for loss.
    warm, plain = zenflow_runs["warm"], zenflow_runs["plain"]
    assert warm["losses"] == pytest.approx(plain["losses"], rel=ZENFLOW_WARM_RTOL)


# One fresh process, fp16 on the CPU (the accelerator made to answer fp16 = True): GPT-2 tiny, the
# same weights and batches under stage 0 without the fixes, stage 2, stage 0 with the loss-scale
# fix, then with both stage-0 fixes; for each, the gradient norm the engine reports after the first
# step, the loss scale, what backward returned, the mean move of the weights in that step, and the
# losses of 4 steps.
STAGE0_FP16_PROBE = r"""
import json, os, torch, torch.distributed as dist
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import deepspeed
from deepspeed.accelerator import get_accelerator
from helpers import deepspeed_fixes, models
get_accelerator().is_fp16_supported = lambda: True
batches = torch.randint(0, 100, (4, 4, 32), generator=torch.Generator().manual_seed(1))
out = {}
for name, stage in (("stage 0", 0), ("stage 2", 2), ("stage 0, loss scaled", 0),
                    ("stage 0, both fixes", 0)):
    if name == "stage 0, loss scaled":
        deepspeed_fixes.fix_stage0_fp16_loss_scale()
    if name == "stage 0, both fixes":
        deepspeed_fixes.fix_stage0_fp16_adam_step_count()
    model = models.build_model(models.model_config("tiny"), seed=0)
    ds = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
          "fp16": {"enabled": True, "initial_scale_power": 12},
          "zero_optimization": {"stage": stage}, "steps_per_print": 10**9}
    engine = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)[0]
    before = [p.detach().float().clone() for p in engine.module.parameters()]
    losses, run = [], {}
    for ids in batches:
        loss = engine(input_ids=ids, labels=ids).loss
        returned = engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        if not run:
            moved = [(p.detach().float() - b).abs().mean().item()
                     for p, b in zip(engine.module.parameters(), before)]
            run = {"norm": float(engine.get_global_grad_norm()), "returned": float(returned),
                   "scale": float(engine.optimizer.loss_scale), "moved": sum(moved) / len(moved)}
    out[name] = {**run, "losses": losses}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def stage0_fp16():
    return run_probe(STAGE0_FP16_PROBE, timeout=600)


def test_stage_0_in_fp16_sees_gradients_a_loss_scale_too_small_and_the_fix_scales_the_loss(
        stage0_fp16):
    """DeepSpeed 0.19.8 scales the loss only for ZeRO's optimizers, while stage 0's FP16_Optimizer
    divides the gradients by the loss scale all the same: its gradient norm reads 1/4,096 of stage
    2's from the same weights and batch. With the fix both read alike, and backward still returns
    the unscaled loss. When DeepSpeed fixes it (pull request 8393) the first check fails: drop the
    workaround."""
    broken, zero2 = stage0_fp16["stage 0"], stage0_fp16["stage 2"]
    fixed = stage0_fp16["stage 0, loss scaled"]
    assert broken["scale"] == zero2["scale"] == fixed["scale"] == 4096.0
    assert abs(broken["norm"] * broken["scale"] / zero2["norm"] - 1) < 0.01  # the bug
    assert abs(fixed["norm"] / zero2["norm"] - 1) < 0.01
    assert fixed["returned"] == zero2["returned"] == broken["returned"]  # the loss, unscaled


def test_stage_0_in_fp16_counts_a_step_before_the_first_and_the_fix_trains_as_stage_2(stage0_fp16):
    """FP16_Optimizer builds Adam's states with one step on zero gradients: the first real step
    uses step 2's bias correction and moves each fp32 weight 0.744 of the learning rate where
    stage 2 moves it 1e-3 (0.79 of stage 2's move in the fp16 copies measured here, rounded). With both stage-0 fixes the run is stage 2's, loss for loss.
    When DeepSpeed counts from 0 the first check fails: drop the workaround."""
    zero2, scaled = stage0_fp16["stage 2"], stage0_fp16["stage 0, loss scaled"]
    both = stage0_fp16["stage 0, both fixes"]
    assert 0.70 < scaled["moved"] / zero2["moved"] < 0.85  # the bug
    assert abs(both["moved"] / zero2["moved"] - 1) < 0.001
    assert all(abs(a - b) <= 1e-4 * b for a, b in zip(both["losses"], zero2["losses"]))
    assert len(both["losses"]) == 4
    # without the second fix the losses part from the second step on
    assert abs(scaled["losses"][1] - zero2["losses"][1]) > 1e-3


def test_only_the_collective_deprecations_are_quiet():
    """torch 2.13 warns on every ZeRO step that DeepSpeed calls all_gather_into_tensor and
    reduce_scatter_tensor; those two are silenced, any other FutureWarning still shows."""
    import warnings

    from helpers import deepspeed_fixes

    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()  # this process may have installed the filter already
        warnings.simplefilter("always")
        assert deepspeed_fixes.quiet_collective_deprecations() is True
        assert deepspeed_fixes.quiet_collective_deprecations() is False  # once is enough
        for name, new in (("all_gather_into_tensor", "all_gather_single"),
                          ("reduce_scatter_tensor", "reduce_scatter_single")):
            warnings.warn(f"`torch.distributed.{name}` is deprecated. Please use "
                          f"`torch.distributed.{new}` instead.", FutureWarning)
        warnings.warn("`torch.distributed.all_to_all` is deprecated.", FutureWarning)
        warnings.warn("`torch.distributed.all_gather_into_tensor` is deprecated.", UserWarning)
    assert [str(w.message) for w in seen] == ["`torch.distributed.all_to_all` is deprecated.",
                                             "`torch.distributed.all_gather_into_tensor` is "
                                             "deprecated."]


def test_torch_still_says_what_the_filter_matches():
    """The filter follows torch's own words: if torch rewords them, this fails (not the filter)."""
    import inspect
    import re

    import torch.distributed.distributed_c10d as c10d

    from helpers import deepspeed_fixes

    source = inspect.getsource(c10d)
    for pattern in deepspeed_fixes.COLLECTIVE_DEPRECATIONS:
        assert re.search(pattern, source), pattern


# ---- a gap with no fix yet: resuming ZeRO-3 with the optimizer on NVMe ------------------------

# One fresh process per offload device: 3 steps of an MLP at ZeRO-3, save_checkpoint, then a
# fresh engine from the same initial weights loads the checkpoint. Prints the weights' sums at the
# save, after the load, and at the start, and the swap files the checkpoint holds. The MLP's
# 512 x 1024 matrix makes a 2 MB optimizer sub-group: DeepSpeed swaps only tensors of at least
# aio.block_size (1 MB) to NVMe and keeps smaller ones in RAM, so a smaller model leaves nothing
# on the disk and would not show what a real model's resume does.
RESUME_PROBE = r"""
import json, os, sys, tempfile, torch, torch.distributed as dist
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import deepspeed
from helpers import deepspeed_fixes
for _, fix in deepspeed_fixes.FIXES:  # every fix
    fix()
device, work = sys.argv[1], tempfile.mkdtemp(prefix="kit_resume_")
offload = {"device": device}
if device == "nvme":
    offload.update(nvme_path=os.path.join(work, "nvme"), buffer_count=4)
config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 3, "offload_optimizer": offload, "sub_group_size": 600000},
          "aio": {"block_size": 1048576, "queue_depth": 16, "intra_op_parallelism": 2},
          "steps_per_print": 10**9}
def engine():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
def sums(eng):
    with deepspeed.zero.GatheredParameters(list(eng.module.parameters())):
        return [round(p.float().sum().item(), 5) for p in eng.module.parameters()]
eng = engine()
start = sums(eng)
for i in range(3):
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(i))
    eng.backward(eng(x).pow(2).mean())
    eng.step()
saved = sums(eng)
eng.save_checkpoint(os.path.join(work, "ckpt"))
eng.destroy()
eng = engine()
eng.load_checkpoint(os.path.join(work, "ckpt"))
swapped = [f for _, _, files in os.walk(os.path.join(work, "ckpt")) for f in files if f.endswith(".swp")]
print("RESULT " + json.dumps({"start": start, "saved": saved, "loaded": sums(eng), "swapped": swapped}))
"""


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_resuming_zero3_restores_the_weights_except_with_the_optimizer_on_nvme(device):
    """DeepSpeed 0.19.8: load_checkpoint skips the ZeRO checkpoint when the optimizer is on NVMe
    and copies only its swap folder (engine.load_checkpoint): the fp32 weights and moments of the
    swapped sub-groups come back, those kept in RAM do not, and the 16-bit weights are never
    refreshed: the resumed engine trains on from its fresh weights. With CPU offload the weights
    come back. When this fails for NVMe, DeepSpeed fixed it: update docs/deepspeed_gaps.md."""
    if device == "nvme":
        from deepspeed.ops.op_builder import AsyncIOBuilder

        if not AsyncIOBuilder().is_compatible(verbose=False):
            pytest.skip("libaio missing: NVMe offload cannot run here")
    got = run_probe(RESUME_PROBE, device)
    assert got["saved"] != got["start"]  # the steps moved the weights
    expected = got["start"] if device == "nvme" else got["saved"]
    assert got["loaded"] == expected, got
    if device == "nvme":  # the swap files were in the checkpoint: it is the load that drops them
        assert {"0_5.tensor.swp", "exp_avg-0_5.tensor.swp", "exp_avg_sq-0_5.tensor.swp"} <= set(
            got["swapped"]), got["swapped"]


# --- Which fixes a lesson needs, and whether its own code installed them ---------------------------

ZERO3_NVME = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"},
                                    "offload_param": {"device": "none"}},
              "fp16": {"enabled": True}}


@pytest.mark.parametrize("config, where, needed", [
    ({"zero_optimization": {"stage": 2}, "fp16": {"enabled": "auto"}}, {}, set()),
    (ZERO3_NVME, {"destroys": True}, {"fix_stage3_overflow_check", "fix_engine_destroy_frees_memory",
                                      "fix_library_probe_in_kernels"}),
    (ZERO3_NVME, {"in_kernel": False, "on_cpu": True}, {"fix_stage3_overflow_check",
                                                         "fix_zero_init_dtype"}),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}}, {},
     {"fix_stage3_overflow_check", "fix_partial_offload_schedule"}),
    ({"zero_optimization": {"stage": 3}}, {}, set()),
    ({"zero_optimization": {"stage": 3}}, {"destroys": True}, {"fix_engine_destroy_frees_memory"}),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "zenflow": {"topk_ratio": 0.05}}},
     {}, {"fix_zenflow_weights"}),
    ({"fp16": {"enabled": True}}, {}, {"fix_stage0_fp16_loss_scale", "fix_stage0_fp16_adam_step_count"}),
    ({"zero_optimization": {"stage": 0}, "fp16": {"enabled": False}}, {}, set()),
])
def test_needed_by_reads_the_fixes_a_config_depends_on(config, where, needed):
    from helpers import deepspeed_fixes

    kwargs = {"in_kernel": True, "on_cpu": False, "destroys": False, **where}
    got = deepspeed_fixes.needed_by(config, **kwargs)
    assert set(got) == needed
    assert all(reason for reason in got.values())
    assert set(got) <= {fix.__name__ for _, fix in deepspeed_fixes.FIXES}


# A fresh process: a lesson's claim before and after its own code installs what the config needs.
LESSON_CLAIM = r"""
import json
from helpers import deepspeed_fixes
config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
where = dict(in_kernel=True, on_cpu=False, destroys=True)
kit = deepspeed_fixes.apply_kit_only()
before = deepspeed_fixes.lesson_claim([config], **where)
deepspeed_fixes.fix_stage3_overflow_check()
half = deepspeed_fixes.lesson_claim([config], **where)
deepspeed_fixes.fix_engine_destroy_frees_memory()
after = deepspeed_fixes.lesson_claim([config], **where)
none = deepspeed_fixes.lesson_claim([{"zero_optimization": {"stage": 2}}], **where)
print("RESULT", json.dumps({"kit": kit, "in_place": sorted(deepspeed_fixes._IN_PLACE),
                            "before": before, "half": half, "after": after, "none": none}))
"""


def test_a_lesson_claim_fails_until_the_lessons_own_code_installs_each_fix():
    got = run_probe(LESSON_CLAIM)
    assert got["kit"] == list(__import__("helpers.deepspeed_fixes").deepspeed_fixes.KIT_ONLY)
    assert got["before"][1] is False and "missing: fix_stage3_overflow_check" in got["before"][0]
    assert got["half"][1] is False and "missing: fix_engine_destroy_frees_memory" in got["half"][0]
    assert "fix_stage3_overflow_check (" not in got["half"][0]
    assert got["after"][1] is True and "missing" not in got["after"][0]
    assert got["none"] == ["the lesson's DeepSpeed configs need none of the kit's DeepSpeed fixes here",
                           True]
    assert got["in_place"] == sorted(["fix_stage3_overflow_check", "fix_cpu_info_once",
                                      "fix_engine_destroy_frees_memory",
                                      "quiet_collective_deprecations"])


# A fresh process: the kit's helper that frees a Trainer's engine installs the destroy fix, and a
# lesson that did not install it still fails its claim (notebook 07's cell 31 masked it before).
KIT_INSTALL = r"""
import json
from helpers import deepspeed_fixes
from helpers.lessons import zero2_training
config = {"zero_optimization": {"stage": 3}}
where = dict(in_kernel=True, on_cpu=False, destroys=True)
zero2_training.free_memory()
import deepspeed
fixed = getattr(deepspeed.DeepSpeedEngine.destroy, "_zero_kit_fixed", False)
masked = deepspeed_fixes.lesson_claim([config], **where)
deepspeed_fixes.fix_engine_destroy_frees_memory()
shown = deepspeed_fixes.lesson_claim([config], **where)
print("RESULT", json.dumps({"fixed": fixed, "masked": masked, "shown": shown}))
"""


def test_the_kits_own_install_of_a_fix_is_not_the_lessons():
    got = run_probe(KIT_INSTALL)
    assert got["fixed"] is True  # the kit's helper still frees a ZeRO-3 engine
    assert got["masked"][1] is False and "missing: fix_engine_destroy_frees_memory" in got["masked"][0]
    assert got["shown"][1] is True


def test_kit_cells_install_no_fix_that_changes_a_result():
    """A notebook's cells outside the lesson install only the fixes of KIT_ONLY: a fix a lesson's
    result depends on is a line of the lesson (else its lesson_claim would hold by construction)."""
    import re

    from helpers import deepspeed_fixes
    from tools import nbtool

    allowed = {"apply_kit_only", *deepspeed_fixes.KIT_ONLY}
    called = re.compile(r"deepspeed_fixes\.(\w+)\(")
    found = {}
    for path in nbtool.notebook_paths():
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code" or "lesson" in cell["metadata"].get("tags", []):
                continue
            calls = set(called.findall(nbtool.source(cell))) - allowed - {"lesson_claim"}
            if calls:
                found[path.stem] = sorted(calls)
    assert not found, f"kit cells that install fixes a lesson should show: {found}"
