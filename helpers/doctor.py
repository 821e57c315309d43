"""``ds_report`` explained: op readiness from DeepSpeed's own builders, diagnoses with fixes, a verdict.

- :func:`gather_facts` reads the machine (nvcc, ninja, compiler, libaio, arch list, /dev/shm, RAM);
  :func:`diagnose` turns facts into :class:`Diagnosis` objects (pure, so tests inject facts).
- :func:`op_report` asks DeepSpeed's op builders (``is_compatible``, ``installed_ops``) about the
  ops the kit uses here; :func:`prebuild` JIT-compiles and loads each in a fresh subprocess,
  timing it and keeping only the relevant compiler lines when it fails.
- :func:`verdict` derives ready / not here / fix for each capability the later notebooks need.
- ``python -m helpers doctor [--prebuild]`` prints the same as notebook 02.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers import env as kit_env

from helpers import memory, show
from helpers.show import Table

ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: What each op the kit uses is for.
OP_PURPOSE = {
    "fused_adam": "FusedAdam, the optimizer step on the GPU (or DeepSpeed's CPU Adam kernel without a GPU)",
    "cpu_adam": "CPU Adam, the optimizer step in host RAM when ZeRO offloads the optimizer (CPU or NVMe)",
    "async_io": "async I/O through libaio, which ZeRO-Infinity uses to page states to and from NVMe",
    "deepspeed_shm_comm": "shared-memory collectives between ranks on one CPU machine",
}
#: Model sizes the later notebooks offload to host RAM (GPT-2 small and medium).
LATER_MODEL_PARAMS = {"GPT-2 124M": 124_439_808, "GPT-2 355M": 354_823_168}
SHM_MIN_BYTES = 512 * 2**20  # DeepSpeed's own ds_report threshold


def kit_ops(has_gpu: bool) -> list[str]:
    """The DeepSpeed ops the kit's notebooks load on this kind of machine, in build order: the
    longest compile first (async_io, 12 C++ files and pin_memory's 3 before them), so that builds
    side by side (``prebuild(jobs=2)``) end together."""
    if has_gpu:
        return ["fused_adam", "cpu_adam", "async_io"]
    return ["async_io", "deepspeed_shm_comm", "cpu_adam", "fused_adam"]


@dataclass
class Facts:
    """What the diagnoses look at; every field can be injected by a test."""

    has_gpu: bool
    capability: tuple[int, int] | None  # as the kit sees it (7.5 under T4 emulation): precision decisions
    torch_cuda: str | None
    nvcc: str | None
    cuda_home: str | None
    ninja: bool
    compiler: str | None
    libaio: bool
    arch_list: str | None
    shm_bytes: int | None
    ram_budget_bytes: int
    platform: str = "local"
    gpu_count: int = 0
    requested_precision: str | None = None
    build_capability: tuple[int, int] | None = None  # the real GPU's: what compiled kernels must run on

    @property
    def arch(self) -> str | None:
        """The capability compiled ops must target, as 'major.minor' (the real GPU's, even under emulation)."""
        cc = self.build_capability or self.capability
        return f"{cc[0]}.{cc[1]}" if cc else None


@dataclass
class Diagnosis:
    """One problem (or fact worth knowing), why it matters, and the exact fix."""

    key: str
    level: str  # "error", "warning" or "info"
    problem: str
    explanation: str
    fix: str
    affects: tuple[str, ...] = ()


def gather_facts(environment: kit_env.Environment | None = None, requested_precision: str | None = None) -> Facts:
    """Read the facts from this machine (DeepSpeed's own libaio probe included)."""
    import torch.utils.cpp_extension as cpp

    environment = environment or kit_env.describe()
    try:
        shm = os.statvfs("/dev/shm")
        shm_bytes = shm.f_frsize * shm.f_blocks
    except OSError:
        shm_bytes = None
    return Facts(
        has_gpu=environment.has_gpu,
        capability=environment.capability,
        build_capability=environment.real_capability,
        torch_cuda=environment.torch_cuda,
        nvcc=environment.nvcc,
        cuda_home=cpp.CUDA_HOME,
        ninja=cpp.is_ninja_available(),
        compiler=shutil.which(os.environ.get("CXX", "c++")),
        libaio=kit_env.libaio_available(),
        arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST"),
        shm_bytes=shm_bytes,
        ram_budget_bytes=environment.ram_budget_bytes,
        platform=environment.platform,
        gpu_count=environment.gpu_count,
        requested_precision=requested_precision,
    )


_ARCH_TOKEN = re.compile(r"^\d+\.\d+(\+PTX)?$")


def parse_arch_list(value: str) -> list[str] | None:
    """The arch tokens of a TORCH_CUDA_ARCH_LIST value, or None when any token is unparsable."""
    tokens = [t for t in re.split(r"[;\s]+", value.strip()) if t]
    if not tokens or not all(_ARCH_TOKEN.match(t) for t in tokens):
        return None
    return tokens


def _major(version: str | None) -> int | None:
    return int(version.split(".")[0]) if version else None


def diagnose(facts: Facts) -> list[Diagnosis]:
    """Every problem the facts show, each with its explanation and exact fix. Pure: no I/O. (Long on
    purpose: a flat list of independent rules, one block each, read top to bottom like ds_report.)"""
    out: list[Diagnosis] = []
    cc = f"{facts.capability[0]}.{facts.capability[1]}" if facts.capability else None
    if not facts.has_gpu:
        out.append(Diagnosis(
            "no_gpu", "info", "No CUDA GPU here.",
            "DeepSpeed runs on its CPU accelerator: ZeRO stages and CPU offload work in fp32 with gloo, "
            "slowly, which is how the kit's smoke mode and CI run.",
            "On Colab: Runtime > Change runtime type > T4 GPU, then run the notebooks again.",
            ("fp16 training", "bf16 training")))
    if facts.has_gpu and facts.nvcc is None:
        out.append(Diagnosis(
            "no_nvcc", "error", "No nvcc (CUDA_HOME is " + (facts.cuda_home or "unset") + ").",
            "DeepSpeed JIT-compiles CUDA ops such as FusedAdam with nvcc; without it they cannot be built.",
            f"Install a CUDA toolkit matching torch's CUDA {facts.torch_cuda} (e.g. apt-get install "
            f"cuda-toolkit-{(facts.torch_cuda or '12.4').replace('.', '-')}) and set CUDA_HOME to it; or "
            'train with torch\'s Adam: "optimizer": {"type": "AdamW", "params": {"torch_adam": true}}.',
            ("fp16 training", "bf16 training", "ZeRO 1/2/3")))
    if facts.has_gpu and facts.nvcc and facts.torch_cuda and _major(facts.nvcc) != _major(facts.torch_cuda):
        out.append(Diagnosis(
            "cuda_mismatch", "error",
            f"nvcc is CUDA {facts.nvcc} but torch was built for CUDA {facts.torch_cuda}.",
            "DeepSpeed refuses to compile ops when the CUDA major versions differ: kernels built by one "
            "toolkit do not link against the other's runtime.",
            f"Install the CUDA {_major(facts.torch_cuda)}.x toolkit and point CUDA_HOME at it, or install "
            f"a torch built for CUDA {facts.nvcc} (pip install torch --index-url "
            f"https://download.pytorch.org/whl/cu{facts.nvcc.replace('.', '')}).",
            ("fp16 training", "bf16 training", "ZeRO 1/2/3")))
    if not facts.ninja:
        out.append(Diagnosis(
            "no_ninja", "error", "ninja is missing.",
            "torch builds every JIT op with ninja; DeepSpeed stops with 'ninja not being installed'.",
            'pip install "ninja>=1.11"', ("CPU offload", "NVMe offload", "fp16 training", "ZeRO 1/2/3")))
    if facts.compiler is None:
        out.append(Diagnosis(
            "no_compiler", "error", "No C++ compiler (c++) on PATH.",
            "Every DeepSpeed op, CPU Adam included, is C++ compiled on first use.",
            "apt-get install -y build-essential", ("CPU offload", "NVMe offload", "fp16 training", "ZeRO 1/2/3")))
    if not facts.libaio:
        colab = " (in a Colab cell: !" + kit_env.LIBAIO_APT + ", or set INSTALL_LIBAIO = True below)" if facts.platform == "colab" else ""
        out.append(Diagnosis(
            "no_libaio", "warning", "libaio (headers and .so) not found.",
            "NVMe offload (ZeRO-Infinity) reads and writes optimizer states and parameters through "
            "DeepSpeed's async_io op, which links against libaio. Everything else works without it.",
            f"{kit_env.LIBAIO_APT}{colab}; if libaio lives elsewhere, set CFLAGS=-I<dir>/include and "
            "LDFLAGS=-L<dir>/lib before starting Python.", ("NVMe offload",)))
    if facts.has_gpu:
        arch = facts.arch
        tokens = parse_arch_list(facts.arch_list) if facts.arch_list else None
        if facts.arch_list is None or not facts.arch_list.strip():
            out.append(Diagnosis(
                "arch_list_unset", "info", "TORCH_CUDA_ARCH_LIST is unset.",
                "Nothing is wrong: DeepSpeed 0.19.8's JIT builder then compiles for the GPUs it "
                f"sees (here {arch}, plus PTX), one architecture per card type "
                "(op_builder/builder.py, compute_capability_args). It cannot probe the GPU in a "
                "forked process where CUDA is already initialised, and refuses there; a value "
                "holding a token such as '9.0a' (some images set one) fails with "
                "\"ValueError: invalid literal for int() with base 10: '0a'\".",
                f'os.environ["TORCH_CUDA_ARCH_LIST"] = "{arch}" before the first build (doctor.apply_safe_fixes() '
                "does it): the same architecture, fixed for every process the kernel starts.",
                ("fp16 training", "bf16 training")))
        elif tokens is None:
            out.append(Diagnosis(
                "arch_list_bad", "error", f"TORCH_CUDA_ARCH_LIST={facts.arch_list!r} cannot be parsed.",
                "FusedAdam's JIT build fails with \"ValueError: invalid literal for int() with base 10\" "
                "on such a value.",
                f'os.environ["TORCH_CUDA_ARCH_LIST"] = "{arch}"', ("fp16 training", "bf16 training", "ZeRO 1/2/3")))
        elif arch and not any(t.split("+")[0] == arch for t in tokens):
            out.append(Diagnosis(
                "arch_list_misses_gpu", "error",
                f"TORCH_CUDA_ARCH_LIST={facts.arch_list!r} leaves out this GPU's capability {arch}.",
                "Ops compiled only for other architectures fail to launch on this GPU.",
                f'os.environ["TORCH_CUDA_ARCH_LIST"] = "{arch}"', ("fp16 training", "bf16 training")))
    if facts.shm_bytes is not None and facts.shm_bytes < SHM_MIN_BYTES:
        out.append(Diagnosis(
            "shm_small", "warning", f"/dev/shm is {facts.shm_bytes / 2**20:.0f} MiB.",
            "Collectives between processes (NCCL, DeepSpeed's shared-memory ops) and data loader workers "
            "pass data through /dev/shm; below 512 MiB they fail or hang with several ranks.",
            "In Docker: run with --shm-size=1g (or --ipc=host); elsewhere: mount -o remount,size=1G /dev/shm",
            ("multi-GPU",)))
    fitting = [name for name, n in LATER_MODEL_PARAMS.items() if memory.cpu_offload_host_bytes(n) <= facts.ram_budget_bytes]
    if len(fitting) < len(LATER_MODEL_PARAMS):
        largest = max(LATER_MODEL_PARAMS.values())
        need = memory.cpu_offload_host_bytes(largest) / kit_env.GB
        out.append(Diagnosis(
            "ram_small", "warning",
            f"{facts.ram_budget_bytes / kit_env.GB:.1f} GB of RAM is too little for CPU offload of GPT-2 355M "
            f"(about {need:.1f} GB).",
            "ZeRO-Offload keeps fp32 weights, Adam's moments and fp32 gradients in host RAM: about 20 bytes "
            "per parameter plus a ~2 GiB process base. "
            + (f"Fits: {', '.join(fitting)}." if fitting else "Neither GPT-2 size fits."),
            "Use the smaller model for CPU offload, or NVMe offload (notebook 06), which pages states to disk.",
            ("CPU offload",)))
    if facts.requested_precision == "bf16" and not kit_env.native_bf16(facts.capability if facts.has_gpu else None):
        where = f"capability {cc}" if cc else "the CPU"
        out.append(Diagnosis(
            "bf16_unsupported", "error", f"bf16 asked for on {where}.",
            "Native bf16 needs compute capability 8.0 (Ampere) or newer; torch.cuda.is_bf16_supported() may "
            "still say yes (emulated, slow) on a T4.",
            'Train in fp16: "fp16": {"enabled": true}, "bf16": {"enabled": false} '
            '(or "auto" with the Trainer\'s --fp16).', ("bf16 training",)))
    return out


def apply_safe_fixes(environment: kit_env.Environment) -> list[str]:
    """Apply the fixes that cannot hurt, for this kernel and its subprocesses; say what was done."""
    done = []
    cc = environment.real_capability
    if cc:
        current = os.environ.get("TORCH_CUDA_ARCH_LIST")
        tokens = parse_arch_list(current) if current else None
        if tokens is None or not any(t.split("+")[0] == f"{cc[0]}.{cc[1]}" for t in tokens):
            os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cc[0]}.{cc[1]}"
            done.append(f"TORCH_CUDA_ARCH_LIST={cc[0]}.{cc[1]} (was {current!r})")
    return done


# ---- DeepSpeed's op builders -------------------------------------------------------------------


def op_builder(name: str):
    """DeepSpeed's builder object for an op on this accelerator (None when it has none)."""
    from deepspeed.ops.op_builder.all_ops import ALL_OPS

    return ALL_OPS.get(name)


@dataclass
class OpStatus:
    """One op as DeepSpeed sees it, plus what the kit measured when building it."""

    name: str
    purpose: str
    installed: bool  # prebuilt into the installed DeepSpeed
    compatible: bool  # DeepSpeed's is_compatible(): can be JIT-built here
    why: str = ""  # DeepSpeed's warnings when not compatible, or the build error
    loads: bool | None = None  # None: not tried yet
    seconds: float | None = None
    cached: bool | None = None  # loaded from the torch extensions cache, no compile
    log: list[str] = field(default_factory=list)  # the relevant compiler lines of a failed build
    works: bool | None = None  # loaded and did its job (EXERCISES); None: not exercised
    works_error: float | None = None  # the exercise's largest error
    compiled_seconds: float | None = None  # the build that made the cached op (build_times.json)


_PROBE_LOCK = threading.Lock()


@contextlib.contextmanager
def _silenced_stderr():
    """Silence file descriptor 2 (the linker's messages from DeepSpeed's probes), then restore it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def op_report(names: list[str] | None = None, environment: kit_env.Environment | None = None) -> list[OpStatus]:
    """installed / compatible / why for the ops the kit uses here, from DeepSpeed's builders."""
    from deepspeed.git_version_info import installed_ops

    if names is None:
        names = kit_ops((environment or kit_env.describe()).has_gpu)
    out = []
    for name in names:
        builder = op_builder(name)
        if builder is None:
            out.append(OpStatus(name, OP_PURPOSE.get(name, ""), False, False, "DeepSpeed has no such op on this accelerator"))
            continue
        printed = io.StringIO()
        # one probe at a time: redirect_stdout swaps the process-wide sys.stdout (and the fd-2
        # silencing the process's stderr), so two threads interleaving here (prebuild's jobs) left
        # sys.stdout pointing at the other's buffer: `make ops` then printed its table into it
        with _PROBE_LOCK, contextlib.redirect_stdout(printed), _silenced_stderr():
            try:
                compatible = bool(builder.is_compatible(verbose=True))
            except Exception as err:  # DeepSpeed's own probe can raise (no CUDA_HOME, say)
                compatible, builder.error_log = False, str(err)
        if name == "async_io" and not compatible and kit_env.libaio_available():
            # async_io's is_compatible is DeepSpeed's io_submit compile-and-link probe, which can
            # answer False inside a Jupyter kernel (it redirects file descriptor 2; seen on the GPU
            # machine under nbval): kit_env.libaio_available() runs the same probe in a fresh process.
            compatible = True
        why = "" if compatible else _why(printed.getvalue(), builder.error_log)
        out.append(OpStatus(name, OP_PURPOSE.get(name, ""), bool(installed_ops.get(name)), compatible, why))
    return out


def _why(printed: str, error_log: str | None) -> str:
    lines = [ANSI.sub("", line).replace("[WARNING]", "").strip() for line in printed.splitlines()]
    lines = [line for line in lines if line]
    if error_log and ANSI.sub("", error_log).strip() not in lines:
        lines.append(ANSI.sub("", error_log).strip())
    return " ".join(dict.fromkeys(lines))


_RELEVANT = re.compile(r"error|fatal|undefined reference|cannot find|no such file|not found|invalid literal|"
                       r"ninja|unable|mismatch", re.I)


def relevant_lines(log: str, limit: int = 8) -> list[str]:
    """The first lines of a build log that say what went wrong (not the 300-line traceback)."""
    seen, out = set(), []
    for raw in log.splitlines():
        line = ANSI.sub("", raw).strip()
        if not line or line in seen or line.startswith(("File \"", "Traceback", "^")):
            continue
        if _RELEVANT.search(line):
            seen.add(line)
            out.append(show.clip(line, 300))
        if len(out) >= limit:
            break
    return out


def diagnose_build_log(lines: list[str]) -> str:
    """A plain explanation and fix for a failed build, recognised from its relevant lines."""
    text = "\n".join(lines)
    if "invalid literal for int()" in text:
        return "The CUDA arch list could not be parsed: set TORCH_CUDA_ARCH_LIST to this GPU's capability (e.g. 7.5)."
    if "libaio" in text or "aio.h" in text or "-laio" in text:
        return f"libaio is missing: {kit_env.LIBAIO_APT}"
    if "ninja" in text.lower():
        return 'ninja is missing: pip install "ninja>=1.11"'
    if "nvcc" in text or "CUDA_HOME" in text:
        return "No usable CUDA compiler: install the CUDA toolkit matching torch's CUDA and set CUDA_HOME."
    if "mismatch" in text.lower():
        return "CUDA versions differ between torch and nvcc: install the matching toolkit."
    return "See the compiler lines above; the diagnoses table lists the usual causes."


def _extension_folder(name: str) -> Path | None:
    """Where torch's JIT cache keeps this op's build (TORCH_EXTENSIONS_DIR/NAME)."""
    from torch.utils.cpp_extension import _get_build_directory

    try:
        return Path(_get_build_directory(name, verbose=False))
    except Exception:
        return None


def _built_library_times(name: str) -> dict[str, float]:
    """The op's built libraries in torch's extension cache, with their modification times."""
    folder = _extension_folder(name)
    return {str(p): p.stat().st_mtime for p in folder.glob(f"{name}*.so")} if folder else {}


#: Beside the ops in the extension cache: how long each op's compile took, and when.
BUILD_TIMES = "zero-kit-build-times.json"


def build_times() -> dict[str, dict]:
    """The recorded compiles of the cached ops: {op: {"seconds": s, "when": ISO date}}."""
    folder = _extension_folder("cpu_adam")
    try:
        return json.loads((folder.parent / BUILD_TIMES).read_text()) if folder else {}
    except (OSError, ValueError):
        return {}


_RECORD_LOCK = threading.Lock()  # prebuild's threads record their builds one at a time


def _record_build(name: str, seconds: float) -> None:
    folder = _extension_folder(name)
    if folder is None:
        return
    with _RECORD_LOCK:
        record = build_times()
        record[name] = {"seconds": round(seconds, 1), "when": time.strftime("%Y-%m-%d %H:%M")}
        path = folder.parent / BUILD_TIMES
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)


