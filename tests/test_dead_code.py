"""No dead code in helpers/ or tools/: vulture (https://github.com/jendrikseipp/vulture) reads them
together with every notebook's code cells, so a helper only a test calls, or only an old notebook
called, is reported. Tests do not count as users."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Names read by something vulture cannot see (a framework, JSON readers, a test of the layers).
USED_ELSEWHERE = [
    "_render_traceback_", "_repr_html_", "_ipython_display_",  # IPython's display protocol
    "start_bytes", "entries",  # helpers.runner.Phase: read from the run's JSON (asdict), by notebook 06's lesson and tests
    "on_step_begin", "on_step_end", "on_log",  # transformers.TrainerCallback hooks
    "pytest_runtest_logreport", "pytest_sessionfinish", "pytest_terminal_summary", "exitstatus",
    "terminalreporter",  # pytest plugin hooks (tools/ci_rules.py)
    "pytest_configure", "pytest_runtest_makereport",  # pytest plugin hooks (tools/stated_figures.py)
    "loss_scales", "peak_gpu_reserved_bytes",  # RunResult fields: in its JSON (--json, KIT_BENCH_LOG)
    "__wrapped__",  # functools' convention: the original under a wrapper (helpers.deepspeed_fixes)
    "pre_tokenizer", "decoder", "bos_token_id", "pad_token_id", "name_or_path",  # set on tokenizers / HF configs
    "skip_special_tokens",  # the HF tokenizer interface ByteTokenizer.decode follows
    "description_width",  # ipywidgets style attribute
    "LAYERS",  # helpers/__init__.py: read by tests/test_layers.py
    "write_hub_cache",  # helpers.models: the Hub-name path offline (tests/test_lesson_scripts.py)
    "write_datasets_cache",  # helpers.data: a Hub dataset's name offline (tests/test_lesson_scripts.py)
    "save_offline_model",  # helpers.models: called in a fresh process (_save_in_a_subprocess)
    "pins", "lock_disagreements",  # helpers.colab: the lock read and compared (tests/test_lock.py)
    "write_gguf_folder",  # helpers.models: called in a fresh process (offline_real_model)
    "train_rank",  # the entry point a run's ranks start at, named as a string (helpers.runner)
    "__getattr__",  # a module's attribute worked out on first use (PEP 562: helpers.launch)
]


def notebook_code(folder: Path) -> Path:
    """Every notebook's code cells, one .py file each, so vulture sees what notebooks call."""
    folder.mkdir(parents=True, exist_ok=True)
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        lines = [line for line in code.splitlines() if not line.lstrip().startswith(("!", "%"))]
        (folder / f"nb_{nb.stem}.py").write_text("\n".join(lines) + "\n")
    whitelist = folder / "whitelist.py"
    whitelist.write_text("\n".join(f"{name}" for name in USED_ELSEWHERE) + "\n")
    return folder


def vulture(paths: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "vulture", *paths, "--min-confidence", "60"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode in (0, 3), done.stderr  # 3: dead code found
    return [line for line in done.stdout.splitlines() if line.startswith(("helpers/", "tools/"))]


def test_no_dead_code_in_the_helpers_and_tools(tmp_path):
    found = vulture(["helpers", "tools", str(notebook_code(tmp_path))])
    assert found == []


def test_the_check_finds_a_function_nobody_calls(tmp_path):
    lonely = tmp_path / "helpers" / "lonely.py"
    lonely.parent.mkdir()
    lonely.write_text("def used():\n    return 1\n\n\ndef never_called():\n    return 2\n\n\nused()\n")
    done = subprocess.run([sys.executable, "-m", "vulture", "helpers", "--min-confidence", "60"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert "never_called" in done.stdout and "'used'" not in done.stdout
