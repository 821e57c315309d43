"""helpers.env: the bf16 rule, T4 emulation, smoke mode, ports, the one-process dist setup."""

import os
import socket

import pytest
import torch

from helpers import claims, colab, env
from helpers.env import GpuFacts
from helpers.show import GB, GiB
from helpers.lessons import gpu_check

T4 = GpuFacts(name="Tesla T4", count=1, capability=(7, 5), total_bytes=15_835_660_288, free_bytes=15_600_000_000)
H200 = GpuFacts(name="NVIDIA H200", count=1, capability=(9, 0), total_bytes=150_754_820_096, free_bytes=150_000_000_000)
DIST_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("KIT_EMULATE", "KIT_SMOKE", *DIST_KEYS):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


@pytest.fixture
def fake_gpu(clean_env):
    """Pretend torch sees a GPU: returns a setter; records memory-fraction calls."""
    calls = []
    clean_env.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    clean_env.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    clean_env.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what a T4 wrongly answers

    def use(gpu):
        clean_env.setattr(env, "_gpu_facts", lambda: gpu)
        return calls

    return use


@pytest.mark.parametrize("capability, bf16, precision", [
    ((7, 5), False, "fp16"), ((7, 0), False, "fp16"), ((8, 0), True, "bf16"), ((9, 0), True, "bf16"), (None, False, "fp32"),
])
def test_bf16_rule_follows_capability(capability, bf16, precision):
    assert env.native_bf16(capability) is bf16
    assert env.choose_precision(capability) == precision


def test_a_real_t4_trains_in_fp16_although_torch_says_bf16_is_supported(fake_gpu):
    fake_gpu(T4)
    machine = (env.emulate("none"), env.describe())[1]
    assert torch.cuda.is_bf16_supported()  # the trap
    assert machine.capability == (7, 5)
    assert machine.native_bf16 is False and machine.precision == "fp16"
    assert machine.smoke is False and machine.gpu_cap_bytes is None


def test_t4_emulation_on_a_big_gpu_caps_memory_and_picks_fp16(fake_gpu):
    calls = fake_gpu(H200)
    machine = (env.emulate("t4"), env.describe())[1]
    assert machine.capability == (7, 5) and machine.real_capability == (9, 0)
    assert machine.precision == "fp16" and not machine.native_bf16
    t4 = env.EMULATIONS["t4"]
    # a T4's 14.75 GiB less the CUDA context, which PyTorch's allocator never sees
    cap = int(14.75 * GiB) - t4.cuda_context_bytes
    assert 0 < t4.cuda_context_bytes < GiB and cap == t4.gpu_cap_bytes
    assert machine.vram_total_bytes == cap == machine.gpu_cap_bytes
    assert calls == [(pytest.approx(cap / H200.total_bytes), 0)]
    assert os.environ["KIT_EMULATE"] == "t4"  # subprocesses inherit the choice
    rows = {what: (value, note) for what, value, note in machine.rows()}
    assert rows["compute capability"] == ("7.5", "emulated; the real GPU is 9.0")
    assert rows["GPU memory total"][0] == f"{cap / GiB:.1f} GiB"
    assert "less the CUDA context" in rows["GPU memory total"][1]
    assert "Colab T4: fp16 (no native bf16)" in gpu_check.verdict(machine)[0]


def test_a_runs_ram_budget_is_colabs_less_the_vm_and_this_kernel(fake_gpu):
    """12.7 GB is Colab's whole VM: the VM itself uses about 1.2 GB before any cell runs, and the
    kernel (this process) holds its own RSS beside every run it starts."""
    import psutil

    fake_gpu(H200)
    machine = (env.emulate("t4"), env.describe())[1]
    rss = psutil.Process().memory_info().rss
    assert machine.notebook_ram_bytes == int(12.7 * GB) - int(1.2 * GB)
    assert 0 < machine.kernel_rss_bytes <= rss
    assert machine.ram_budget_bytes == machine.notebook_ram_bytes - machine.kernel_rss_bytes
    assert machine.ram_budget_bytes < int(11.5 * GB)  # never the whole 12.7 GB
    note = dict((w, n) for w, _, n in machine.rows())["RAM budget of a run"]
    assert "12.7 GB" in note and "1.2 GB" in note and "this kernel" in note
    # later, a kernel that grew leaves less for the next run
    held = bytearray(200 * 2**20)
    assert env.ram_left_for_runs(machine) <= machine.ram_budget_bytes - 150 * 2**20
    del held
    # a typical kernel where none was measured (config.t4_profile, stored measurements)
    t4 = env.EMULATIONS["t4"]
    assert t4.ram_budget_bytes == int(12.7 * GB) - int(1.2 * GB) - t4.kernel_rss_bytes


