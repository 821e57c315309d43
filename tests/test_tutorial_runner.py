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
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["a_good"].split()[1] == "passed"
    assert lines["b_bad"].split()[1] == "FAILED:" and "broken on purpose" in lines["b_bad"]
    executed = nbformat.read(out / "a_good.ipynb", as_version=4)
    assert executed.cells[0].outputs[0]["text"] == "42\n"
    assert (out / "a_good.html").exists()


def test_two_notebooks_run_side_by_side_and_the_slowest_of_the_last_run_goes_first(tmp_path, capsys):
    """Each notebook writes when it ran; with --jobs 2 the two spans overlap. The timings kept
    from this run put the slower notebook first next time."""
    code = ("import json, time; start = time.time(); time.sleep({s}); "
            "open({log!r}, 'a').write(json.dumps([{name!r}, start, time.time()]) + '\\n')")
    log = tmp_path / "spans.jsonl"
    paths = [_notebook(tmp_path / f"{name}.ipynb", [code.format(s=s, log=str(log), name=name)])
             for name, s in (("a_quick", 2), ("b_slow", 4))]
    out = tmp_path / "build"
    assert run_tutorial.main([*map(str, paths), "--out", str(out), "--jobs", "2"]) == 0
    import json

    spans = {name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())}
    (a_start, a_end), (b_start, b_end) = spans["a_quick"], spans["b_slow"]
    assert a_start < b_end and b_start < a_end, spans  # they overlapped
    assert "2 notebooks, 2 at a time" in capsys.readouterr().out
    timings = json.loads((out / "timings.json").read_text())
    # each notebook's time holds its own sleep (and its kernel's start, which varies by seconds on
    # a busy machine: which of the two was slower this time is not the point)
    assert timings["b_slow"] >= 4 and timings["a_quick"] >= 2, timings
    slower = max(timings, key=timings.get)
    assert run_tutorial.slowest_first(paths, timings)[0].stem == slower
    order = lambda t: [p.stem for p in run_tutorial.slowest_first(paths, t)]
    assert order({"a_quick": 9.0, "b_slow": 5.0}) == ["a_quick", "b_slow"]
    assert order({"a_quick": 1.0, "b_slow": 5.0}) == ["b_slow", "a_quick"]
    assert [p.stem for p in run_tutorial.slowest_first(paths, {"a_quick": 1.0})] == ["b_slow", "a_quick"]


def test_real_model_notebooks_take_turns_and_others_do_not_wait(tmp_path):
    """On a lock of its own: the shared one is held by whichever worker runs a real-model notebook
    at the time (CI once failed this test on it)."""
    import fcntl

    import pytest

    from tools import run_tutorial

    lock = str(tmp_path / "real-model.lock")
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with run_tutorial.real_model_turn("05_stages_and_offload", lock):  # not real-model: no wait
            pass
    with run_tutorial.real_model_turn("04_zero2_training", lock):  # holds the lock while it runs
        with open(lock, "w") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_real_model_runs_go_to_one_worker_and_the_rest_by_module_or_notebook(
        request, monkeypatch):
    """conftest.py: under ``--dist loadscope`` one worker takes every real-model notebook and lesson
    script as one unit (they never overlap, so nobody waits on the lock), the other the rest; a
    notebook's cells stay together (one kernel), as do a test module's tests (their fixtures)."""
    import tomllib
    from pathlib import Path

    import conftest

    # the scheduler as xdist's controller makes it (no workers here: its setup skipped)
    monkeypatch.setattr(conftest.RealModelRunsOnOneWorker, "__init__", lambda self, *a: None)
    monkeypatch.setattr(request.config.option, "dist", "loadscope")
    scheduler = conftest.pytest_xdist_make_scheduler(request.config, None)
    assert isinstance(scheduler, conftest.RealModelRunsOnOneWorker)
    unit = scheduler._split_scope
    script = "tests/test_lesson_scripts.py::test_parameters_and_lesson_cells_are_a_script_that_trains"
    real = {unit("notebooks/04_zero2_training.ipynb::Cell 3"),
            unit("notebooks/09_zero_or_lora.ipynb::Cell 0"),
            unit(f"{script}[09_zero_or_lora]")}
    assert real == {conftest.REAL_MODEL_GROUP}
    # 07's script test runs a tiny model (07's own run launches the script with the real one)
    assert unit(f"{script}[07_engine_and_accelerate-stage3]") == "tests/test_lesson_scripts.py"
    assert unit("notebooks/05_stages_and_offload.ipynb::Cell 7") == \
        "notebooks/05_stages_and_offload.ipynb"
    assert unit(f"{script}[05_stages_and_offload]") == "tests/test_lesson_scripts.py"
    options = tomllib.loads((Path(conftest.__file__).parent / "pyproject.toml").read_text())
    assert "--dist loadscope" in options["tool"]["pytest"]["ini_options"]["addopts"]


