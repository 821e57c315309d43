"""train.py: a notebook's lesson cells as the script a launcher starts (notebooks 04, 07, 08).

Outside a notebook the lesson runs as a script under a launcher, one process per GPU (or per CPU
rank). :func:`write_train_script` exports a notebook's parameters cell and its ``lesson`` cells, in
order, with the values the notebook resolved (the offline model, the text, the precision, its
folder) assigned after the parameters; :func:`launch_commands` starts it with the deepspeed launcher
and with ``accelerate launch`` and an Accelerate YAML config, :func:`torchrun_command` with
``torchrun`` (the notebook runs them with ``!``:
helpers start no training run but helpers.runner's); :func:`launched` reads what a run printed, and
:func:`launch_claims` compares it with the notebook's own run by the lesson's rule.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from helpers import claims
from helpers.show import Table

#: The folder that holds ``helpers/``. A script a lesson exports may import
#: ``helpers.deepspeed_fixes`` (notebook 07's ZeRO-3 cell does) and runs in its own folder,
#: where a kit that is not pip-installed (a clone, as in the kit's tests) is not on the path.
KIT_ROOT = Path(__file__).resolve().parents[1]

#: tcmalloc, Google's memory allocator (Debian and Ubuntu: ``apt-get install libtcmalloc-minimal4``;
#: tools/system_packages.sh installs it). glibc's malloc hands a training step's large tensors back
#: to the kernel and faults them in again at the next step: a third of a CPU rank's time went to
#: the kernel. Preloaded into CPU ranks, it keeps them: a launch of notebook 04's train.py on two
#: CPU ranks took 152 s instead of 196 s, with the same losses.
TCMALLOC = "tcmalloc_minimal"


def cpu_rank_preload(library: str = TCMALLOC, cuda: bool | None = None) -> str:
    """``LD_PRELOAD=lib<library>.so.N`` (and a space) for ranks that run on the CPU, where the
    system has ``library`` (``ldconfig``'s list); "" where there is a GPU (``cuda``: None asks
    torch; ranks that drive a GPU keep glibc's allocator), where the user preloads something
    already (it stays as it is) or where there is no such library (the ranks run as before, only
    slower)."""
    from ctypes.util import find_library

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    found = None if cuda or os.environ.get("LD_PRELOAD") else find_library(library)
    return f"LD_PRELOAD={shlex.quote(found)} " if found else ""


@functools.cache
def notebook_launch_env() -> str:
    """:data:`NOTEBOOK_LAUNCH_ENV`, worked out once, on first use (it asks torch about a GPU)."""
    return ("env -u MASTER_ADDR -u MASTER_PORT -u RANK -u LOCAL_RANK -u WORLD_SIZE "
            "TQDM_DISABLE=1 OMP_NUM_THREADS=1 " + cpu_rank_preload() + "PYTHONPATH="
            + shlex.quote(os.pathsep.join(
                [str(KIT_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])))


#: NOTEBOOK_LAUNCH_ENV, the prefix of a launch from inside the notebook: the notebook's own
#: one-process group variables (set by the lesson) must not reach the launcher, which sets its
#: own; ranks share the cores; CPU ranks allocate with tcmalloc where installed; the ranks import
#: the same ``helpers`` as this kernel. Worked out on first use (:func:`notebook_launch_env`), so
#: that importing this module imports no torch.
def __getattr__(name: str) -> str:
    if name == "NOTEBOOK_LAUNCH_ENV":
        return notebook_launch_env()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tagged_cells(notebook: Path, tag: str) -> list[str]:
    """The source of every code cell of ``notebook`` tagged ``tag``, in order."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    return ["".join(c["source"]) for c in cells
            if c["cell_type"] == "code" and tag in c.get("metadata", {}).get("tags", [])]


#: How alike (difflib's ratio, 0 to 1) a cell the kernel ran must be to a lesson cell to count as
#: that cell, edited: a few changed lines keep a cell near 0.9; another lesson cell is far below.
EDITED_MIN_RATIO = 0.6


