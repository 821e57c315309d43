"""Where is this notebook running? GPU, precision, RAM, disk, versions, smoke mode, T4 emulation.

``describe()`` reads the machine (it changes nothing) and returns an :class:`Environment` that
renders as a table. ``emulate("t4")`` (or ``KIT_EMULATE=t4``) makes a bigger GPU behave like a free
Colab T4: it caps this process's GPU memory, and the kit's decisions follow the T4's capability.
Also libaio (the library NVMe offload links against: usable here?, and its install line) and the
one-process distributed setup a launcher would otherwise do (free ports, MASTER_ADDR/PORT, RANK).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from helpers import colab
from helpers.show import Table, GB, GiB
from helpers import show

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The status a run gets when the GPU runs out of memory (helpers.runner and helpers.lessons.zero2_training).
OUT_OF_GPU_MEMORY = "out of GPU memory"


def is_out_of_memory(err: BaseException) -> bool:
    """torch's OutOfMemoryError, or an error whose text says so (DeepSpeed re-raises some as RuntimeError)."""
    import torch

    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


@dataclass(frozen=True)
class Emulation:
    """A smaller machine the kit pretends to be: its GPU, capability and RAM, and what of them a run
    really gets.

    GPU: the card's memory as CUDA reports it, less the CUDA context (outside PyTorch's allocator).
    RAM: the VM's total, less what the VM itself uses before any cell runs, less the notebook
    kernel's own RSS (measured by :func:`describe`; ``kernel_rss_bytes`` where none was measured).
    """

    name: str
    label: str
    gpu_bytes: int
    capability: tuple[int, int]
    ram_bytes: int
    vm_overhead_bytes: int = 0
    cuda_context_bytes: int = 0
    kernel_rss_bytes: int = 0
    #: the VM's CPU cores; not emulated (runs use every core of the machine), only reported
    cpu_cores: int = 0
    #: free disk on a fresh VM, for NVMe offload verdicts; not emulated for real runs (they write
    #: to this machine's disk), used where the kit predicts for the emulated machine
    disk_free_bytes: int = 0

    @property
    def gpu_cap_bytes(self) -> int:
        """What PyTorch's allocator may hold: the card's memory less the CUDA context."""
        return self.gpu_bytes - self.cuda_context_bytes

    @property
    def notebook_ram_bytes(self) -> int:
        """RAM the notebook's kernel and every run it starts share: the VM's less its own use."""
        return self.ram_bytes - self.vm_overhead_bytes

    @property
    def ram_budget_bytes(self) -> int:
        """What a run started from a typical kernel has (where no kernel was measured)."""
        return self.notebook_ram_bytes - self.kernel_rss_bytes


#: A free Colab T4. GPU: CUDA reports 14.75 GiB on a T4 (nvidia-smi rounds it to 15 GiB; the
#: driver's own reserve is already left out of that total); the CUDA context of a PyTorch process
#: sits outside the allocator: 0.068 GiB measured on the GPU machine after a first cuBLAS matmul
#: (tools/gpu_cuda_context.py: H200, torch 2.11, CUDA 13, lazy module loading; docs/gpu_runs.md, 2026-12-02).
#: Lazy loading grows it as new kernels are first used, so it is a floor. RAM: Colab's 12.7 GB VM, of which the VM uses about 1.2 GB before any cell runs (0.9 to
#: 1.4 GB as Colab's users report it); a kernel that imported torch and the kit holds about
#: 0.7 GB more (measured by describe() where a notebook runs). CPU: a free Colab VM has 2 vCPUs;
#: the emulation does not cap the cores (DeepSpeed's CPU Adam is bound by memory bandwidth more
#: than by cores: over 355M parameters, 0.22 s a step on 2 cores of the kit's CI machine, against
#: 0.27 s for the whole offloaded optimizer step on the GPU machine's 16, docs/gpu_runs.md, 2026-12-03).
#: Disk: a fresh free runtime's root filesystem is 108 GB with about 38 GB used by the image
#: (``df -h /`` as Colab's users post it, googlecolab/colabtools#5448, 2025): about 70 GB free.
EMULATIONS: dict[str, Emulation] = {
    "t4": Emulation("t4", "Colab T4", gpu_bytes=int(14.75 * GiB), capability=(7, 5),
                    ram_bytes=int(12.7 * GB), vm_overhead_bytes=int(1.2 * GB),
                    cuda_context_bytes=int(0.07 * GiB), kernel_rss_bytes=int(0.7 * GB),
                    cpu_cores=2, disk_free_bytes=int(70 * GB)),
}
_OFF = {"", "none", "off", "0", "false", "no"}
_ON = {"1", "true", "yes", "on"}