def build_op(name: str, timeout: int = 1800) -> OpStatus:
    """JIT-compile and load one op in a fresh subprocess; time it; keep the relevant lines on failure.

    A compile's time is recorded beside the cache, so a later load of the cached op still says how
    long its build took (notebook 02 shows it)."""
    status = next(iter(op_report([name])))
    if not status.compatible:
        status.loads = False
        status.log = [status.why] if status.why else []
        return status
    before = _built_library_times(name)
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "helpers", "doctor", "--load", name], capture_output=True,
                              text=True, timeout=timeout, cwd=str(kit_env.REPO_ROOT))
        ok, log = done.returncode == 0, done.stdout + "\n" + done.stderr
    except subprocess.TimeoutExpired as err:
        ok, log = False, f"the build took longer than {timeout} s (timeout)\n{err.stdout or ''}"
    status.seconds = time.perf_counter() - start
    status.loads = ok
    # cached only if the library was there and ninja left it alone (a changed compile command, as
    # after DeepSpeed moved to another folder, rebuilds it in place)
    status.cached = bool(before) and _built_library_times(name) == before
    if ok and not status.cached:
        _record_build(name, status.seconds)
    if ok:
        status.compiled_seconds = (build_times().get(name) or {}).get("seconds")
    mark = re.search(rf"{WORKS_MARK} (True|False) (\S+)(.*)", log)
    if ok and mark:
        status.works, status.works_error = mark.group(1) == "True", float(mark.group(2))
        if not status.works:
            status.why = mark.group(3).strip() or f"its exercise was off by {status.works_error:.3g}"
    if not ok:
        status.log = relevant_lines(log) or log.strip().splitlines()[-5:]
        status.why = diagnose_build_log(status.log)
    return status


