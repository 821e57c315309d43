"""make setup's pieces: the system packages installed where the machine allows (else the one
command, and setup goes on), DeepSpeed's compile times kept beside the shared op cache, and the
tutorial saying what it left out."""

import os
import stat
import subprocess
from pathlib import Path

from helpers import doctor
from tools import run_tutorial

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "system_packages.sh"


def _fake_bin(tmp_path: Path, uid: int, libraries: str = "") -> Path:
    """A PATH with only id (printing uid), dpkg (nothing installed), ldconfig (listing
    ``libraries``) and an apt-get that logs."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "apt.log"
    scripts = {"id": f"echo {uid}", "dpkg": "exit 1", "ldconfig": f"echo '{libraries}'",
               "apt-get": f'echo "$@" >> {log}'}
    for name, body in scripts.items():
        path = fake / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return fake


def _run(fake: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(fake), "TMPDIR": str(fake.parent)}
    return subprocess.run(["/bin/bash", str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=60)


def test_without_root_setup_prints_the_one_command_and_goes_on(tmp_path):
    fake = _fake_bin(tmp_path, uid=1000)
    done = _run(fake)
    assert done.returncode == 0, done.stderr
    assert "sudo apt-get install -y libaio-dev chromium libtcmalloc-minimal4" in done.stdout
    assert not (tmp_path / "apt.log").exists()  # nothing was tried without root
    strict = _run(fake, "--strict")
    assert strict.returncode == 1
    assert "still missing: libaio-dev chromium libtcmalloc-minimal4" in strict.stderr


def test_as_root_setup_installs_the_missing_packages_with_apt(tmp_path):
    fake = _fake_bin(tmp_path, uid=0)
    done = _run(fake)
    assert done.returncode == 0
    calls = (tmp_path / "apt.log").read_text().splitlines()
    assert calls == ["update -qq", "install -y -qq libaio-dev", "install -y -qq chromium",
                     "install -y -qq libtcmalloc-minimal4"]
    # the fake apt-get installed nothing: under --strict (CI) that fails the run
    assert _run(fake, "--strict").returncode == 1


def test_tcmalloc_listed_by_ldconfig_is_not_installed_again(tmp_path):
    listed = "\tlibtcmalloc_minimal.so.4 (libc6,x86-64) => /usr/lib/libtcmalloc_minimal.so.4"
    done = _run(_fake_bin(tmp_path, uid=1000, libraries=listed))
    assert "sudo apt-get install -y libaio-dev chromium\n" in done.stdout


def test_a_compile_is_recorded_beside_the_cache_and_shown_with_the_cached_op(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "_extension_folder", lambda name: tmp_path / name)
    doctor._record_build("cpu_adam", 61.94)
    assert doctor.build_times()["cpu_adam"]["seconds"] == 61.9
    cached = doctor.OpStatus("cpu_adam", "", False, True, loads=True, seconds=1.2, cached=True,
                             compiled_seconds=61.9)
    assert doctor.build_note(cached) == "cached; its compile took 62 s"
    fresh = doctor.OpStatus("cpu_adam", "", False, True, loads=True, seconds=60.0, cached=False)
    assert doctor.build_note(fresh) == "compiled"
    unknown = doctor.OpStatus("async_io", "", False, True, loads=True, seconds=1.0, cached=True)
    assert doctor.build_note(unknown) == "cached"


def test_the_tutorial_says_what_it_left_out_without_libaio(monkeypatch):
    from helpers import env

    monkeypatch.setattr(env, "libaio_available", lambda: False)
    lines = run_tutorial.left_out()
    assert len(lines) == 1 and "libaio-dev" in lines[0] and "apt-get install" in lines[0]
    monkeypatch.setattr(env, "libaio_available", lambda: True)
    assert run_tutorial.left_out() == []


def _make_variables(folder: Path) -> dict[str, str]:
    shown = subprocess.run(["make", "-p", "-n", "clean"], capture_output=True, text=True,
                           cwd=folder, timeout=60).stdout
    return {name.strip(): value.strip() for name, _, value in
            (line.partition(" := ") for line in shown.splitlines()) if _ and value}


def test_two_clones_share_one_environment_and_one_op_cache(tmp_path):
    """The shared environment's key is made of the Python, the requirements and the lock only (never the
    clone's path), so a second clone on the machine finds its packages and compiled ops."""
    clone = tmp_path / "another-clone"
    clone.mkdir()
    for name in ("Makefile", "requirements.txt", "requirements-lock.txt"):
        (clone / name).write_text((ROOT / name).read_text())
    here, there = _make_variables(ROOT), _make_variables(clone)
    assert here["SHARED"] == there["SHARED"] and here["OPS_STAMP"] == there["OPS_STAMP"]
    assert str(ROOT) not in here["SHARED"] and str(tmp_path) not in there["SHARED"]
    (clone / "requirements.txt").write_text((ROOT / "requirements.txt").read_text() + "six\n")
    assert _make_variables(clone)["SHARED"] != here["SHARED"]  # other packages: another env
    (clone / "requirements.txt").write_text((ROOT / "requirements.txt").read_text())
    (clone / "requirements-lock.txt").write_text((ROOT / "requirements-lock.txt").read_text().replace(
        "transformers==5.25.0", "transformers==5.26.0"))
    assert _make_variables(clone)["SHARED"] != here["SHARED"]  # a new lock: another env


def test_importing_the_kit_points_deepspeed_at_the_machines_ops_unless_told_otherwise(tmp_path):
    """A run started by hand (python -m helpers bench, a notebook outside make) finds the ops that
    make setup compiled, instead of compiling them again into DeepSpeed's own default folder."""
    import sys

    code = "import os, helpers; print(os.environ['TORCH_EXTENSIONS_DIR'])"
    base = {k: v for k, v in os.environ.items()
            if k not in {"TORCH_EXTENSIONS_DIR", "ZERO_KIT_CACHE"}}

    def seen(**extra) -> str:
        return subprocess.run([sys.executable, "-c", code], env={**base, **extra}, text=True,
                              capture_output=True, check=True, cwd=str(ROOT)).stdout.strip()

    assert seen(HOME=str(tmp_path)) == str(tmp_path / ".cache" / "zero-kit" / "torch_extensions")
    assert seen(ZERO_KIT_CACHE=str(tmp_path / "kit")) == str(tmp_path / "kit" / "torch_extensions")
    assert seen(TORCH_EXTENSIONS_DIR="/somewhere/else") == "/somewhere/else"


def test_workers_side_by_side_share_the_cores_as_openmp_threads(monkeypatch):
    import helpers

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    helpers.share_threads(1)  # alone: OpenMP's own default (every core)
    assert "OMP_NUM_THREADS" not in os.environ
    helpers.share_threads(2)
    assert os.environ["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # what the user set stays
    helpers.share_threads(16)
    assert os.environ["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    helpers.share_threads(16)  # more workers than cores: one thread each
    assert os.environ["OMP_NUM_THREADS"] == "1"
