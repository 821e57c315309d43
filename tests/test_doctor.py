"""helpers.doctor: diagnoses from injected facts, the verdict, build-log triage, and the real ops."""

import dataclasses
import os
import re
import sys

import pytest

from helpers import doctor, env
from helpers.doctor import FIX, NOT_HERE, READY, Facts, OpStatus

COLAB_T4 = Facts(has_gpu=True, capability=(7, 5), torch_cuda="12.4", nvcc="12.5", cuda_home="/usr/local/cuda",
                 ninja=True, compiler="/usr/bin/c++", libaio=True, arch_list="7.5", shm_bytes=6 * 2**30,
                 ram_budget_bytes=int(12.7e9), platform="colab", gpu_count=1)


def t4(**changes) -> Facts:
    return dataclasses.replace(COLAB_T4, **changes)


def keys(facts: Facts) -> set[str]:
    return {d.key for d in doctor.diagnose(facts)}


def only(facts: Facts, key: str) -> doctor.Diagnosis:
    found = [d for d in doctor.diagnose(facts) if d.key == key]
    assert len(found) == 1, doctor.diagnose(facts)
    return found[0]


def test_a_healthy_colab_t4_has_nothing_to_fix():
    assert doctor.diagnose(COLAB_T4) == []


def test_mismatched_nvcc_major_is_an_error_with_both_fixes():
    d = only(t4(nvcc="11.8"), "cuda_mismatch")
    assert d.level == "error" and "nvcc is CUDA 11.8 but torch was built for CUDA 12.4" in d.problem
    assert "CUDA 12.x toolkit" in d.fix and "whl/cu118" in d.fix
    assert "cuda_mismatch" not in keys(t4(nvcc="12.1"))  # same major: DeepSpeed accepts it


def test_no_nvcc_explains_and_offers_torch_adam():
    d = only(t4(nvcc=None, cuda_home=None), "no_nvcc")
    assert d.level == "error" and "CUDA_HOME is unset" in d.problem
    assert "cuda-toolkit-12-4" in d.fix and '"torch_adam": true' in d.fix


def test_missing_libaio_names_apt_and_the_colab_flag():
    d = only(t4(libaio=False), "no_libaio")
    assert d.affects == ("NVMe offload",)
    assert d.fix.startswith("apt-get install -y libaio-dev") and "INSTALL_LIBAIO = True" in d.fix
    assert "INSTALL_LIBAIO" not in only(t4(libaio=False, platform="local"), "no_libaio").fix


@pytest.mark.parametrize("arch, key", [
    (None, "arch_list_unset"), ("", "arch_list_unset"), ("8.0;9.0a", "arch_list_bad"), ("sm_75", "arch_list_bad"),
    ("8.0 8.6", "arch_list_misses_gpu"),
])
def test_arch_list_problems_fix_to_this_gpus_capability(arch, key):
    d = only(t4(arch_list=arch), key)
    assert 'TORCH_CUDA_ARCH_LIST"] = "7.5"' in d.fix
    if key == "arch_list_unset":
        assert "invalid literal for int() with base 10: '0a'" in d.explanation


@pytest.mark.parametrize("arch", ["7.5", "7.5+PTX", "7.0;7.5", "7.5 8.0"])
def test_good_arch_lists_pass(arch):
    assert not {k for k in keys(t4(arch_list=arch)) if k.startswith("arch")}


def test_small_shm_and_small_ram():
    assert "--shm-size=1g" in only(t4(shm_bytes=64 * 2**20), "shm_small").fix
    d = only(t4(ram_budget_bytes=8 * 10**9), "ram_small")
    assert "Fits: GPT-2 124M" in d.explanation and "NVMe offload" in d.fix


def test_bf16_asked_for_on_a_t4_says_use_fp16():
    d = only(t4(requested_precision="bf16"), "bf16_unsupported")
    assert "capability 7.5" in d.problem and '"fp16": {"enabled": true}' in d.fix
    assert "bf16_unsupported" not in keys(t4(capability=(8, 0), arch_list="8.0", requested_precision="bf16"))


def test_no_gpu_is_explained_not_an_error():
    facts = t4(has_gpu=False, capability=None, torch_cuda=None, nvcc=None, arch_list=None, gpu_count=0, platform="local")
    found = doctor.diagnose(facts)
    assert [d.key for d in found] == ["no_gpu"] and found[0].level == "info"