def prebuild(names: list[str] | None = None, progress: bool = True, jobs: int = 1) -> list[OpStatus]:
    """Build and load each op the kit needs here, with a progress bar; never raises.

    ``jobs`` > 1 builds that many ops side by side (each in its own subprocess); the results keep
    the order of ``names``."""
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    names = names or kit_ops(kit_env.describe().has_gpu)
    bar = tqdm(total=len(names), desc="building DeepSpeed ops", disable=not progress)

    def one(name: str) -> OpStatus:
        status = build_op(name)
        bar.set_postfix_str(name)
        bar.update()
        return status

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, names))
    bar.close()
    return results


def require_ops(statuses: list[OpStatus], names: list[str]) -> None:
    """Raise KitSetupError naming each op of ``names`` that did not load here, or loaded and failed
    its exercise, with why, so that a notebook stops before its measured runs with the reason, not
    inside ``deepspeed.initialize`` with a compiler's traceback."""
    ops = {s.name: s for s in statuses}
    missing = [name for name in names
               if not (ops.get(name) and ops[name].loads and ops[name].works is not False)]
    if missing:
        why = "; ".join(f"{name}: {op_problem(ops, name)}" for name in missing)
        raise kit_env.KitSetupError(
            f"DeepSpeed's {', '.join(missing)} did not load ({why}). Notebook 02's op table says"
            " why and what to install (`make doctor` outside Colab).")