def kernel_history() -> list[str]:
    """The sources this IPython kernel ran, oldest first (``In``); [] outside a kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return []
    shell = get_ipython()
    return [] if shell is None else [s for s in shell.user_ns.get("In", [])[1:] if s.strip()]


def as_last_run(cells: Sequence[str], history: Sequence[str],
                others: Sequence[str] = ()) -> list[str]:
    """Each of ``cells`` as the kernel last ran it: the latest source in ``history`` that is more
    like this cell than like any other of ``cells`` and ``others`` (the notebook's other code
    cells: a cell that copies a lesson with a change of its own stays itself) and at least
    :data:`EDITED_MIN_RATIO` alike; the cell's own source where the kernel ran none of it. So a
    learner's edits reach train.py, even on Colab, where the notebook file beside the kit is not
    the one being edited. A run with IPython magics (``%time``, ``!ls``: ``get_ipython()`` calls
    in ``In``) counts for no cell, since a launched script has no IPython."""
    out, pool = list(cells), [*cells, *others]
    taken = [False] * len(cells)
    for ran in reversed(history):  # the latest run of each cell wins
        if "get_ipython()" in ran:  # a magic (% or !), as In holds it: no script can run it
            continue
        ratios = [_likeness(cell, ran) for cell in pool]
        best = max(range(len(pool)), key=ratios.__getitem__, default=None)
        if (best is not None and best < len(cells) and not taken[best]
                and ratios[best] >= EDITED_MIN_RATIO):
            out[best], taken[best] = ran.rstrip("\n"), True
    return out


def _likeness(cell: str, ran: str) -> float:
    """How alike two sources are, 0 to 1: difflib's ratio over their lines (fast; one line
    changed in ten keeps 0.9), or over their characters where both are short (a two-line cell
    with one line changed keeps more than half of its characters, not of its lines)."""
    from difflib import SequenceMatcher

    lines = SequenceMatcher(None, cell.splitlines(), ran.splitlines(), autojunk=False).ratio()
    if lines >= EDITED_MIN_RATIO or max(len(cell), len(ran)) > 600:
        return lines
    return SequenceMatcher(None, cell, ran, autojunk=False).ratio()


def _untagged_code(notebook: Path) -> list[str]:
    """The source of every code cell of ``notebook`` tagged neither lesson nor parameters."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"
            and not {"lesson", "parameters"} & set(c.get("metadata", {}).get("tags", []))]


def lesson_script(notebook: Path, values: Mapping[str, object],
                  history: Sequence[str] = ()) -> str:
    """The parameters cell, then ``NAME = value`` for each of ``values`` (after it, as papermill
    injects parameters), then the lesson cells, in order (as the kernel last ran them, where
    ``history`` holds its sources: :func:`as_last_run`): the notebook's lesson as one script."""
    params = tagged_cells(notebook, "parameters")
    if len(params) != 1:
        raise ValueError(f"{Path(notebook).name}: expected one parameters cell, "
                         f"found {len(params)}")
    assigned = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    parts = [params[0], "# The values the notebook resolved\n" + assigned,
             *as_last_run(tagged_cells(notebook, "lesson"), history, _untagged_code(notebook))]
    return "\n\n\n".join(f"# %% [{i}]\n{part}" for i, part in enumerate(parts)) + "\n"


def write_train_script(folder: str | os.PathLike, values: Mapping[str, object],
                       notebook: Path, history: Sequence[str] | None = None) -> Path:
    """``folder``/train.py: :func:`lesson_script` of ``notebook``, its lesson cells as last run
    (``history``: None for this kernel's, :func:`kernel_history`; none outside a kernel)."""
    path = Path(folder) / "train.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    history = kernel_history() if history is None else history
    path.write_text(lesson_script(notebook, values, history))
    return path


def accelerate_yaml(num_processes: int, use_cpu: bool) -> str:
    """An Accelerate config for ``accelerate launch``: DeepSpeed, one machine, ``num_processes``
    processes. The script brings its own DeepSpeed config (``DeepSpeedPlugin(hf_ds_config=...)``
    or ``TrainingArguments(deepspeed=...)``), so the YAML names no ZeRO stage and no mixed
    precision: Accelerate refuses a config file beside either ("the following accelerate config
    variables will be ignored")."""
    return "\n".join([
        "compute_environment: LOCAL_MACHINE",
        "distributed_type: DEEPSPEED",
        "deepspeed_config:",
        "  deepspeed_multinode_launcher: standard",
        "  zero3_init_flag: false",
        "machine_rank: 0",
        "num_machines: 1",
        f"num_processes: {num_processes}",
        f"use_cpu: {'true' if use_cpu else 'false'}",
    ]) + "\n"


def launch_commands(script: Path, yaml_file: Path, num_processes: int,
                    ports: tuple[int, int]) -> dict[str, str]:
    """The two command lines that start ``script``, as you would type them: the deepspeed launcher
    (``--num_gpus``: the processes on this machine, GPUs or CPU ranks) and ``accelerate launch``
    with the YAML."""
    return {
        "deepspeed": shlex.join([command_path("deepspeed"), "--num_gpus", str(num_processes),
                                 "--master_port", str(ports[0]), str(script)]),
        "accelerate launch": shlex.join([command_path("accelerate"), "launch", "--config_file",
                                         str(yaml_file), "--main_process_port", str(ports[1]),
                                         str(script)]),
    }