def test_on_a_real_colab_a_runs_ram_budget_is_what_is_free(fake_gpu, clean_env):
    """No emulation on Colab's real T4: the VM's own 1.2 GB is already in use, so a budget from the
    machine's total (12.7 GiB there) would let a run go past what Colab kills at."""
    import collections

    import psutil

    fake_gpu(T4)
    memory = collections.namedtuple("memory", "total available")
    clean_env.setattr(psutil, "virtual_memory", lambda: memory(13_600_000_000, 11_000_000_000))
    machine = env.describe()
    assert machine.emulation is None
    assert machine.notebook_ram_bytes == 11_000_000_000 + machine.kernel_rss_bytes
    assert machine.ram_budget_bytes == 11_000_000_000  # what is free now, not 13.6 less the kernel
    note = machine.ram_budget_note()
    assert "free when measured" in note and "of 13.6 GB" in note, note
    # a machine with nothing else running is held to its total, never more
    clean_env.setattr(psutil, "virtual_memory", lambda: memory(13_600_000_000, 13_590_000_000))
    assert env.describe().notebook_ram_bytes == 13_600_000_000


def test_emulation_from_the_environment_variable(clean_env):
    clean_env.setenv("KIT_EMULATE", " T4 ")
    assert env.resolve_emulation().name == "t4"
    clean_env.setenv("KIT_EMULATE", "none")
    assert env.resolve_emulation() is None


def test_unknown_emulation_names_the_valid_values(clean_env):
    with pytest.raises(env.KitSetupError, match=r"unknown emulation 'a100': valid values are 't4' or 'none'"):
        env.resolve_emulation("a100")
    clean_env.setenv("KIT_EMULATE", "v100")
    with pytest.raises(env.KitSetupError, match="KIT_EMULATE=t4"):
        env.describe()


def test_smoke_mode(clean_env):
    assert env.smoke_mode(cuda_available=False) is True
    assert env.smoke_mode(cuda_available=True) is False
    clean_env.setenv("KIT_SMOKE", "1")
    assert env.smoke_mode(cuda_available=True) is True


def test_no_gpu_is_not_an_error(clean_env):
    machine = env.describe()  # this CI machine has no GPU
    if machine.has_gpu:
        pytest.skip("this machine has a GPU")
    assert machine.smoke and machine.precision == "fp32" and machine.gpu_count == 0
    assert gpu_check.check_gpu_cap(machine) is None
    assert "No GPU" in gpu_check.verdict(machine)[0]
    assert "GPU" in str(machine) and "<table>" in machine._repr_html_()


def test_free_port_skips_a_taken_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        found = env.free_port(start=port)
        assert found != port and found > port
    with pytest.raises(env.KitSetupError, match="no free port"):
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            env.free_port(start=taken.getsockname()[1], tries=1)


def test_single_process_dist_is_idempotent_and_keeps_a_launchers_values(clean_env):
    first = env.setup_single_process_dist()
    assert set(first) == set(DIST_KEYS) and first["WORLD_SIZE"] == "1" and first["RANK"] == "0"
    assert env.setup_single_process_dist() == first
    for key in DIST_KEYS:
        clean_env.delenv(key)
    clean_env.setenv("MASTER_PORT", "31234")
    assert env.setup_single_process_dist()["MASTER_PORT"] == "31234"


def test_dist_roundtrip_starts_and_stops_a_group(clean_env):
    import torch.distributed as torch_dist

    before = torch_dist.is_initialized()  # an earlier in-process Trainer may have left its group
    assert env.dist_roundtrip() is True
    assert torch_dist.is_initialized() == before  # the round trip leaves the state as it found it
    assert env.dist_roundtrip() is True  # a second time, on the same variables