def op_problem(ops: dict[str, OpStatus], name: str) -> str:
    """Why op ``name`` is not usable, as its status says (its build error or DeepSpeed's warning)."""
    s = ops.get(name)
    return (s.why if s else f"{name} was not checked") or f"{name} did not build"


def build_note(status: OpStatus) -> str:
    """'compiled', or 'cached' with how long the compile that made it took (when recorded)."""
    if not status.cached:
        return "compiled"
    took = status.compiled_seconds
    return f"cached; its compile took {took:.0f} s" if took else "cached"


def ops_table(statuses: list[OpStatus]) -> Table:
    """The op report as a table: installed, compatible, loads, seconds, and why not."""
    rows = []
    for s in statuses:
        seconds = "-" if s.seconds is None else f"{s.seconds:.1f} s ({build_note(s)})"
        loads = "not tried" if s.loads is None else ("yes" if s.loads else "NO")
        note = s.why + ("  |  " + "  |  ".join(s.log) if s.log and s.log != [s.why] else "")
        rows.append((s.name, s.installed, s.compatible, loads, seconds, note or s.purpose))
    return Table(["op", "prebuilt", "JIT-compatible", "loads", "build + load", "why not / what for"], rows,
                 title="DeepSpeed ops the kit uses here")


def diagnoses_table(found: list[Diagnosis]) -> Table:
    """Diagnoses as a table, errors first."""
    order = {"error": 0, "warning": 1, "info": 2}
    rows = [(d.level, d.problem, d.explanation, d.fix) for d in sorted(found, key=lambda d: order[d.level])]
    return Table(["level", "problem", "why it matters", "fix"], rows or [("ok", "nothing to fix", "", "")],
                 title="Diagnoses")