class KitSetupError(RuntimeError):
    """A problem with the user's setup, with the fix in its message (no traceback needed)."""

    def _render_traceback_(self) -> list[str]:  # IPython shows only this instead of a traceback
        return [f"{type(self).__name__}: {self}"]


def resolve_emulation(value: str | None = None) -> Emulation | None:
    """The emulation asked for by ``value``, or by ``KIT_EMULATE`` when ``value`` is None."""
    raw = os.environ.get("KIT_EMULATE", "") if value is None else value
    key = raw.strip().lower()
    if key in _OFF:
        return None
    if key not in EMULATIONS:
        valid = ", ".join(repr(k) for k in EMULATIONS)
        raise KitSetupError(
            f"unknown emulation {raw!r}: valid values are {valid} or 'none' "
            f"(set KIT_EMULATE=t4, or EMULATE = \"t4\" in a notebook's parameters: kit_env.emulate(\"t4\"))"
        )
    return EMULATIONS[key]


def smoke_mode(cuda_available: bool | None = None) -> bool:
    """True when there is no CUDA GPU or ``KIT_SMOKE`` is set to 1/true: notebooks shrink their sizes."""
    if os.environ.get("KIT_SMOKE", "").strip().lower() in _ON:
        return True
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    return not cuda_available


def native_bf16(capability: tuple[int, int] | None) -> bool:
    """bf16 runs natively from compute capability 8.0 (Ampere) on.

    Not ``torch.cuda.is_bf16_supported()``: it answers True on a T4 (7.5), where bf16 is emulated
    and slow.
    """
    return capability is not None and tuple(capability) >= (8, 0)


def choose_precision(capability: tuple[int, int] | None) -> str:
    """The precision the kit trains in: bf16 from 8.0 on, fp16 on older GPUs, fp32 on the CPU."""
    if capability is None:
        return "fp32"
    return "bf16" if native_bf16(capability) else "fp16"


@dataclass
class GpuFacts:
    """What torch reports about the first CUDA GPU (real values, before any emulation)."""

    name: str
    count: int
    capability: tuple[int, int]
    total_bytes: int
    free_bytes: int


def _gpu_facts() -> GpuFacts | None:
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return GpuFacts(
        name=torch.cuda.get_device_name(0),
        count=torch.cuda.device_count(),
        capability=tuple(torch.cuda.get_device_capability(0)),
        total_bytes=total,
        free_bytes=free,
    )


def apply_emulation(emulation: Emulation | None, gpu: GpuFacts | None) -> int | None:
    """Cap this process's GPU memory at the emulated size; returns the cap in bytes (None: no cap).

    Uses ``torch.cuda.set_per_process_memory_fraction``: allocations past the cap raise
    ``torch.cuda.OutOfMemoryError`` as they would on the smaller card. Subprocesses inherit
    ``KIT_EMULATE`` and call this again.
    """
    if emulation is None or gpu is None:
        return None
    import torch

    cap = min(emulation.gpu_cap_bytes, gpu.total_bytes)
    for device in range(gpu.count):
        torch.cuda.set_per_process_memory_fraction(cap / gpu.total_bytes, device)
    return cap


