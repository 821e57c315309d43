"""A notebook's ``parameters`` cell followed by its cells tagged ``lesson`` is a script that trains
without the kit: the code a learner copies into their own project really is all they need.

For every notebook with at least one ``lesson`` cell, the test writes a .py file of

1. a guard that leaves of the kit only its one-file DeepSpeed fixes importable
   (``from helpers import deepspeed_fixes``, as a learner gets them by installing the kit or
   copying the file; any other ``helpers`` module fails to import): the kit is installed in
   editable mode in .venv, so leaving the repository off PYTHONPATH alone would prove nothing;
2. the ``parameters`` cell;
3. a cell of assignments, as papermill injects parameters after that cell: ``MODEL_NAME`` and
   ``TEXT_FILE`` point at a model folder and a text file written into a temporary folder by
   ``helpers.models.save_offline_model`` and ``helpers.data.write_offline_text``, ``DATASET`` at a
   Hub name whose datasets cache the test wrote (``helpers.data.write_datasets_cache``), ``WORK_DIR`` /
   ``OUT_DIR`` into the same folder (each only when the parameters cell defines it);
4. the ``lesson`` cells, in order;

and runs it with ``python`` in a fresh process: cwd the temporary folder, PYTHONPATH without the
repository (other entries, such as the GPU machine's carried wheels, stay), smoke mode (``KIT_SMOKE=1``), offline, no launcher variables (the lesson sets them),
and ``TORCH_EXTENSIONS_DIR`` kept from the environment (DeepSpeed's CPU ops are compiled once and
cached there). It must exit 0 and print at least one line ``<label> losses: [l1, l2, ...]``, and
every such line must show a finite, falling loss (``helpers.claims.loss_falls``).

DeepSpeed's bugs: a lesson whose results depend on one of the kit's fixes installs it in its own
code (notebook 06's fixes cell, notebook 07's ZeRO-3 section), so the script runs with exactly the
fixes the notebook shows, and no other (the notebooks' kit cells install only fixes that change no
result, and their checks fail when a lesson's config needs a fix its code did not install).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import claims
from tools import nbtool
from conftest import SCRIPT_LAUNCHED_BY_NOTEBOOK
from tools.run_tutorial import REAL_MODEL_NOTEBOOKS

#: Notebooks whose lesson cells form a script (issue 15): both must have lesson cells.
LESSON_NOTEBOOKS = ("03_config_builder", "04_zero2_training", "05_stages_and_offload",
                    "06_biggest_model_on_a_t4", "07_engine_and_accelerate",
                    "08_beyond_data_parallelism", "09_zero_or_lora")
#: Notebooks whose lesson writes DeepSpeed configs rather than training (issue 27: notebook 03's
#: config as a dict, notebook 05's rows as what they change from stage 0): their script must write
#: at least one JSON config into WORK_DIR, and every one must pass the kit's checker (DeepSpeed's
#: own config classes and more).
CONFIG_LESSONS = ("03_config_builder", "05_stages_and_offload")
#: The learning rate a script gets when a tiny random model stands in for the real one (07's
#: fine-tuning rate, 1e-4, leaves a random start's loss flat over its 8 smoke steps).
RANDOM_START_RATE = {"LR": 3e-3}
#: What a lesson cell (and the parameters cell) may import: these and the standard library.
ALLOWED = {"torch", "transformers", "datasets", "deepspeed", "accelerate", "peft",
           "safetensors"}  # transformers' own dependency: its checkpoint format
#: The one kit module a lesson may import (``from helpers import deepspeed_fixes``): it imports
#: nothing else of the kit, and the lesson says how to get it.
KIT_ALLOWED = {"deepspeed_fixes"}
#: The script's first lines: the kit as a package that holds only its DeepSpeed fixes.
GUARD = """import importlib.abc, importlib.util, sys, types
# Of the kit only helpers/deepspeed_fixes.py is importable: lessons must need nothing else of it


class _OnlyTheFixes(importlib.abc.MetaPathFinder):  # before the editable install's finder
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "helpers":
            raise ModuleNotFoundError(f"{{name}}: a lesson needs nothing of the kit but its fixes")