# ---- the verdict ---------------------------------------------------------------------------------

READY, NOT_HERE, FIX = "ready", "not here", "fix"


def verdict(facts: Facts, statuses: list[OpStatus], found: list[Diagnosis]) -> list[tuple[str, str, str]]:
    """(capability, ready / not here / fix, reason or fix): fp16, bf16, ZeRO, CPU offload, NVMe, multi-GPU."""
    ops = {s.name: s for s in statuses}

    def op_ok(name: str) -> bool:
        s = ops.get(name)
        return bool(s and (s.loads if s.loads is not None else s.compatible))

    def fixes_for(capability: str) -> str:
        return "; ".join(d.fix for d in found if capability in d.affects and d.level != "info")

    rows = []
    cc = f"{facts.capability[0]}.{facts.capability[1]}" if facts.capability else None
    if not facts.has_gpu:
        rows.append(("fp16 training", NOT_HERE, "no CUDA GPU: the CPU trains in fp32"))
        rows.append(("bf16 training", NOT_HERE, "no CUDA GPU"))
    else:
        if op_ok("fused_adam"):
            rows.append(("fp16 training", READY, "FusedAdam builds and loads"))
        else:
            rows.append(("fp16 training", FIX, fixes_for("fp16 training") or op_problem(ops, "fused_adam")))
        if not kit_env.native_bf16(facts.capability):
            rows.append(("bf16 training", NOT_HERE, f"capability {cc} < 8.0: no native bf16; train in fp16"))
        elif op_ok("fused_adam"):
            rows.append(("bf16 training", READY, f"capability {cc} has native bf16"))
        else:
            rows.append(("bf16 training", FIX, fixes_for("bf16 training") or op_problem(ops, "fused_adam")))
    base_ok = op_ok("fused_adam")
    rows.append(("ZeRO 1/2/3", READY if base_ok else FIX,
                 "DeepSpeed's optimizer op loads" if base_ok else (fixes_for("ZeRO 1/2/3") or op_problem(ops, "fused_adam"))))
    rows.append(("CPU offload", READY if op_ok("cpu_adam") else FIX,
                 "CPU Adam builds and loads" if op_ok("cpu_adam") else (fixes_for("CPU offload") or op_problem(ops, "cpu_adam"))))
    if op_ok("async_io"):
        rows.append(("NVMe offload", READY, "async_io (libaio) builds and loads"))
    elif not facts.libaio:
        rows.append(("NVMe offload", NOT_HERE, "libaio missing; fix: " + fixes_for("NVMe offload")))
    else:
        rows.append(("NVMe offload", FIX, op_problem(ops, "async_io")))
    if facts.gpu_count > 1:
        shm = fixes_for("multi-GPU")
        rows.append(("multi-GPU", FIX if shm else READY,
                     shm or f"{facts.gpu_count} GPUs: launch one process per GPU (deepspeed or torchrun, notebook 05)"))
    else:
        rows.append(("multi-GPU", NOT_HERE, ("one GPU" if facts.has_gpu else "no GPU")
                     + ": Kaggle offers 2 x T4 for free; on the CPU, notebook 05 runs 2 ranks with gloo"))
    return rows


