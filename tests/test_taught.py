"""One definition: the lesson code the kit's runs call is generated from the notebooks' cells
tagged "export" (helpers/taught.py), and the runs call it (notebook 07's train_step, notebook 06's
zero_infinity_config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import nbtool

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "notebooks" / "07_engine_and_accelerate.ipynb"


def test_the_generated_module_is_what_the_notebooks_export_cells_define():
    assert nbtool.TAUGHT.read_text() == nbtool.render_taught(), (
        "helpers/taught.py differs from the notebooks' cells tagged export: "
        "run python tools/nbtool.py export")


def test_every_export_cell_is_a_lesson_cell_and_train_step_is_notebook_07s():
    exported = [(path.name, cell) for path in nbtool.notebook_paths()
                for cell in json.loads(path.read_text())["cells"]
                if nbtool.EXPORT_TAG in cell.get("metadata", {}).get("tags", [])]
    assert exported, "no cell is tagged export"
    assert all("lesson" in cell["metadata"]["tags"] for _, cell in exported)
    sources = {name: nbtool.source(cell) for name, cell in exported}
    assert "def train_step(engine, batch):" in sources[ENGINE.name]
    assert f"# ---- notebooks/{ENGINE.name}, cell " in nbtool.TAUGHT.read_text()


def _engine_notebook_with(tmp_path: Path, old: str, new: str) -> Path:
    nb = json.loads(ENGINE.read_text())
    cell = next(c for c in nb["cells"] if nbtool.EXPORT_TAG in c["metadata"].get("tags", []))
    text = nbtool.source(cell)
    assert old in text
    cell["source"] = text.replace(old, new)
    copy = tmp_path / ENGINE.name
    copy.write_text(json.dumps(nb))
    return copy


def test_an_edit_to_the_lesson_cell_changes_the_generated_module_and_the_check_fails(tmp_path,
                                                                                     monkeypatch):
    edited = _engine_notebook_with(tmp_path, "    return loss.item()\n",
                                   "    print('edited')\n    return loss.item()\n")
    monkeypatch.setattr(nbtool, "ROOT", tmp_path)  # the header names the copy's folder
    rendered = nbtool.render_taught([edited])
    assert "    print('edited')\n    return loss.item()" in rendered
    monkeypatch.undo()
    assert rendered != nbtool.TAUGHT.read_text()


def test_a_cell_tagged_export_without_a_function_is_refused(tmp_path):
    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["lesson", "export"]},
                     "source": "x = 1\n", "outputs": [], "execution_count": None}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    with pytest.raises(ValueError, match="tagged 'export' but defines no function"):
        nbtool.render_taught([path])


RUN_WITH_A_SPY = """
import json, sys
from helpers import config, runner, taught
calls = []
lesson_step = taught.train_step
def spy(engine, batch):
    calls.append(sorted(batch))
    return lesson_step(engine, batch)
taught.train_step = spy
ds = config.build(stage=2, trainer=False, precision="fp32", pin_memory=False, micro_batch=2)
result = {}
runner.train_steps(runner.RunSpec(ds_config=ds, shape="tiny", steps=3, force_cpu=True), result)
print(json.dumps({"calls": calls, "losses": result["losses"],
                  "optimizer_step_s": result["optimizer_step_s"],
                  "grads_bytes": result.get("grads_bytes"),
                  "optimizer_bytes": result.get("optimizer_bytes")}))
"""


def test_every_measured_run_steps_through_the_lessons_train_step():
    """runner.train_steps (every run of 05, 06, 09 and the command line) calls taught.train_step
    once a batch, and its measurements still come from inside the step."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "WORLD_SIZE": "1", "RANK": "0",
           "LOCAL_RANK": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", RUN_WITH_A_SPY], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["calls"] == [["input_ids", "labels"]] * 3
    assert len(seen["losses"]) == 3 and len(seen["optimizer_step_s"]) == 3
    assert seen["grads_bytes"] > 0 and seen["optimizer_bytes"] > 0


# ---- notebook 06's ZeRO-Infinity function: the fine-tune's, the ladder's, the sizing's ----------

BIGGEST = ROOT / "notebooks" / "06_biggest_model_on_a_t4.ipynb"


def test_the_ladder_the_sizing_and_the_host_table_build_with_notebook_06s_function(monkeypatch):
    from helpers import config, memory, sizing, taught
    from helpers import env as kit_env
    from helpers.lessons import biggest_model

    calls = []
    lesson_function = taught.zero_infinity_config

    def spy(*args, **kwargs):
        calls.append(kwargs.get("offload_params"))
        return lesson_function(*args, **kwargs)

    monkeypatch.setattr(taught, "zero_infinity_config", spy)
    t4 = config.t4_profile(kit_env.describe())
    info = memory.ModelInfo.for_shape("tinyllama-1.1b-shaped")
    config.zero_infinity(info, t4, 4, "/tmp/x", 5, offload_param="none")
    assert calls == [False]
    sizing.size(info, t4, 4, 512)
    assert calls[1:] == [True, False]  # the zero.Init rows: weights on NVMe, then on the GPU
    biggest_model.host_breakdown_table(["gpt2-124m"], t4, 4, 512, "/tmp/x")
    assert len(calls) > 2


def test_an_edit_to_notebook_06s_function_changes_the_config_the_ladder_runs(tmp_path, monkeypatch):
    """Notebook 06's cell, edited (4 optimizer swap buffers made 6) and exported: the ladder's
    config for a rung follows it."""
    from helpers import config, memory, taught
    from helpers import env as kit_env

    nb = json.loads(BIGGEST.read_text())
    cell = next(c for c in nb["cells"] if nbtool.EXPORT_TAG in c["metadata"].get("tags", []))
    text = nbtool.source(cell)
    assert text.count('{"buffer_count": 4}') == 1
    cell["source"] = text.replace('{"buffer_count": 4}', '{"buffer_count": 6}')
    edited = tmp_path / BIGGEST.name
    edited.write_text(json.dumps(nb))
    monkeypatch.setattr(nbtool, "ROOT", tmp_path)
    rendered = nbtool.render_taught([edited])
    monkeypatch.undo()
    namespace: dict = {}
    exec(compile(rendered, "taught_edited.py", "exec"), namespace)
    t4 = config.t4_profile(kit_env.describe())
    info = memory.ModelInfo.for_shape("tinyllama-1.1b-shaped")
    before = config.zero_infinity(info, t4, 4, "/tmp/x", 5)["zero_optimization"]
    monkeypatch.setattr(taught, "zero_infinity_config", namespace["zero_infinity_config"])
    after = config.zero_infinity(info, t4, 4, "/tmp/x", 5)["zero_optimization"]
    assert (before["offload_optimizer"]["buffer_count"], after["offload_optimizer"]["buffer_count"]) == (4, 6)