def torchrun_command(script: Path, num_processes: int, port: int) -> str:
    """``torchrun`` starting ``script`` in ``num_processes`` processes on this machine, as you would
    type it (what ``deepspeed --num_gpus N script`` does): one per GPU, or CPU ranks over gloo."""
    return shlex.join([command_path("torchrun"), "--nproc-per-node", str(num_processes),
                       "--master-port", str(port), str(script)])


def parameter_values(notebook: Path, namespace: Mapping[str, object]) -> dict[str, object]:
    """Each name the parameters cell of ``notebook`` assigns, with its value in ``namespace`` (a
    kernel's globals), where that value is a literal (numbers, strings, None, tuples and lists of
    them): what the notebook runs with, to write after the parameters cell of its script."""
    import ast

    params = tagged_cells(notebook, "parameters")
    names = [target.id for cell in params for node in ast.parse(cell).body
             if isinstance(node, ast.Assign) for t in node.targets for target in ast.walk(t)
             if isinstance(target, ast.Name)]
    out = {}
    for name in dict.fromkeys(names):
        if name in namespace:
            try:
                if ast.literal_eval(repr(namespace[name])) == namespace[name]:
                    out[name] = namespace[name]
            except (ValueError, SyntaxError):
                pass
    return out


def command_path(name: str) -> str:
    """A console script of this Python's packages: beside the interpreter (a virtual environment),
    else on PATH (Colab puts pip's scripts in /usr/local/bin, not beside /usr/bin/python3), else
    the bare name."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name) or name


def free_ports(count: int = 2) -> tuple[int, ...]:
    """Ports the OS says are free now (each launcher's rendezvous needs its own)."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("", 0))
        return tuple(sock.getsockname()[1] for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Launched:
    """One launched run of train.py: its exit code, the losses it printed, its output's end."""

    launcher: str
    returncode: int
    losses: list[float]
    seconds: float
    tail: str


def launched_losses(output: str, label: str) -> list[float]:
    """The losses a launched run printed as ``<label> losses: [...]`` (the first rank's line that
    reads whole: ranks print alike and their writes may interleave)."""
    pattern = re.compile(rf"{re.escape(label)} losses:\s*\[([^\]]*)\]")
    for match in pattern.finditer(output):
        try:
            return [float(x) for x in match.group(1).split(",") if x.strip()]
        except ValueError:
            continue
    return []


def launched(launcher: str, returncode: int, log_file: str | os.PathLike, seconds: float,
             label: str) -> Launched:
    """What one launch left: its exit code and the ``label`` losses in its log."""
    output = Path(log_file).read_text(errors="replace") if Path(log_file).exists() else ""
    return Launched(launcher, returncode, launched_losses(output, label), seconds, output[-3000:])


#: Lines of a failed launch's log that its claim quotes.
LOG_LINES_SHOWN = 15


def log_end(log: str, sep: str = "\n") -> str:
    """The last LOG_LINES_SHOWN non-empty lines of a failed launch's log, joined by ``sep``: all
    a CI log shows of why a launched run failed."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return sep.join(lines[-LOG_LINES_SHOWN:]) or "(empty)"


def launch_claims(runs: Sequence[Launched], steps: int,
                  matches: Callable[[str, list[float]], claims.Claim]) -> list[claims.Claim]:
    """Each able to fail: both launchers ran, each exited 0, printed ``steps`` losses, and those
    held the lesson's rule ``matches(label, losses)`` against the notebook's own run."""
    out = [("train.py ran under both launchers",
            {r.launcher for r in runs} == {"deepspeed", "accelerate launch"})]
    for r in runs:
        label = f"{r.launcher}: train.py exited 0 (exit code {r.returncode})"
        if r.returncode != 0:  # what went wrong, where a failed check is all a CI log shows
            label += "; its log ends:\n" + log_end(r.tail)
        out.append((label, r.returncode == 0))
        label, held = matches(f"{r.launcher}: the launched run", r.losses)
        out.append((f"{label}, all {steps} steps", held and len(r.losses) == steps))
    return out


def launch_table(runs: Sequence[Launched], what: str) -> Table:
    """One row per launcher: exit code, time, the first and last of its ``what`` losses."""
    rows = [(r.launcher, r.returncode, f"{r.seconds:.0f} s",
             f"{r.losses[0]:.4f} -> {r.losses[-1]:.4f}" if r.losses else "-") for r in runs]
    return Table(["launcher", "exit code", "time", f"{what} loss"], rows,
                 title="train.py, started by a launcher")