def verdict_table(rows: list[tuple[str, str, str]]) -> Table:
    return Table(["capability", "status", "reason / fix"], rows, title="Verdict")


#: The output of DeepSpeed's compile-and-link probes (``OpBuilder.has_function``, verbose under
#: ds_report): the compiler's command lines and the linker's complaints, which say only that a
#: library is absent. Each missing library, and what the kit knows of it.
_PROBE_NOISE = re.compile(r"(^|\s)(/usr/bin/)?ld: cannot find -l(\S+)|collect2: error: ld returned|"
                          r"^\s*(x86_64-linux-gnu-)?(gcc|g\+\+|cc|c\+\+) .*(test\.c|\.o\b)|"
                          r"/tmp/\S+/test\.c")
MISSING_LIBRARIES = {
    "aio": "libaio is not installed: async_io (NVMe offload) cannot build; the diagnosis "
           "'no_libaio' below gives the fix",
    "cufile": "NVIDIA's cuFile (GPUDirect Storage, DeepSpeed's gds op) is not installed; the kit "
              "does not use gds",
}


def fold_probe_noise(text: str) -> str:
    """``text`` without the probes' compiler and linker lines, and one line per missing library
    they were about, saying what it means (the learner sees a reason, not a linker error)."""
    kept, missing, folded = [], [], 0
    for line in text.splitlines():
        match = _PROBE_NOISE.search(ANSI.sub("", line))
        if not match:
            kept.append(line)
            continue
        folded += 1
        if match.group(3) and match.group(3).rstrip(":") not in missing:
            missing.append(match.group(3).rstrip(":"))
    if folded:
        kept.append(f"[zero-kit] {folded} compiler/linker line(s) of DeepSpeed's op probes folded:")
        absent = "a library an op links against is absent"
        kept += [f"[zero-kit]   -l{lib}: {MISSING_LIBRARIES.get(lib, absent)}" for lib in missing]
    return "\n".join(kept)


