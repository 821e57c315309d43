"""helpers.deepspeed_fixes: zero.Init keeps a given dtype whatever the accelerator says about fp16
(ZeRO-3 + NVMe training on the CPU with it: tests/test_config.py's preset test)."""

import json
import subprocess
import sys

import pytest

from helpers import env

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
        deepspeed_fixes.apply_all()
    for fp16 in (True, False):
        accel.is_fp16_supported = lambda fp16=fp16: fp16
        # The dtype Init keeps is what NVMe parameter swapping allocates its buffers in.
        init = deepspeed.zero.Init(module=torch.nn.Linear(8, 8), dtype=torch.float32)
        out[f"fixed={fixed} fp16={fp16}"] = str(init.dtype)
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def dtypes():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600,
                          cwd=str(env.REPO_ROOT))
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("fp16", [True, False])
def test_the_fix_keeps_float32_whatever_the_accelerator_says(dtypes, fp16):
    assert dtypes[f"fixed=True fp16={fp16}"] == "torch.float32"


def test_without_the_fix_deepspeed_turns_float32_into_bfloat16_when_fp16_is_missing(dtypes):
    # The bug the fix is for. When a DeepSpeed release fixes it this fails: then drop the workaround.
    assert dtypes["fixed=False fp16=True"] == "torch.float32"
    assert dtypes["fixed=False fp16=False"] == "torch.bfloat16"


def test_apply_all_is_idempotent():
    from helpers import deepspeed_fixes

    deepspeed_fixes.apply_all()
    assert deepspeed_fixes.apply_all() == []
