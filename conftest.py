"""Root conftest: settings for pytest and for the notebook kernels nbval starts.

The kernels are separate processes started in notebooks/: only environment variables reach them,
so everything here is an environment variable set before collection.
"""

import os

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

# Under CI a skipped test fails the run (tools/ci_rules.py).
pytest_plugins = ["tools.ci_rules"]

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


def pytest_collectstart(collector):
    """stderr (DeepSpeed's warnings, progress bars) is never compared on checked cells."""
    if hasattr(collector, "skip_compare"):
        collector.skip_compare += ("stderr", "application/javascript", "text/html",
                                   "application/vnd.jupyter.widget-view+json")