def ds_report_text(html: bool = False) -> str:
    """DeepSpeed's own ``ds_report``, colours stripped (or rendered as HTML); the compile-and-link
    lines of its op probes folded into one explained line per missing library."""
    done = subprocess.run([sys.executable, "-c", "from deepspeed.env_report import cli_main; cli_main()"],
                          capture_output=True, text=True, timeout=600)
    text = fold_probe_noise((done.stdout + done.stderr).strip())
    if not html:
        return ANSI.sub("", text)
    import html as html_lib

    colours = {"92": "green", "91": "red", "93": "darkorange"}
    out = html_lib.escape(text)
    out = re.sub(r"\x1b\[(\d+)m", lambda m: f"<span style='color:{colours[m.group(1)]}'>" if m.group(1) in colours else "", out)
    out = out.replace("\x1b[0m", "</span>")
    return f"<pre style='font-size:11px'>{ANSI.sub('', out)}</pre>"


def exercise_cpu_adam(op=None, steps: int = 3) -> float:
    """Step DeepSpeed's CPU Adam and torch's AdamW on the same tensor; their largest difference."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    gen = torch.Generator().manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(4096, generator=gen))
    ref = torch.nn.Parameter(ours.detach().clone())
    opts = [DeepSpeedCPUAdam([ours], lr=1e-2, weight_decay=0.0), torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.0)]
    for _ in range(steps):
        grad = torch.randn(4096, generator=gen)
        for param, opt in zip((ours, ref), opts):
            param.grad = grad.clone()
            opt.step()
    return float((ours.detach() - ref.detach()).abs().max())


def exercise_async_io(op, folder: str | os.PathLike | None = None) -> float:
    """Write 1 MiB through DeepSpeed's async_io (libaio) to a file and read it back; the largest
    difference between what was written and what came back (0.0 when the round trip works)."""
    import tempfile

    import torch

    handle = op.aio_handle(1 << 20, 8, False, True, 1)
    # Page-locked, aligned buffers from the handle itself, as DeepSpeed's swapper uses: libaio reads
    # and writes with O_DIRECT, which refuses an ordinary tensor's unaligned memory on some disks.
    data, back = (handle.new_cpu_locked_tensor(1 << 18, torch.empty(0, dtype=torch.float32)) for _ in range(2))
    try:
        data.copy_(torch.randn(1 << 18, generator=torch.Generator().manual_seed(0)))
        back.zero_()
        with tempfile.TemporaryDirectory(dir=folder) as where:
            path = os.path.join(where, "kit_aio_probe.bin")
            handle.sync_pwrite(data, path)
            handle.sync_pread(back, path)
        return float((data - back).abs().max())
    finally:
        handle.free_cpu_locked_tensor(data)
        handle.free_cpu_locked_tensor(back)


#: Ops the doctor exercises after loading (not only loads): a small job whose answer is known.
EXERCISES = {"cpu_adam": (exercise_cpu_adam, 1e-5), "async_io": (exercise_async_io, 0.0)}
WORKS_MARK = "KIT_OP_WORKS"


def load_in_this_process(name: str) -> int:
    """Load (JIT-compiling where needed) one op in this process and exercise it: what
    ``python -m helpers doctor --load OP`` runs in :func:`build_op`'s fresh subprocess."""
    builder = op_builder(name)
    if builder is None:
        print(f"no {name} op on this accelerator", file=sys.stderr)
        return 2
    from helpers import deepspeed_fixes

    deepspeed_fixes.fix_cpu_info_once()  # 2.5 s less per op load (the fix says why)
    op = builder.load(verbose=False)
    if name in EXERCISES:
        run, tolerance = EXERCISES[name]
        try:
            error = run(op)
        except Exception as err:  # loaded, but its job failed: say how, in one line
            print(f"{WORKS_MARK} False nan {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
        else:
            print(f"{WORKS_MARK} {error <= tolerance} {error:.3g}")
    return 0