def detect_platform(environ: dict[str, str] | None = None, modules: dict | None = None) -> str:
    """'colab', 'kaggle' or 'local'."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if "google.colab" in modules or "COLAB_RELEASE_TAG" in environ or "COLAB_GPU" in environ:
        return "colab"
    if "KAGGLE_KERNEL_RUN_TYPE" in environ or "KAGGLE_URL_BASE" in environ:
        return "kaggle"
    return "local"


def nvcc_version() -> str | None:
    """nvcc's release (e.g. '12.4') from CUDA_HOME or PATH, or None when there is no nvcc."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [str(Path(home) / "bin" / "nvcc")] if home else []
    candidates += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    for nvcc in candidates:
        if nvcc and Path(nvcc).exists():
            try:
                out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            found = re.search(r"release (\d+\.\d+)", out)
            if found:
                return found.group(1)
    return None


def nvidia_smi() -> str:
    """``nvidia-smi``'s output, or a sentence saying why there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi is not installed here: no NVIDIA driver, so no CUDA GPU (the kit runs on the CPU)."
    try:
        done = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"nvidia-smi did not run: {err}"
    return done.stdout if done.returncode == 0 else f"nvidia-smi failed: {(done.stderr or done.stdout).strip()}"


def default_offload_dir() -> Path:
    """Where NVMe offload files go: ``KIT_OFFLOAD_DIR``, else a folder on the local temp disk."""
    return Path(os.environ.get("KIT_OFFLOAD_DIR") or Path(tempfile.gettempdir()) / "zero_kit_offload")


def disk_free_bytes(path: Path) -> int:
    """Free bytes on the disk that holds ``path`` (or its nearest existing parent)."""
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


@dataclass
class Environment:
    """Everything the kit decides from: build with :func:`describe`."""

    platform: str
    gpu_name: str | None
    gpu_count: int
    capability: tuple[int, int] | None  # as the kit sees it (7.5 under T4 emulation)
    real_capability: tuple[int, int] | None
    vram_total_bytes: int | None  # after the emulation cap
    vram_free_bytes: int | None
    native_bf16: bool
    precision: str
    cpu_cores: int
    ram_total_bytes: int
    ram_available_bytes: int
    ram_budget_bytes: int  # what a run started from this kernel has: notebook RAM less the kernel
    offload_dir: str
    disk_free_bytes: int
    torch_version: str
    torch_cuda: str | None
    nvcc: str | None
    deepspeed_version: str | None
    transformers_version: str | None
    smoke: bool
    emulation: Emulation | None = None
    gpu_cap_bytes: int | None = None
    #: RAM the kernel and its runs share (12.7 GB less the VM's own 1.2 under T4 emulation)
    notebook_ram_bytes: int = 0
    #: this process's RSS when described: the notebook's kernel, with torch and the kit imported
    kernel_rss_bytes: int = 0

    @property
    def has_gpu(self) -> bool:
        return self.gpu_name is not None

    def cpu_note(self) -> str:
        """'' unless an emulated machine has fewer cores than this one (they are not capped)."""
        emu = self.emulation
        if not emu or not emu.cpu_cores or emu.cpu_cores >= self.cpu_cores:
            return ""
        return (f"not emulated: a {emu.label} has {emu.cpu_cores}; CPU offload's Adam ran on "
                f"this machine's")

    def rows(self) -> list[tuple[str, str, str]]:
        """(what, value, note) rows: the environment table."""
        gib = lambda b: "-" if b is None else f"{show.gib(b, 1)} GiB"
        emu = self.emulation
        cap_note = f"capped: {self.gpu_cap_note()}" if emu and self.has_gpu else ""
        real_cc = self.real_capability
        cc_note = (
            f"emulated; the real GPU is {real_cc[0]}.{real_cc[1]}"
            if emu and real_cc and real_cc != self.capability
            else ""
        )
        return [
            ("platform", self.platform, ""),
            ("GPU", self.gpu_name or "none", f"{self.gpu_count} visible" if self.has_gpu else "runs on the CPU"),
            ("compute capability", _cc(self.capability), cc_note),
            ("GPU memory total", gib(self.vram_total_bytes), cap_note),
            ("GPU memory free", gib(self.vram_free_bytes), ""),
            ("native bf16", "yes" if self.native_bf16 else "no", "needs capability >= 8.0"),
            ("precision the kit uses", self.precision, "fp32 on the CPU" if not self.has_gpu else ""),
            ("CPU cores", str(self.cpu_cores), self.cpu_note()),
            ("RAM total", gib(self.ram_total_bytes), ""),
            ("RAM available", gib(self.ram_available_bytes), ""),
            ("RAM budget of a run", f"{self.ram_budget_bytes / GB:.1f} GB", self.ram_budget_note()),
            ("disk free for offload", gib(self.disk_free_bytes), self.offload_dir),
            ("torch", self.torch_version, f"CUDA {self.torch_cuda}" if self.torch_cuda else "CPU build"),
            ("nvcc", self.nvcc or "none", "needed only to JIT-build CUDA ops" if not self.nvcc else ""),
            ("DeepSpeed", self.deepspeed_version or "missing", "" if self.deepspeed_version else colab.install_command("deepspeed")),
            ("transformers", self.transformers_version or "missing", ""),
            ("smoke mode", "on" if self.smoke else "off", "tiny sizes (no GPU or KIT_SMOKE=1)" if self.smoke else "full sizes"),
            ("emulation", emu.label if emu else "off", "KIT_EMULATE" if emu else ""),
        ]

    def ram_budget_note(self) -> str:
        """Which figures the RAM budget is made of, as a sum a reader can check."""
        emu = self.emulation
        kernel = f"{self.kernel_rss_bytes / GB:.1f} GB (this kernel: torch and the kit imported)"
        if emu is None:
            return (f"{self.notebook_ram_bytes / GB:.1f} GB (this machine's RAM free when measured,"
                    f" with this kernel's; of {self.ram_total_bytes / GB:.1f} GB) - {kernel}")
        return (f"{emu.ram_bytes / GB:.1f} GB ({emu.label}'s RAM) - {emu.vm_overhead_bytes / GB:.1f} GB"
                f" (the VM's own use before any cell runs) - {kernel}")

    def gpu_cap_note(self) -> str:
        """Which figures the GPU cap is made of (empty without emulation)."""
        emu = self.emulation
        if emu is None or not self.has_gpu:
            return ""
        return (f"{emu.label}'s {emu.gpu_bytes / GiB:.2f} GiB less the CUDA context's "
                f"{emu.cuda_context_bytes / GiB:.2f} GiB (outside PyTorch's allocator)")

    def table(self) -> Table:
        return Table(["what", "value", "note"], self.rows(), title="Where this notebook runs")

    def measured_on(self) -> str:
        """Where a table's figures come from, for its title: under emulation they are estimates of a
        T4 made on a larger GPU, and say so."""
        if not self.has_gpu:
            return "measured on the CPU (smoke mode: tiny sizes, fp32)"
        if self.emulation:
            return (f"measured on a {self.gpu_name} in {self.emulation.label} emulation: estimates of a "
                    f"real {self.emulation.label}")
        return f"measured on a {self.gpu_name}"

    def __str__(self) -> str:
        return str(self.table())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def _cc(capability: tuple[int, int] | None) -> str:
    return "-" if capability is None else f"{capability[0]}.{capability[1]}"


def emulate(value: str | None = None) -> Emulation | None:
    """Turn emulation on (``"t4"``) or off (``"none"``) for this process and its subprocesses; with
    ``None``, follow ``KIT_EMULATE``. Caps this process's GPU memory at the emulated size (every GPU)
    and sets ``KIT_EMULATE`` so that measurement subprocesses apply the same cap. Returns the emulation."""
    emulation = resolve_emulation(value)
    if value is not None:
        os.environ["KIT_EMULATE"] = emulation.name if emulation else "none"
    apply_emulation(emulation, _gpu_facts())
    return emulation


def describe(offload_dir: str | os.PathLike | None = None) -> Environment:
    """Describe this machine as the kit sees it, under the emulation ``KIT_EMULATE`` names (see
    :func:`emulate`, which applies it). Reads only: changes nothing in the process."""
    import psutil
    import torch

    emulation = resolve_emulation()
    gpu = _gpu_facts()
    cap = min(emulation.gpu_cap_bytes, gpu.total_bytes) if emulation and gpu else None
    capability = None
    vram_total = vram_free = None
    if gpu is not None:
        capability = emulation.capability if emulation else gpu.capability
        vram_total = cap if cap is not None else gpu.total_bytes
        vram_free = min(gpu.free_bytes, vram_total - torch.cuda.memory_reserved(0)) if cap else gpu.free_bytes
    vm = psutil.virtual_memory()
    kernel_rss = psutil.Process().memory_info().rss
    # emulated: Colab's figures; real: what is free now plus this kernel's own (the OS, the VM's
    # services and other programs already hold the rest: about 1.2 GB on a free Colab)
    notebook_ram = (min(emulation.notebook_ram_bytes, vm.total) if emulation
                    else min(vm.total, vm.available + kernel_rss))
    folder = Path(offload_dir) if offload_dir else default_offload_dir()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return Environment(
        platform=detect_platform(),
        gpu_name=gpu.name if gpu else None,
        gpu_count=gpu.count if gpu else 0,
        capability=capability,
        real_capability=gpu.capability if gpu else None,
        vram_total_bytes=vram_total,
        vram_free_bytes=vram_free,
        native_bf16=native_bf16(capability),
        precision=choose_precision(capability),
        cpu_cores=cores,
        ram_total_bytes=vm.total,
        ram_available_bytes=vm.available,
        ram_budget_bytes=max(0, notebook_ram - kernel_rss),
        offload_dir=str(folder),
        disk_free_bytes=disk_free_bytes(folder),
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        nvcc=nvcc_version(),
        deepspeed_version=colab.version_of("deepspeed"),
        transformers_version=colab.version_of("transformers"),
        smoke=smoke_mode(gpu is not None),
        emulation=emulation,
        gpu_cap_bytes=cap,
        notebook_ram_bytes=notebook_ram,
        kernel_rss_bytes=kernel_rss,
    )


def ram_left_for_runs(environment: Environment) -> int:
    """What a run started now has: the notebook's RAM less this kernel's RSS now (a kernel grows as
    it holds data and models: measure again before each batch of runs)."""
    import psutil

    return max(0, environment.notebook_ram_bytes - psutil.Process().memory_info().rss)


# ---- libaio: what NVMe offload (DeepSpeed's async_io op) links against ---------------------------
#: libaio, the Linux library DeepSpeed's async_io op (NVMe offload, ZeRO-Infinity) links against:
#: is it usable here, and the command that installs it. A machine fact, probed once per process.
LIBAIO_APT = "apt-get install -y libaio-dev"


@functools.lru_cache(maxsize=None)
def libaio_available() -> bool:
    """DeepSpeed's own test: compile and link a program calling io_submit (honours CFLAGS/LDFLAGS).

    Run in a fresh subprocess: DeepSpeed's probe redirects file descriptor 2, which a Jupyter
    kernel's captured streams do not always allow (it answered False inside JupyterLab).
    """
    probe = ("import contextlib, io\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    from deepspeed.ops.op_builder.all_ops import ALL_OPS\n"
             "    b = ALL_OPS.get('async_io')\n"
             "    ok = bool(b is not None and b.has_function('io_submit', ('aio',)))\n"
             "print('LIBAIO', ok)")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return False
    return "LIBAIO True" in done.stdout


def install_libaio(run: bool = False) -> str:
    """Print, or with ``run`` and root, run the apt-get line that installs libaio-dev."""
    if libaio_available():
        return "libaio is already usable: nothing to install."
    if not run:
        return f"Not run. To enable NVMe offload: {LIBAIO_APT}"
    if shutil.which("apt-get") is None:
        return "apt-get is not here: install libaio's development package with your system's package manager."
    cmd = f"apt-get update -qq && {LIBAIO_APT} -qq"
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    libaio_available.cache_clear()
    if done.returncode != 0:
        return f"{cmd} failed: " + "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
    return "libaio-dev installed: " + ("async_io can now be built." if libaio_available() else "but io_submit still does not link.")


# ---- one-process distributed setup (what torchrun or the deepspeed launcher would set) -----------


def free_port(start: int | None = None, tries: int = 200, host: str = "") -> int:
    """A port nothing listens on, probed by binding to it: one the OS picks (``start`` None), else
    the first free one from ``start`` on.

    The OS's pick is random among its ephemeral ports, so two processes that look for a port at the
    same moment do not both take 29500 (seen on a GPU machine running notebooks side by side). The
    probe binds the wildcard address: torch's TCPStore listens on all addresses (IPv6 dual stack), so
    a port free on 127.0.0.1 alone can still be taken for it.
    """
    if start is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    for port in range(start, start + tries):
        if _port_free(port, host):
            return port
    raise KitSetupError(f"no free port in {start}..{start + tries - 1} on {host}: set MASTER_PORT to a free one")


_DIST_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def _port_free(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


#: Where DeepSpeed's CPU all-reduce (its deepspeed_shm_comm op) keeps one buffer per rank, named
#: deepspeed_allreduce_buffer_<uid>_<address>_<port>_<rank>. DeepSpeed 0.19.8 never unlinks them
#: (shm.cpp defines shared_close and nothing calls it), so every run of several CPU ranks leaves its
#: buffers in RAM (/dev/shm is memory) until the machine restarts: 67 MB a rank here.
SHM_BUFFERS = Path("/dev/shm")
SHM_BUFFER_PREFIX = "deepspeed_allreduce_buffer_"


def remove_ended_shm_buffers(folder: Path = SHM_BUFFERS) -> int:
    """Unlink DeepSpeed's CPU all-reduce buffers whose run has ended (nothing accepts a connection
    on the rendezvous port their name holds any more); returns the bytes freed. A running run's
    buffers stay: its rendezvous store still listens."""
    freed = 0
    for path in folder.glob(SHM_BUFFER_PREFIX + "*"):
        parts = path.name.split("_")
        if len(parts) < 3 or not parts[-2].isdigit() or _port_listening(int(parts[-2])):
            continue
        try:
            size = path.stat().st_size
            path.unlink()
            freed += size
        except OSError:  # another user's, or gone already
            continue
    return freed


def _port_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _launched() -> bool:
    """True when a real launcher (torchrun, the deepspeed launcher) started this process."""
    # Not LOCAL_WORLD_SIZE: accelerate sets it in a plain process too.
    return "TORCHELASTIC_RUN_ID" in os.environ or os.environ.get("WORLD_SIZE", "1") != "1"


def setup_single_process_dist(port: int | None = None) -> dict[str, str]:
    """Set what a launcher would (MASTER_ADDR/PORT, RANK, LOCAL_RANK, WORLD_SIZE) for one process.

    Variables already set (by a launcher, or an earlier call) are kept, so calling twice is safe
    and a real launcher wins. The port is probed, not assumed free: a MASTER_PORT inherited from a
    parent process whose port is now taken (and not by this process's own group) is replaced.
    """
    defaults = {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    current = os.environ.get("MASTER_PORT")
    if current is None or (not _launched() and not _group_started() and not _port_free(int(current))):
        os.environ["MASTER_PORT"] = str(port if port is not None else free_port())
    return {k: os.environ[k] for k in _DIST_KEYS}


def _group_started() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except ImportError:
        return False


def dist_roundtrip() -> bool:
    """Start a one-process gloo group on the variables from setup_single_process_dist, all-reduce, stop.

    Proves the port is usable before DeepSpeed needs it. Leaves no group behind.
    """
    import torch
    import torch.distributed as dist

    setup_single_process_dist()
    if dist.is_initialized():  # DeepSpeed already started one in this kernel: use it
        value = torch.ones(1)
        dist.all_reduce(value)
        return value.item() == int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    try:
        value = torch.ones(1)
        dist.all_reduce(value)
        return value.item() == int(os.environ["WORLD_SIZE"])
    finally:
        dist.destroy_process_group()