sys.meta_path.insert(0, _OnlyTheFixes())
_kit = types.ModuleType("helpers")
_kit.__path__ = []
sys.modules["helpers"] = _kit
_spec = importlib.util.spec_from_file_location("helpers.deepspeed_fixes", {fixes!r})
_kit.deepspeed_fixes = sys.modules["helpers.deepspeed_fixes"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kit.deepspeed_fixes)"""
#: Names a parameters cell may define that the test points into its temporary folder.
#: The Hub name the scripts load, from a Hub-layout cache written by the test (HF_HUB_OFFLINE=1).
HUB_NAME = "zero-kit-offline/tiny-gpt2"
#: The Hub dataset (name, configuration) the scripts load, from a datasets cache laid out as
#: load_dataset leaves a downloaded one (HF_HUB_OFFLINE=1): notebook 06's DATASET path.
HUB_DATASET = ("zero-kit-offline/corpus", "wiki")
_LOSSES = re.compile(r"\blosses?:\s*\[([^\]]*)\]\s*$")
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _tagged(path: Path, tag: str) -> list[str]:
    return [nbtool.source(c) for c in _cells(path) if c["cell_type"] == "code"
            and tag in c.get("metadata", {}).get("tags", [])]


def _with_lessons() -> list[Path]:
    return [p for p in nbtool.notebook_paths() if _tagged(p, "lesson")]


def _script_runs() -> list:
    """(notebook, injected parameters): each lesson notebook as it is; at ZeRO-3 when it has STAGE;
    with the fp16 weights offloaded too when it has OFFLOAD_PARAMS (notebook 06: where libaio is
    ready, as in CI, the parameter offload's NVMe buffer_count, buffer_size and max_in_cpu, which
    its default leaves unused; without libaio, the weights go to CPU RAM); with the embedding
    frozen when it has FREEZE_EMBEDDING (06's lever for a 3B)."""
    runs = []
    for path in _with_lessons():
        runs.append(pytest.param(path, {}, id=path.stem))
        params = _tagged(path, "parameters")
        defined = defined_names(params[0]) if len(params) == 1 else set()
        if "STAGE" in defined:
            runs.append(pytest.param(path, {"STAGE": 3}, id=f"{path.stem}-stage3"))
        if "OFFLOAD_PARAMS" in defined:
            runs.append(pytest.param(path, {"OFFLOAD_PARAMS": True},
                                     id=f"{path.stem}-weights-offloaded"))
        if "FREEZE_EMBEDDING" in defined:
            runs.append(pytest.param(path, {"FREEZE_EMBEDDING": True},
                                     id=f"{path.stem}-embedding-frozen"))
    return runs


def loss_lines(output: str) -> dict[str, list[float]]:
    """Every ``<label> losses: [...]`` line of a script's output, as {label: losses}; a value that
    is not a number (``nan`` is) makes the line's list hold a nan, which loss_falls refuses."""
    found = {}
    for line in output.splitlines():
        match = _LOSSES.search(line.strip())
        if not match:
            continue
        values = []
        for item in (x.strip() for x in match.group(1).split(",") if x.strip()):
            try:
                values.append(float(item))
            except ValueError:
                values.append(math.nan)
        found[line[:match.start()].strip() or f"line {len(found) + 1}"] = values
    return found


def imported_modules(source: str) -> set[str]:
    """The top-level packages a cell imports (``import a.b`` and ``from a.b import c`` give ``a``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def kit_imports(source: str) -> set[str]:
    """The kit's modules a cell imports (``from helpers import x``, ``import helpers.x`` give ``x``;
    ``import helpers`` gives ``helpers``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[2] or alias.name for alias in node.names
                      if alias.name.split(".")[0] == "helpers"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "helpers":
                names |= {alias.name for alias in node.names}
            elif node.module.split(".")[0] == "helpers":
                names.add(node.module.partition(".")[2])
    return names


def defined_names(source: str) -> set[str]:
    """Names a cell assigns at top level (``A = ...``, ``A, B = ...``)."""
    names = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    names.add(leaf.id)
    return names


def without_repo(pythonpath: str) -> str:
    """PYTHONPATH less the repository (entries pointing elsewhere, such as carried wheels, stay)."""
    root = nbtool.ROOT.resolve()
    return os.pathsep.join(p for p in pythonpath.split(os.pathsep) if p and Path(p).resolve() != root)


def lesson_script(path: Path, injected: dict[str, str]) -> str:
    """The script of a notebook: the helpers guard, its parameters cell, the injected assignments
    (for the names the parameters cell defines), its lesson cells in order."""
    params = _tagged(path, "parameters")
    assert len(params) == 1, f"{path.name}: expected one parameters cell, found {len(params)}"
    defined = defined_names(params[0])
    assigned = "\n".join(f"{name} = {value!r}" for name, value in injected.items() if name in defined)
    fixes = str(nbtool.ROOT / "helpers" / "deepspeed_fixes.py")
    parts = [GUARD.format(fixes=fixes), params[0], "# Parameters injected by tests/test_lesson_scripts.py\n" + assigned,
             *_tagged(path, "lesson")]
    return "\n\n\n".join(f"# %% [{i}]\n{part}" for i, part in enumerate(parts)) + "\n"


def test_the_lesson_notebooks_have_lesson_cells():
    """Issues 15 and 27: the lesson notebooks mark the code a learner copies with the tag 'lesson'."""
    paths = {p.stem: p for p in nbtool.notebook_paths()}
    missing = [name for name in LESSON_NOTEBOOKS if name not in paths or not _tagged(paths[name], "lesson")]
    assert not missing, f"no cell tagged 'lesson' in: {', '.join(missing)}"


@pytest.mark.parametrize("path", _with_lessons(), ids=lambda p: p.stem)
def test_lesson_cells_import_no_kit_module(path):
    for source in _tagged(path, "parameters") + _tagged(path, "lesson"):
        extra = imported_modules(source) - ALLOWED - set(sys.stdlib_module_names) - {"helpers"}
        extra |= kit_imports(source) - KIT_ALLOWED
        assert not extra, f"{path.name}: a lesson or parameters cell imports {sorted(extra)}:\n{source[:300]}"


@pytest.mark.parametrize("path, extra", _script_runs())
def test_parameters_and_lesson_cells_are_a_script_that_trains(path, extra, tmp_path):
    from helpers import data, models

    # The Hub-name path, offline: the model is laid out as the Hub's cache and named as on the Hub.
    # A notebook that fine-tunes the real model by default gets its real weights and real text so.
    # One whose notebook launches this script with the real model gets a tiny Llama (the real
    # model's architecture, random weights) under the real model's name: what is asked here, a
    # script that runs without the kit, needs no real weights, and the real model's runs take turns.
    real = pretrained_by_default(path)
    if real:
        hub_name = models.REAL_MODEL
        text = data.write_offline_text(tmp_path / "train.txt", 60_000, corpus="real")
        if path.stem in SCRIPT_LAUNCHED_BY_NOTEBOOK:
            model = models.save_offline_model(tmp_path / "model", "llama-tiny")
            # Judged as the real model's script is (the held-out loss falls; batch to batch, the
            # training loss of 8 smoke steps may rise), at a rate a random start learns in 8 steps.
            extra = {**RANDOM_START_RATE, **extra}
        else:
            model = models.offline_real_model()
    else:
        model, hub_name = models.save_offline_model(tmp_path / "model", "tiny"), HUB_NAME
        text = data.write_offline_text(tmp_path / "train.txt", 60_000)
    models.write_hub_cache(model, hub_name, tmp_path / "hub")
    data.write_datasets_cache(text, *HUB_DATASET, cache_dir=tmp_path / "datasets")
    work = tmp_path / "work"
    work.mkdir()
    injected = {"MODEL_NAME": hub_name, "TEXT_FILE": str(text), "WORK_DIR": str(work),
                "OUT_DIR": str(work / "out"), "DATASET": HUB_DATASET}
    injected.update(extra)
    script = tmp_path / f"{path.stem}_lesson.py"
    script.write_text(lesson_script(path, injected))

    env = {k: v for k, v in os.environ.items() if k not in _DIST}
    env["PYTHONPATH"] = without_repo(os.environ.get("PYTHONPATH", ""))
    env.update(KIT_SMOKE="1", HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), TQDM_DISABLE="1",
               MPLBACKEND="agg", HF_DATASETS_CACHE=str(tmp_path / "datasets"))
    try:
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900)
    finally:  # checkpoints of the real model: about 12 GB a run, which pytest would keep
        for written in (work / "out", *work.glob("checkpoint*"), *work.glob("trainer")):
            if written.is_dir() and path.stem not in CONFIG_LESSONS:
                shutil.rmtree(written, ignore_errors=True)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"{script.name} exited {done.returncode}:\n{tail}"
    if path.stem in CONFIG_LESSONS:
        assert_written_configs_pass(work)
        return
    if extra.get("OFFLOAD_PARAMS"):  # the injection took: notebook 06's lesson prints its choice
        assert "weights offloaded too: True" in done.stdout, done.stdout[-2000:]
    if extra.get("FREEZE_EMBEDDING"):  # the lesson froze it, and its sub-groups left it out
        frozen = re.search(r"([\d,]+) embedding elements frozen", done.stdout)
        assert frozen and int(frozen.group(1).replace(",", "")) > 0, done.stdout[-2000:]
        sizes = re.search(r"largest tensor: ([\d.]+)M elements; optimizer sub-groups of ([\d,]+)",
                          done.stdout)
        assert sizes and int(sizes.group(2).replace(",", "")) < float(sizes.group(1)) * 1e6, sizes
    if path.stem.startswith("06_"):
        assert_finetune_lesson_output(done.stdout)
    found = loss_lines(done.stdout)
    assert found, f"{script.name} printed no '<label> losses: [...]' line:\n{done.stdout[-2000:]}"
    if real:  # from a pretrained start the held-out loss carries the learning (claims.py)
        assert_held_out_falls(done.stdout)
    falling = {label: claims.training_loss_claim(label, values, real)[1] for label, values in found.items()}
    assert all(falling.values()), f"a loss did not fall (or was not finite): {found}"


