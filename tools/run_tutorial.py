"""Run the whole tutorial headless: every notebook in order, executed copies kept under build/.

    python tools/run_tutorial.py [--out build/tutorial] [--timeout 3600] [--jobs N] [NOTEBOOK ...]

Each notebook runs in a fresh kernel started in notebooks/ (as Jupyter would), in smoke mode on a
machine without a GPU and in full mode on one (``KIT_EMULATE=t4`` to emulate a Colab T4). The
executed copy, plots included, is written to ``OUT/NAME.ipynb`` and as HTML beside it; one line
per notebook says passed or failed and how long it took. Exits 1 if any notebook failed.

Without a GPU, two notebooks run side by side (``--jobs``; the machines have 2 cores), the
slowest of the last run first (``OUT/timings.json``); with one, one at a time, so that each
notebook's measurements have the GPU to themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.nbtool import notebook_paths  # noqa: E402


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stdout")


def compare_checked(original, executed) -> str:
    """nbval --nbval-lax's comparison: the stdout of each '# NBVAL_CHECK_OUTPUT' cell must match."""
    from tools.nbtool import is_checked

    for i, (before, after) in enumerate(zip(original.cells, executed.cells)):
        if is_checked(before) and _stdout(before) != _stdout(after):
            return f"cell {i} output differs from the stored one: {_stdout(after)!r}"
    return ""


def kernel_environment(path: Path, real_model_threads: int | None = None) -> dict[str, str]:
    """This process's environment for ``path``'s kernel, with an NVMe offload folder of its own:
    DeepSpeed names its swap files by rank and tensor, not by run, so two notebooks side by side
    in one folder would read or delete each other's (notebook 06 clears its folder when done).
    A real-model notebook's kernel (and the runs it starts, but not its launched ranks: one thread
    each) gets ``real_model_threads`` OpenMP threads, where given."""
    from helpers import env

    out = {**os.environ, "KIT_OFFLOAD_DIR": str(env.default_offload_dir() / path.stem)}
    if real_model_threads and path.stem in REAL_MODEL_NOTEBOOKS:
        out["OMP_NUM_THREADS"] = str(real_model_threads)
    return out