def test_platform_detection():
    assert env.detect_platform({}, {"google.colab": object()}) == "colab"
    assert env.detect_platform({"COLAB_RELEASE_TAG": "x"}, {}) == "colab"
    assert env.detect_platform({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, {}) == "kaggle"
    assert env.detect_platform({}, {}) == "local"


def test_missing_deepspeed_gives_the_exact_install_command(clean_env):
    import importlib

    real_import = importlib.import_module
    clean_env.setattr(colab, "version_of", lambda name: None if name == "deepspeed" else "1.0")

    def fake_import(name, *args, **kwargs):
        if name == "deepspeed":
            raise ImportError("No module named 'deepspeed'")
        return real_import(name, *args, **kwargs)

    clean_env.setattr(importlib, "import_module", fake_import)
    command = 'pip install "deepspeed>=0.19.5,<0.20"'
    assert colab.install_command("deepspeed") == command
    machine = env.describe()
    assert any(command in line for line in gpu_check.verdict(machine))
    assert ("DeepSpeed", "missing", command) in machine.rows()
    table = str(gpu_check.package_table(("torch", "deepspeed")))
    assert command in table and "missing" in table
    checks = gpu_check.check_invariants(machine)
    with pytest.raises(AssertionError, match="DeepSpeed imports"):
        claims.assert_all(checks)


def test_nvcc_version_is_parsed_from_cuda_home(clean_env, tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    clean_env.setenv("CUDA_HOME", str(tmp_path))
    assert env.nvcc_version() == "12.4"


def test_nvidia_smi_absent_is_explained(clean_env):
    clean_env.setattr(env.shutil, "which", lambda name: None)
    assert "no NVIDIA driver" in env.nvidia_smi()


def test_summary_reads_the_same_on_any_machine(clean_env):
    machine = env.describe()
    text = gpu_check.summary(machine, gpu_check.check_invariants(machine))
    assert text.splitlines()[0] == "all checks held: True"
    assert "the kit's precision computes correctly here: True" in text and "fp32" not in text
    assert machine.gpu_name is None or machine.gpu_name not in text


def test_an_inherited_port_that_is_taken_is_replaced(clean_env):
    clean_env.setattr(env, "_group_started", lambda: False)  # no group of this process holds the port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        clean_env.setenv("MASTER_PORT", str(busy))
        assert env.setup_single_process_dist()["MASTER_PORT"] != str(busy)
        clean_env.setenv("MASTER_PORT", str(busy))
        clean_env.setenv("LOCAL_WORLD_SIZE", "1")  # accelerate sets this in a plain process: not a launcher
        assert env.setup_single_process_dist()["MASTER_PORT"] != str(busy)
        clean_env.setenv("MASTER_PORT", str(busy))
        clean_env.setenv("TORCHELASTIC_RUN_ID", "x")  # under torchrun its port is kept
        assert env.setup_single_process_dist()["MASTER_PORT"] == str(busy)


def test_deepspeeds_leaked_cpu_allreduce_buffers_go_once_their_run_has_ended(tmp_path):
    """DeepSpeed 0.19.8 never unlinks its CPU ranks' shared-memory buffers: the kit removes those
    of an ended run (its rendezvous port closed) and keeps a running one's (its port listening)."""
    import socket

    from helpers import env

    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        running = live.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ended = probe.getsockname()[1]  # bound, not listening: nothing accepts on it
            names = {port: [tmp_path / f"{env.SHM_BUFFER_PREFIX}0_127.0.0.1_{port}_{rank}"
                            for rank in (0, 1)] for port in (running, ended)}
            for paths in names.values():
                for path in paths:
                    path.write_bytes(b"x" * 1000)
            other = tmp_path / "not_deepspeeds"
            other.write_bytes(b"x")
            assert env.remove_ended_shm_buffers(tmp_path) == 2000
    assert all(p.exists() for p in names[running]) and other.exists()
    assert not any(p.exists() for p in names[ended])
