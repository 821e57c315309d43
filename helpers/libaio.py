"""libaio, the Linux library DeepSpeed's async_io op (NVMe offload, ZeRO-Infinity) links against:
is it usable here, and the command that installs it. A machine fact, probed once per process.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys


LIBAIO_APT = "apt-get install -y libaio-dev"


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """DeepSpeed's own test: compile and link a program calling io_submit (honours CFLAGS/LDFLAGS).

    Run in a fresh subprocess: DeepSpeed's probe redirects file descriptor 2, which a Jupyter
    kernel's captured streams do not always allow (it answered False inside JupyterLab).
    """
    probe = ("import contextlib, io\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    from deepspeed.ops.op_builder.all_ops import ALL_OPS\n"
             "    b = ALL_OPS.get('async_io')\n"
             "    ok = bool(b is not None and b.has_function('io_submit', ('aio',)))\n"
             "print('LIBAIO', ok)")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return False
    return "LIBAIO True" in done.stdout


def install(run: bool = False) -> str:
    """Print, or with ``run`` and root, run the apt-get line that installs libaio-dev."""
    if available():
        return "libaio is already usable: nothing to install."
    if not run:
        return f"Not run. To enable NVMe offload: {LIBAIO_APT}"
    if shutil.which("apt-get") is None:
        return "apt-get is not here: install libaio's development package with your system's package manager."
    cmd = f"apt-get update -qq && {LIBAIO_APT} -qq"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    available.cache_clear()
    if done.returncode != 0:
        return f"{cmd} failed: " + "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
    return "libaio-dev installed: " + ("async_io can now be built." if available() else "but io_submit still does not link.")