def test_the_notebooks_said_to_launch_their_script_do_so_with_the_real_model():
    """The script tests give a tiny model to the notebooks of SCRIPT_LAUNCHED_BY_NOTEBOOK, trusting
    their own run to launch the script with the real model: each must fine-tune the real model by
    default and write its lesson cells as train.py in a cell of its own (a kit cell), and a
    real-model notebook that launches nothing (09) keeps the real model here."""
    paths = {p.stem: p for p in nbtool.notebook_paths()}
    for stem in REAL_MODEL_NOTEBOOKS:
        cells = json.loads(paths[stem].read_text())["cells"]
        writes = any("write_train_script(" in "".join(c["source"]) for c in cells
                     if c["cell_type"] == "code" and "lesson" not in c.get("metadata", {}).get("tags", []))
        assert pretrained_by_default(paths[stem]), stem
        assert writes == (stem in SCRIPT_LAUNCHED_BY_NOTEBOOK), (stem, writes)


def pretrained_by_default(path: Path) -> bool:
    """Whether a notebook's parameters cell names the real model (helpers.models.REAL_MODEL)."""
    from helpers import models

    return any(f'MODEL_NAME = "{models.REAL_MODEL}"' in source for source in _tagged(path, "parameters"))


def assert_held_out_falls(out: str) -> None:
    """A lesson's ``held-out loss: X before, Y after`` line, with Y below X."""
    held = re.search(r"held-out loss: ([\d.]+) before, ([\d.]+) after", out)
    assert held and float(held.group(2)) < float(held.group(1)), out[-2000:]