def test_missing_ninja_and_compiler():
    assert only(t4(ninja=False), "no_ninja").fix == 'pip install "ninja>=1.11"'
    assert "build-essential" in only(t4(compiler=None), "no_compiler").fix


def _ops(**loads):
    return [OpStatus(name, "", False, True, loads=ok, why="" if ok else f"{name} failed") for name, ok in loads.items()]


def test_verdict_on_a_ready_t4():
    rows = dict((c, s) for c, s, _ in doctor.verdict(COLAB_T4, _ops(fused_adam=True, cpu_adam=True, async_io=True), []))
    assert rows == {"fp16 training": READY, "bf16 training": NOT_HERE, "ZeRO 1/2/3": READY, "CPU offload": READY,
                    "NVMe offload": READY, "multi-GPU": NOT_HERE}


def test_verdict_carries_the_fix_when_fused_adam_fails_on_a_bad_arch_list():
    facts = t4(arch_list="9.0a")
    rows = {c: (s, why) for c, s, why in doctor.verdict(facts, _ops(fused_adam=False, cpu_adam=True, async_io=True),
                                                         doctor.diagnose(facts))}
    assert rows["fp16 training"][0] == FIX and 'TORCH_CUDA_ARCH_LIST"] = "7.5"' in rows["fp16 training"][1]
    assert rows["CPU offload"][0] == READY


def test_verdict_without_libaio_says_not_here_with_the_fix():
    facts = t4(libaio=False)
    ops = _ops(fused_adam=True, cpu_adam=True) + [OpStatus("async_io", "", False, False, "libaio missing", loads=False)]
    row = next(r for r in doctor.verdict(facts, ops, doctor.diagnose(facts)) if r[0] == "NVMe offload")
    assert row[1] == NOT_HERE and "apt-get install -y libaio-dev" in row[2]


def test_verdict_on_two_gpus_and_on_a_cpu():
    two = dict((c, s) for c, s, _ in doctor.verdict(t4(gpu_count=2), _ops(fused_adam=True, cpu_adam=True, async_io=True), []))
    assert two["multi-GPU"] == READY
    cpu = t4(has_gpu=False, capability=None, gpu_count=0)
    rows = dict((c, s) for c, s, _ in doctor.verdict(cpu, _ops(fused_adam=True, cpu_adam=True, async_io=False), []))
    assert rows["fp16 training"] == NOT_HERE and rows["ZeRO 1/2/3"] == READY and rows["NVMe offload"] == FIX


FAILED_BUILD = "\n".join(
    ["[1/3] c++ -c something.cpp"] * 50
    + ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
       "  File \"/site-packages/torch/utils/cpp_extension.py\", line 2400, in _get_cuda_arch_flags",
       "ValueError: invalid literal for int() with base 10: '0a'"] + ["noise"] * 200)


def test_build_log_is_cut_to_the_relevant_lines_and_diagnosed():
    lines = doctor.relevant_lines(FAILED_BUILD)
    assert lines == ["ValueError: invalid literal for int() with base 10: '0a'"]
    assert "TORCH_CUDA_ARCH_LIST" in doctor.diagnose_build_log(lines)
    assert "libaio-dev" in doctor.diagnose_build_log(["fatal error: libaio.h: No such file or directory"])


def test_parse_arch_list():
    assert doctor.parse_arch_list("7.5;8.0 9.0+PTX") == ["7.5", "8.0", "9.0+PTX"]
    assert doctor.parse_arch_list("10.0a") is None and doctor.parse_arch_list(" ") is None


def test_an_unset_arch_list_is_information_and_says_what_deepspeed_compiles():
    d = only(t4(arch_list=None), "arch_list_unset")
    assert d.level == "info" and "7.5, plus PTX" in d.explanation
    assert "several architectures" not in d.explanation


def _jit_arch_list(monkeypatch, value: str | None, capabilities: list[tuple[int, int]]) -> str:
    """What DeepSpeed 0.19.8's JIT builder compiles for (the TORCH_CUDA_ARCH_LIST it hands torch),
    with ``value`` in the environment and these GPUs visible (torch.cuda's answers replaced)."""
    import torch
    from deepspeed.ops.op_builder.builder import CUDAOpBuilder

    if value is None:
        monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    else:
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(capabilities))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: capabilities[i])
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False, raising=False)
    class Probe(CUDAOpBuilder):  # no op of its own: only DeepSpeed's arch logic runs
        def absolute_name(self):
            return "probe"

        def sources(self):
            return []

    builder = Probe(name="probe")
    builder.jit_mode, builder._jit_arch_list = True, None  # as jit_load() sets them, unset
    assert builder.compute_capability_args() == []  # JIT: torch makes the flags from the variable
    return os.environ["TORCH_CUDA_ARCH_LIST"]


