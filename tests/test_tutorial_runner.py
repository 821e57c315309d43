"""tools/run_tutorial.py: executes notebooks, keeps executed copies, reports pass and fail."""

import nbformat

from tools import run_tutorial


def _notebook(path, code):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in code]
    nbformat.write(nb, path)
    return path


def test_runner_keeps_outputs_and_reports(tmp_path, capsys):
    good = _notebook(tmp_path / "a_good.ipynb", ["print(6 * 7)"])
    bad = _notebook(tmp_path / "b_bad.ipynb", ["raise ValueError('broken on purpose')", "print('after')"])
    out = tmp_path / "build"
    assert run_tutorial.main([str(good), str(bad), "--out", str(out), "--timeout", "120"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["a_good", "passed"]
    assert lines[1].split()[:2] == ["b_bad", "FAILED:"] and "broken on purpose" in lines[1]
    executed = nbformat.read(out / "a_good.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "42\n"
    assert (out / "a_good.html").exists()