def assert_finetune_lesson_output(out: str) -> None:
    """Notebook 06's lesson on its own: the held-out loss fell, the reloaded folder gives the
    trained logits (fp32 on a CPU: within 1e-3), and the reloaded model generated a sample."""
    assert_held_out_falls(out)
    diff = re.search(r"largest logit difference after the reload: (\S+)", out)
    assert diff and float(diff.group(1)) <= 1e-3, out[-2000:]
    sample = re.search(r"^sample: (['\"])(.*)\1$", out, re.M)  # a repr: either quote
    assert sample and sample.group(2).strip(), out[-2000:]


def assert_written_configs_pass(folder: Path) -> None:
    """At least one JSON config in ``folder``, each without an error from helpers.config.check."""
    from helpers import config

    written = sorted(folder.glob("*.json"))
    assert written, f"the lesson wrote no JSON config into {folder}"
    for path in written:
        errors = [p for p in config.check(json.loads(path.read_text())) if p.level == "error"]
        assert not errors, f"{path.name}: {errors}"


# ---- the test's own parsing, fed good and bad output ----------------------------------------------------


def test_loss_lines_are_parsed_and_bad_ones_fail_loss_falls():
    out = ("engine on cpu\nengine losses: [6.02, 5.5, 5.0, 4.6]\naccelerate losses: [6.02, 6.1, 6.3, 6.4]\n"
           "trainer losses: [6.0, nan, 5.0, 4.0]\nresumed at step 7: [5.0, 4.9] | uninterrupted: [5.0, 4.9]\n"
           "losses: []\n")
    found = loss_lines(out)
    assert list(found) == ["engine", "accelerate", "trainer", "line 4"]
    assert claims.loss_falls(found["engine"])
    assert not claims.loss_falls(found["accelerate"])
    assert not claims.loss_falls(found["trainer"])
    assert not claims.loss_falls(found["line 4"])