def test_each_notebooks_kernel_gets_an_nvme_folder_of_its_own(tmp_path, monkeypatch):
    """Two notebooks side by side must not share DeepSpeed's swap files (named by rank and tensor,
    not by run): each kernel's KIT_OFFLOAD_DIR is its own folder under the kit's offload folder."""
    monkeypatch.setenv("KIT_OFFLOAD_DIR", str(tmp_path / "offload"))
    code = "import os; print(os.environ['KIT_OFFLOAD_DIR'])"
    paths = [_notebook(tmp_path / f"{name}.ipynb", [code]) for name in ("a_one", "b_two")]
    out = tmp_path / "build"
    assert run_tutorial.main([*map(str, paths), "--out", str(out), "--jobs", "2"]) == 0
    seen = {p.stem: nbformat.read(out / p.name, as_version=4).cells[0].outputs[0]["text"].strip()
            for p in paths}
    assert seen == {"a_one": str(tmp_path / "offload" / "a_one"),
                    "b_two": str(tmp_path / "offload" / "b_two")}


def test_this_pytest_process_has_an_nvme_folder_of_its_own():
    """conftest.py: each pytest process (each xdist worker, which inherits the controller's
    environment) its own offload folder, under the one named before the run or the temp disk."""
    import os

    import conftest

    assert os.environ["KIT_OFFLOAD_DIR"] == conftest._OFFLOAD_DIR == os.path.join(
        os.environ["ZERO_KIT_OFFLOAD_BASE"], f"zero_kit_offload_{os.getpid()}")


def test_the_real_model_chain_gets_every_core_once_the_other_notebooks_are_done(monkeypatch):
    """Side by side, a real-model notebook (they run one after another, the long chain) gets every
    core as OpenMP threads once no other notebook is left, and the share every kernel has before
    (two threads beside a busy process only wait); what the user set stays; one notebook at a time
    leaves OpenMP its default. (The kernels' environments, without starting kernels: a notebook of
    a real-model name would wait on the shared lock behind a real run.)"""
    import os
    from pathlib import Path

    import helpers

    cores = os.cpu_count() or 1
    chain, other = Path("notebooks/04_zero2_training.ipynb"), Path("notebooks/a_other.ipynb")

    def threads(jobs: int, others_left: int) -> tuple[str | None, str | None]:
        user_threads = "OMP_NUM_THREADS" in os.environ  # as main() asks, before sharing
        helpers.share_threads(jobs)
        chain_threads = run_tutorial.real_model_threads(jobs, others_left, user_threads)
        return tuple(run_tutorial.kernel_environment(p, chain_threads).get("OMP_NUM_THREADS")
                     for p in (chain, other))

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    share = str(max(1, cores // 2))
    assert threads(2, others_left=1) == (share, share)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads(2, others_left=0) == (str(cores), share)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads(1, others_left=0) == (None, None)  # OpenMP's own default: every core
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads(2, others_left=0) == ("3", "3")


def test_a_real_model_notebook_that_starts_after_the_others_are_done_gets_every_core(
        tmp_path, monkeypatch):
    """Through main(): 04 starts beside a running notebook (its share of the cores); 09 waits for
    04's turn, by when the other is done (every core). A lock of its own (no wait on real runs)."""
    import os

    turn = run_tutorial.real_model_turn
    monkeypatch.setattr(run_tutorial, "real_model_turn",
                        lambda stem: turn(stem, lock_path=str(tmp_path / "lock")))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    code = "import os, time; time.sleep({s}); print(os.environ.get('OMP_NUM_THREADS'))"
    paths = [_notebook(tmp_path / f"{name}.ipynb", [code.format(s=s)])
             for name, s in (("04_zero2_training", 6), ("09_zero_or_lora", 0), ("a_other", 1))]
    out = tmp_path / "build"
    out.mkdir()
    (out / "timings.json").write_text('{"04_zero2_training": 3, "a_other": 2, '
                                      '"09_zero_or_lora": 1}')  # this order
    assert run_tutorial.main([*map(str, paths), "--out", str(out), "--jobs", "2"]) == 0
    seen = {p.stem: nbformat.read(out / p.name, as_version=4).cells[0].outputs[0]["text"].strip()
            for p in paths}
    cores = os.cpu_count() or 1
    share = str(max(1, cores // 2))
    assert seen == {"04_zero2_training": share, "a_other": share, "09_zero_or_lora": str(cores)}
