"""Root conftest: settings for pytest and for the notebook kernels nbval starts.

The kernels are separate processes started in notebooks/: only environment variables reach them,
so everything here is an environment variable set before collection.
"""

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

# Quiet, offline, reproducible kernels: no progress bars, no Hub, no debugger warnings.
for key, value in {
    "TQDM_DISABLE": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    "MPLBACKEND": "agg",
}.items():
    os.environ.setdefault(key, value)

import helpers  # noqa: E402  (sets TORCH_EXTENSIONS_DIR: the kit's ops, compiled once per machine)

# pytest-xdist's workers share the cores
helpers.share_threads(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))


import pytest
from xdist.scheduler import LoadScopeScheduling

# One NVMe offload folder per pytest process (each xdist worker), under the folder KIT_OFFLOAD_DIR
# named before the run (a GPU session's lane) or the temp disk: DeepSpeed names its swap files by
# rank and tensor, not by run, so a notebook and a lesson script side by side in one folder read or
# delete each other's (notebook 06 clears its folder when done). The base travels in its own
# variable: xdist's workers inherit the controller's environment, KIT_OFFLOAD_DIR included.
_BASE = (os.environ.get("ZERO_KIT_OFFLOAD_BASE") or os.environ.get("KIT_OFFLOAD_DIR")
         or tempfile.gettempdir())
os.environ["ZERO_KIT_OFFLOAD_BASE"] = _BASE
_OFFLOAD_DIR = os.environ["KIT_OFFLOAD_DIR"] = os.path.join(_BASE, f"zero_kit_offload_{os.getpid()}")


@pytest.fixture(autouse=True, scope="session")
def _remove_own_offload_dir():
    yield
    shutil.rmtree(_OFFLOAD_DIR, ignore_errors=True)  # made by the first run that needed it


from tools.run_tutorial import REAL_MODEL_LOCK, REAL_MODEL_NOTEBOOKS  # one lock: make tutorial's too

# Under CI a skipped test fails the run (tools/ci_rules.py); a memory figure a notebook prints
# that disagrees with the kit's T4 profile fails it too (tools/stated_figures.py).
pytest_plugins = ["tools.ci_rules", "tools.stated_figures"]

#: What a launcher sets. A test that starts DeepSpeed or a Trainer in-process sets them; a notebook
#: kernel that inherited them would reuse a port the pytest process still holds (EADDRINUSE).
LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
for key in LAUNCHER_VARIABLES:
    os.environ.pop(key, None)


@pytest.fixture(autouse=True, scope="module")
def _restore_environment_per_module():
    """The same for module-scoped fixtures (a Trainer trained once for a whole test module): autouse
    fixtures run first in their scope, so this snapshot is taken before such a fixture runs."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _restore_environment():
    """Tests that start DeepSpeed in-process set MASTER_PORT, LOCAL_WORLD_SIZE and friends (the
    Trainer and accelerate add their own): put the environment back after each test, so nothing
    leaks into later tests or into the notebook kernels nbval starts (they inherit it)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


_held = None  # the lock file while this worker runs a real-model notebook or script (against
# make tutorial's runs, and a pytest run without xdist's groups)


#: The real-model notebooks whose own run launches their lesson cells as ``train.py`` (under
#: DeepSpeed's launcher and ``accelerate launch``, two CPU ranks in smoke mode) and checks the losses
#: it printed: the real model's script run is theirs, so the script tests need not repeat it.
SCRIPT_LAUNCHED_BY_NOTEBOOK = ("04_zero2_training", "07_engine_and_accelerate")


def real_model_run(path, nodeid: str) -> bool:
    """Whether a test is one of the real model's heavy runs (a cell of its notebooks, a lesson script)."""
    return (path.suffix == ".ipynb" and path.stem in REAL_MODEL_NOTEBOOKS) or (
        path.name == "test_lesson_scripts.py" and "are_a_script_that_trains" in nodeid
        and any(f"[{nb}" in nodeid for nb in REAL_MODEL_NOTEBOOKS
                if nb not in SCRIPT_LAUNCHED_BY_NOTEBOOK))


#: The work unit of the real model's heavy runs: one worker runs them all, one after another,
#: while the other runs everything else (with the lock alone, a worker sat idle waiting for it).
REAL_MODEL_GROUP = "real-model"


class RealModelRunsOnOneWorker(LoadScopeScheduling):
    """``--dist loadscope`` (a notebook's cells on one worker, one kernel; a module's tests, their
    fixtures), with every real-model run in one more unit. xdist's own ``loadgroup`` cannot do it
    here: it renames each test's ``_nodeid``, which pytest 9 no longer reads."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid) or super()._split_scope(nodeid)


def work_unit(nodeid: str) -> str | None:
    """:data:`REAL_MODEL_GROUP` for a real-model run, else None (the test's module or notebook)."""
    return REAL_MODEL_GROUP if real_model_run(Path(nodeid.split("::")[0]), nodeid) else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pyproject.toml's ``--dist loadscope``, with the real-model runs in one unit; any other
    mode is xdist's own."""
    if config.getvalue("dist") == "loadscope":
        return RealModelRunsOnOneWorker(config, log)
    return None


@pytest.hookimpl(tryfirst=True)  # before the notebook's kernel starts
def pytest_runtest_setup(item):
    global _held
    if _held is None and real_model_run(item.path, item.nodeid):
        _held = open(REAL_MODEL_LOCK, "w")
        fcntl.flock(_held, fcntl.LOCK_EX)  # waits while the other worker runs one


@pytest.hookimpl(trylast=True)  # after the notebook's kernel has shut down
def pytest_runtest_teardown(item, nextitem):
    global _held
    same_notebook = (nextitem is not None and item.path.suffix == ".ipynb"
                     and nextitem.path == item.path)
    if _held is not None and not same_notebook:
        _held.close()  # releases the lock
        _held = None


def pytest_collectstart(collector):
    """stderr (DeepSpeed's warnings, progress bars) is never compared on checked cells."""
    if hasattr(collector, "skip_compare"):
        collector.skip_compare += ("stderr", "application/javascript", "text/html",
                                   "application/vnd.jupyter.widget-view+json")
