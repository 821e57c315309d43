"""Every notebook keeps the rules nbval needs; the checker itself catches each broken rule."""

import copy
import json
import re

import pytest

from tools import nbtool

NOTEBOOKS = nbtool.notebook_paths()


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:1] == ["01_gpu_check_and_install.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_clean(path):
    assert nbtool.problems(path) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_has_a_checked_summary_last(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert nbtool.is_checked(cells[-1])


#: The most words a markdown paragraph may hold, so that a learner reads it in one go.
MAX_PARAGRAPH_WORDS = 120


def _long_paragraphs(text):
    """Word counts of the paragraphs (blocks between blank lines) over MAX_PARAGRAPH_WORDS;
    a bullet list with no blank line between its items is one paragraph."""
    counts = [len(paragraph.split()) for paragraph in re.split(r"\n\s*\n", text)]
    return [n for n in counts if n > MAX_PARAGRAPH_WORDS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_markdown_paragraph_reads_in_one_go(path):
    cells = json.loads(path.read_text())["cells"]
    found = [f"{path.name} cell {i}: a paragraph of {n} words"
             for i, cell in enumerate(cells) if cell["cell_type"] == "markdown"
             for n in _long_paragraphs(nbtool.source(cell))]
    assert found == [], ("split at sentence boundaries, or into a bulleted list, to at most "
                         f"{MAX_PARAGRAPH_WORDS} words a paragraph")


def test_the_paragraph_counter_catches_one_word_too_many():
    fits = " ".join(["word"] * MAX_PARAGRAPH_WORDS)
    too_long = " ".join(["word"] * 60) + "\n" + " ".join(["word"] * 61)  # one paragraph, two lines
    assert _long_paragraphs(f"## Title\n\n{fits}\n\n- a bullet") == []
    assert _long_paragraphs(f"## Title\n\n{fits}\n \n{too_long}\n\n- a bullet") == [121]


def _broken(tmp_path, change):
    src = nbtool.NOTEBOOKS / "01_gpu_check_and_install.ipynb"
    nb = json.loads(src.read_text())
    change(nb["cells"], nb)
    path = nbtool.NOTEBOOKS / "zz_hygiene_probe.ipynb"  # must sit in notebooks/ for the badge rule
    path.write_text(json.dumps(nb))
    try:
        return " | ".join(nbtool.problems(path))
    finally:
        path.unlink()


def _code(cells, checked):
    return next(c for c in cells if c["cell_type"] == "code" and nbtool.is_checked(c) == checked
                and not nbtool.source(c).startswith("# Setup"))


BREAKAGES = {
    "output with no count": (lambda cells, nb: _code(cells, True).update(execution_count=None),
                             "no execution count"),
    "checked cell without output": (lambda cells, nb: _code(cells, True).update(outputs=[]),
                                    "checks nothing"),
    "output on an unchecked cell": (lambda cells, nb: _code(cells, False).update(
        outputs=[{"output_type": "stream", "name": "stdout", "text": "x"}], execution_count=1),
        "outputs stored on an unchecked cell"),
    "misspelled marker": (lambda cells, nb: _code(cells, False).update(source="# NBVAL_CHECK_OUPUT\nx = 1"),
                          "not one nbval knows"),
    "marker not alone": (lambda cells, nb: _code(cells, False).update(source="#NBVAL_SKIP\nx = 1"),
                         "alone on its line"),
    "wrong kernel": (lambda cells, nb: nb["metadata"]["kernelspec"].update(name="python2"),
                     "kernelspec is 'python2'"),
    "badge of another notebook": (lambda cells, nb: None, "lacks the Colab badge for its own path"),
    "edited setup cell": (lambda cells, nb: next(c for c in cells if nbtool.source(c).startswith("# Setup"))
                          .update(source=nbtool.colab.setup_cell_source() + "\nx = 1"), "differs from helpers/colab.py"),
    "a code line over 100 characters": (lambda cells, nb: _code(cells, False).update(source="x = " + "1" * 100),
                                        "over 100 characters"),
    "widget state in the metadata": (lambda cells, nb: nb["metadata"].update(widgets={"state": {}}),
                                     "widget state stored"),
    "no parameters cell": (lambda cells, nb: [c["metadata"].pop("tags", None) for c in cells], "tagged 'parameters'"),
}


@pytest.mark.parametrize("name", BREAKAGES)
def test_checker_catches(name, tmp_path):
    change, message = BREAKAGES[name]
    assert message in _broken(tmp_path, change)


def test_clear_keeps_only_checked_outputs():
    nb = json.loads((nbtool.NOTEBOOKS / "01_gpu_check_and_install.ipynb").read_text())
    dirty = copy.deepcopy(nb)
    for cell in dirty["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"].append({"output_type": "stream", "name": "stderr", "text": "noise"})
            cell["execution_count"] = cell["execution_count"] or 3
    cleaned = nbtool.clear(dirty)
    for before, after in zip(nb["cells"], cleaned["cells"]):
        if after["cell_type"] == "code":
            assert after["outputs"] == before["outputs"]
            assert (after["execution_count"] is None) != nbtool.is_checked(after)


def test_notebooks_call_only_public_helper_names():
    """A notebook is a user's view of the kit: it calls what the helpers offer, never ``_private``."""
    import re

    import helpers

    modules = {name for layer in helpers.LAYERS for name in layer}
    aliases = modules | {"kit_env", "kit_config", "kit_claims"}
    found = []
    for path in sorted(nbtool.NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                found += [f"{path.name}: {m.group(0)}" for m in re.finditer(r"\b(\w+)\._\w+", nbtool.source(cell))
                          if m.group(1) in aliases]
    assert found == []


def test_the_real_model_runs_are_the_heavy_notebooks_and_their_scripts():
    from pathlib import Path

    import conftest

    nb = Path("notebooks")
    assert conftest.real_model_run(nb / "04_zero2_training.ipynb", "x::Cell 3")
    assert conftest.real_model_run(nb / "09_zero_or_lora.ipynb", "x::Cell 0")
    assert not conftest.real_model_run(nb / "05_stages_and_offload.ipynb", "x::Cell 0")
    scripts = Path("tests/test_lesson_scripts.py")
    assert conftest.real_model_run(scripts, "t::test_parameters_and_lesson_cells_are_a_script_that_trains"
                                            "[09_zero_or_lora]")
    # the scripts of 04 and 07 run a tiny model: their notebooks launch them with the real one
    assert not conftest.real_model_run(scripts, "t::test_parameters_and_lesson_cells_are_a_script_that_trains"
                                                "[07_engine_and_accelerate-stage3]")
    assert not conftest.real_model_run(scripts, "t::test_parameters_and_lesson_cells_are_a_script_that_trains"
                                                "[05_stages_and_offload]")