def run_one(path: Path, out_dir: Path, timeout: int, check: bool = False,
            real_model_threads: int | None = None) -> tuple[bool, float, str]:
    """Execute one notebook; write its executed copy (and HTML) to out_dir. Returns (ok, seconds, error)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    original = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start, error = time.perf_counter(), ""
    try:
        client.execute(env=kernel_environment(path, real_model_threads))
    except CellExecutionError as err:
        error = f"{err.ename}: {err.evalue}" if getattr(err, "ename", None) else "a cell failed"
    except Exception as err:  # a dead kernel, a timeout: still keep what ran
        error = f"{type(err).__name__}: {err}"
    seconds = time.perf_counter() - start
    if check and not error:
        error = compare_checked(original, nb)
    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / path.name)
    try:
        from nbconvert import HTMLExporter

        html, _ = HTMLExporter().from_notebook_node(nb)
        (out_dir / path.with_suffix(".html").name).write_text(html)
    except Exception:  # HTML is a convenience; the .ipynb copy is what counts
        pass
    return not error, seconds, error


def left_out() -> list[str]:
    """What this machine cannot run, each with the command that fixes it (printed after the run)."""
    from helpers import env

    if env.libaio_available():
        return []
    return [f"NVMe offload (ZeRO-Infinity): libaio-dev is missing, so notebooks 05 and 06 report "
            f"their NVMe rows as not run. To run them: sudo {env.LIBAIO_APT}"]


#: Notebooks that fine-tune the real 135M model with several processes at once (two launched ranks
#: beside the kernel: about 18 GB of RAM at their peak on a CPU), and their lesson scripts: they take
#: turns under one lock file, here and in the tests (conftest.py), so that two never add up on a
#: machine of 24 GB (side by side, 04's and 07's launches had the kernel killed for memory).
REAL_MODEL_NOTEBOOKS = ("04_zero2_training", "07_engine_and_accelerate", "09_zero_or_lora")
REAL_MODEL_LOCK = os.path.join(tempfile.gettempdir(), "zero-kit-real-model.lock")


@contextlib.contextmanager
def real_model_turn(stem: str, lock_path: str = REAL_MODEL_LOCK):
    """Hold the lock at ``lock_path`` while notebook ``stem`` runs, if it is a real-model one."""
    if stem not in REAL_MODEL_NOTEBOOKS:
        yield
        return
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits while another runs one
        yield


def default_jobs() -> int:
    """Notebooks side by side: one with a GPU (its measurements need the GPU to themselves),
    else one per core, at most two (each notebook's own runs use two processes at times)."""
    import torch

    return 1 if torch.cuda.is_available() else max(1, min(2, os.cpu_count() or 1))


def real_model_threads(jobs: int, others_left: int, user_threads: bool) -> int | None:
    """OpenMP threads for a real-model notebook's kernel that starts while ``jobs`` notebooks run
    side by side and ``others_left`` notebooks that are not real-model ones have yet to finish:
    every core once those are done (the real-model notebooks run one after another, the long
    chain: on 2 cores notebook 09 ran last and alone at one thread, the other core idle); None
    (the share every kernel has) while any is left: a kernel of two threads beside another busy
    process waits for its descheduled thread at every parallel step (04's training cell took
    181 s so, against 56 s at one thread with twice the tokens a step). None also when the user
    set OMP_NUM_THREADS (``user_threads``), or one notebook runs at a time (OpenMP's default)."""
    if jobs < 2 or others_left > 0 or user_threads:
        return None
    return os.cpu_count() or 1


def slowest_first(paths: list[Path], timings: dict[str, float]) -> list[Path]:
    """The notebooks ordered by their last run's time, longest first (unknown ones first, in
    order): two workers then finish close together."""
    return sorted(paths, key=lambda p: -timings.get(p.stem, float("inf")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*")
    parser.add_argument("--out", default=str(ROOT / "build" / "tutorial"))
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    parser.add_argument("--check", action="store_true",
                        help="also compare '# NBVAL_CHECK_OUTPUT' cells with their stored output, as nbval does")
    parser.add_argument("--jobs", type=int, default=None,
                        help="notebooks run side by side (default: 2 without a GPU, 1 with one)")
    args = parser.parse_args(argv)
    import helpers  # sets TORCH_EXTENSIONS_DIR: the kit's ops, compiled once per machine

    out = Path(args.out)
    timings_file = out / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
    paths = notebook_paths(args.notebooks)
    jobs = args.jobs or default_jobs()
    user_threads = "OMP_NUM_THREADS" in os.environ
    helpers.share_threads(jobs)  # the notebooks share the cores
    started = time.perf_counter()
    others = {p.stem for p in paths if p.stem not in REAL_MODEL_NOTEBOOKS}  # not yet finished
    others_lock = threading.Lock()

    def run(path: Path) -> tuple[Path, bool, float, str]:
        with real_model_turn(path.stem):
            with others_lock:
                threads = real_model_threads(jobs, len(others), user_threads)
            result = run_one(path, out, args.timeout, args.check, threads)
        with others_lock:
            others.discard(path.stem)
        return (path, *result)

    failed = 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = [pool.submit(run, path) for path in slowest_first(paths, timings)]
        for done in as_completed(runs):
            path, ok, seconds, error = done.result()
            failed += not ok
            timings[path.stem] = round(seconds, 1)
            status = "passed" if ok else f"FAILED: {error}"
            print(f"{path.stem:32s} {status:8s} {seconds:7.1f} s", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    timings_file.write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n")
    print(f"{len(paths)} notebooks, {jobs} at a time: {time.perf_counter() - started:.0f} s")
    print(f"executed copies in {args.out}")
    for line in left_out():
        print(f"left out: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