def test_deepspeed_compiles_for_the_visible_gpu_when_the_arch_list_is_unset(monkeypatch):
    """Notebook 02's and the doctor's claim, against DeepSpeed's own builder: unset means this GPU's
    capability (plus PTX), not several architectures; a '9.0a' token is what fails with '0a'."""
    assert _jit_arch_list(monkeypatch, None, [(7, 5)]) == "7.5+PTX"
    assert _jit_arch_list(monkeypatch, None, [(8, 0), (7, 5), (8, 0)]) == "7.5;8.0+PTX"
    assert _jit_arch_list(monkeypatch, "7.5", [(9, 0)]) == "7.5+PTX"
    with pytest.raises(ValueError, match="'0a'"):
        _jit_arch_list(monkeypatch, "8.0;9.0a", [(9, 0)])


def test_apply_safe_fixes_sets_only_a_missing_or_broken_arch_list(monkeypatch):
    from helpers import env

    machine = env.describe()
    machine = dataclasses.replace(machine, real_capability=(7, 5))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    assert doctor.apply_safe_fixes(machine) == ["TORCH_CUDA_ARCH_LIST=7.5 (was '9.0a')"]
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "7.5"
    assert doctor.apply_safe_fixes(machine) == []
    assert doctor.apply_safe_fixes(dataclasses.replace(machine, real_capability=None)) == []


# ---- this machine, through DeepSpeed's real builders -------------------------------------------------


def test_real_report_and_prebuild_make_cpu_adam_loadable():
    report = {s.name: s for s in doctor.op_report(["cpu_adam", "async_io"])}
    assert report["cpu_adam"].compatible
    assert report["async_io"].compatible == env.libaio_available()
    if not report["async_io"].compatible:
        assert "libaio" in report["async_io"].why
    built = doctor.prebuild(["cpu_adam"], progress=False)[0]
    assert built.loads is True and built.seconds > 0, built


def test_a_failing_build_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(doctor, "op_report", lambda names: [OpStatus(names[0], "", False, True)])
    status = doctor.build_op("no_such_op_anywhere")
    assert status.loads is False and status.why


def test_ds_report_text_has_no_colour_codes():
    text = doctor.ds_report_text()
    assert "DeepSpeed C++/CUDA extension op report" in text and "\x1b[" not in text
    html = doctor.ds_report_text(html=True)
    assert html.startswith("<pre") and "\x1b[" not in html and re.search(r"color:(green|darkorange)", html)


def test_install_libaio_without_run_only_prints(monkeypatch):
    monkeypatch.setattr(env, "libaio_available", lambda: False)
    assert env.install_libaio(run=False) == "Not run. To enable NVMe offload: apt-get install -y libaio-dev"


def test_install_libaio_makes_the_next_probe_answer_without_a_restart(monkeypatch):
    """Notebook 06 tells a learner without libaio to run install_libaio(run=True), then the notebook
    again from its parameters cell: the probe's cached False must not outlive the install."""
    import subprocess

    installed = []

    def fake_run(cmd, **kwargs):
        if cmd[0] == "bash":  # the apt-get line
            installed.append(cmd[-1])
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return subprocess.CompletedProcess(cmd, 0, f"LIBAIO {bool(installed)}\n", "")

    monkeypatch.setattr(env.subprocess, "run", fake_run)
    monkeypatch.setattr(env.shutil, "which", lambda name: "/usr/bin/" + name)
    env.libaio_available.cache_clear()
    try:
        assert env.libaio_available() is False  # probed, and cached
        assert env.install_libaio(run=True) == "libaio-dev installed: async_io can now be built."
        assert "libaio-dev" in installed[0]
        assert env.libaio_available() is True
    finally:
        env.libaio_available.cache_clear()  # later tests probe this machine again


def test_under_t4_emulation_bf16_is_not_here_but_ops_target_the_real_gpu():
    h200_as_t4 = t4(build_capability=(9, 0), arch_list=None)
    rows = dict((c, s) for c, s, _ in doctor.verdict(h200_as_t4, _ops(fused_adam=True, cpu_adam=True, async_io=True), []))
    assert rows["bf16 training"] == NOT_HERE
    assert 'TORCH_CUDA_ARCH_LIST"] = "9.0"' in only(h200_as_t4, "arch_list_unset").fix
    assert "arch_list_misses_gpu" not in keys(t4(build_capability=(9, 0), arch_list="9.0"))
    assert "bf16_unsupported" in keys(t4(build_capability=(9, 0), arch_list="9.0", requested_precision="bf16"))