def test_the_finetune_lessons_output_is_held_to_its_claims():
    good = ("held-out loss: 5.1234 before, 4.2000 after\n"
            "largest logit difference after the reload: 0.00e+00\nsample: 'the cat sat'\n")
    assert_finetune_lesson_output(good)
    assert_finetune_lesson_output(good.replace("'the cat sat'", '"the cat\'s hat"'))
    for bad in (good.replace("4.2000 after", "5.5000 after"),
                good.replace("0.00e+00", "2.00e-01"), good.replace("'the cat sat'", "''"),
                good.replace("'the cat sat'", '"  "'),
                good.split("\n", 1)[1]):
        with pytest.raises(AssertionError):
            assert_finetune_lesson_output(bad)


def test_the_repository_leaves_pythonpath_and_nothing_else_does():
    root = str(nbtool.ROOT)
    assert without_repo(os.pathsep.join(["/tmp/site", root, root + "/", ""])) == "/tmp/site"
    assert without_repo("") == ""


def test_imports_and_definitions_are_read_from_source():
    source = "import os, json\nfrom torch.utils.data import DataLoader\nfrom helpers import env\nA, B = 1, 2\nC: int = 3\n"
    assert imported_modules(source) == {"os", "json", "torch", "helpers"}
    assert defined_names(source) == {"A", "B", "C"}
    assert kit_imports(source) == {"env"}
    assert kit_imports("import helpers.config\nfrom helpers.lessons import x\nimport helpers") == {
        "config", "lessons", "helpers"}
    assert kit_imports("from helpers import deepspeed_fixes\nimport torch") <= KIT_ALLOWED


def test_the_script_blocks_the_kit_and_injects_only_defined_names(tmp_path):
    path = nbtool.NOTEBOOKS / "07_engine_and_accelerate.ipynb"
    script = lesson_script(path, {"MODEL_NAME": "/m", "OUT_DIR": "/o", "WORK_DIR": "/w"})
    assert script.index('sys.modules["helpers"] = _kit') < script.index("# %% [1]")  # before the cells
    assert "MODEL_NAME = '/m'" in script and "WORK_DIR = '/w'" in script
    assert "OUT_DIR = '/o'" not in script  # notebook 07's parameters cell has no OUT_DIR
    assert script.index("MODEL_NAME = '/m'") > script.index("MODEL_NAME = ")  # after the cell's own
    guard = GUARD.format(fixes=str(nbtool.ROOT / "helpers" / "deepspeed_fixes.py"))
    fixes = subprocess.run([sys.executable, "-c", guard + "\nfrom helpers import deepspeed_fixes\n"
                            "print(deepspeed_fixes.__file__)"], capture_output=True, text=True,
                           cwd=tmp_path)
    assert fixes.returncode == 0 and "deepspeed_fixes.py" in fixes.stdout, fixes.stderr[-2000:]
    for other in ("from helpers import config", "import helpers.models", "from helpers.lessons import x"):
        done = subprocess.run([sys.executable, "-c", guard + "\n" + other], capture_output=True,
                              text=True, cwd=tmp_path)
        assert done.returncode != 0 and "Error" in done.stderr, (other, done.stderr[-500:])