def test_gather_facts_keeps_the_emulated_and_the_real_capability(monkeypatch):
    from helpers import env

    machine = dataclasses.replace(env.describe(), gpu_name="H200", gpu_count=1, capability=(7, 5), real_capability=(9, 0))
    facts = doctor.gather_facts(machine)
    assert facts.capability == (7, 5) and facts.build_capability == (9, 0) and facts.arch == "9.0"


def test_the_op_probes_linker_lines_become_one_reason_per_missing_library():
    """Issue 27: `ld: cannot find -laio` in a learner's output, where the kit knows why."""
    text = ("async_io ............... [NO] ....... [NO]\n"
            "x86_64-linux-gnu-gcc -pthread -c /tmp/tmpab12/test.c -o /tmp/tmpab12/test.o\n"
            "/usr/bin/ld: cannot find -laio: No such file or directory\n"
            "collect2: error: ld returned 1 exit status\n"
            "\x1b[93m[WARNING]\x1b[0m gds: /usr/bin/ld: cannot find -lcufile\n"
            "fused_adam ............. [NO] ....... [OKAY]\n")
    folded = doctor.fold_probe_noise(text)
    assert "cannot find" not in folded and "collect2" not in folded and "test.c" not in folded
    assert "async_io ...." in folded and "fused_adam ...." in folded
    assert "4 compiler/linker line(s)" in folded
    assert "-laio: libaio is not installed" in folded and "-lcufile: NVIDIA's cuFile" in folded
    assert doctor.fold_probe_noise("nothing to fold\n[WARNING] async_io requires libaio") == (
        "nothing to fold\n[WARNING] async_io requires libaio")


def test_require_ops_stops_with_the_reason_before_any_measured_run():
    """Notebook 06 builds its ops before the fine-tune; one that did not load stops it there."""
    libaio = OpStatus("async_io", "", False, False, "libaio missing", loads=False)
    built = _ops(fused_adam=True, cpu_adam=True) + [libaio]
    doctor.require_ops(built, ["cpu_adam"])  # CPU offload: async_io not needed
    with pytest.raises(env.KitSetupError,
                       match=r"async_io did not load \(async_io: libaio missing\)"):
        doctor.require_ops(built, ["cpu_adam", "async_io"])
    with pytest.raises(env.KitSetupError,
                       match=r"cpu_adam did not load \(cpu_adam: cpu_adam failed\)"):
        doctor.require_ops(_ops(cpu_adam=False), ["cpu_adam"])
    with pytest.raises(env.KitSetupError, match=r"cpu_adam: cpu_adam was not checked"):
        doctor.require_ops(_ops(fused_adam=True), ["cpu_adam"])
    wrong = dataclasses.replace(_ops(cpu_adam=True)[0], works=False, why="its exercise was off")
    with pytest.raises(env.KitSetupError, match=r"cpu_adam: its exercise was off"):
        doctor.require_ops([wrong], ["cpu_adam"])


def test_op_probes_from_two_threads_leave_stdout_as_it_was(monkeypatch):
    """`make ops` builds ops side by side (prebuild's jobs): each build first probes its op with
    stdout redirected. Interleaved, the second thread restored the first one's buffer as stdout, and
    the op table printed after the builds vanished (make ops said 'no table above')."""
    import threading
    import time

    from deepspeed.git_version_info import installed_ops  # noqa: F401 (imported before the race)

    first_in, second_in = threading.Event(), threading.Event()

    class Builder:
        error_log = None

        def __init__(self, name):
            self.name = name

        def is_compatible(self, verbose=True):
            print("probing", self.name)
            if self.name == "cpu_adam":  # the first: waits until the second is inside too
                first_in.set()
                second_in.wait(1)  # (never, once probes take turns)
            else:  # the second: still inside when the first leaves
                second_in.set()
                time.sleep(0.3)
            return True

    monkeypatch.setattr(doctor, "op_builder", Builder)
    before = sys.stdout
    first = threading.Thread(target=doctor.op_report, args=(["cpu_adam"],))
    second = threading.Thread(target=doctor.op_report, args=(["fused_adam"],))
    first.start()
    first_in.wait(5)
    second.start()
    first.join()
    second.join()
    assert sys.stdout is before
