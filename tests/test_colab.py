"""helpers.colab: the setup cell, badges, and the packages Colab lacks."""

import re
from pathlib import Path

from helpers import colab

ROOT = Path(__file__).resolve().parent.parent


def test_setup_cell_is_valid_python_and_names_the_repo_once():
    source = colab.setup_cell_source()
    compile(source, "setup-cell", "exec")
    assert source.startswith(colab.SETUP_MARKER)
    assert source.count(colab.REPO_URL) == 1


def test_badge_points_at_the_notebook_in_the_repo():
    badge = colab.badge_markdown("notebooks/01_gpu_check_and_install.ipynb")
    assert badge.endswith("(https://colab.research.google.com/github/zero-kit/zero-kit/blob/main/"
                          "notebooks/01_gpu_check_and_install.ipynb)")


def test_prepare_does_nothing_outside_colab(monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("prepare() ran pip outside Colab")

    monkeypatch.setattr(colab.subprocess, "run", no_pip)
    assert colab.prepare().startswith("not on Colab")


def test_colab_install_pins_everything_and_leaves_colabs_own_packages_alone():
    lines = [l.split("#")[0].strip() for l in colab.COLAB_REQUIREMENTS.read_text().splitlines()]
    lines = [l for l in lines if l]
    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", l) for l in lines)
    names = {l.split("==")[0].lower() for l in lines}
    assert not names & set(colab.KEEP_AS_IS)
    kept = colab.keep_constraints()
    assert any(c.startswith("torch==") for c in kept)
    command = colab.pip_command("/tmp/c.txt")
    assert command[-2:] == ["-c", "/tmp/c.txt"] and str(colab.COLAB_REQUIREMENTS) in command


def test_colab_pins_fall_inside_the_kits_ranges():
    from packaging.requirements import Requirement

    ranges = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            ranges[req.name.lower()] = req.specifier
    checked = []
    for line in colab.COLAB_REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            if name.lower() in ranges:  # the others are the Hugging Face stack's own needs, at the lock's
                checked.append(name)
                assert version in ranges[name.lower()], f"{line} is outside requirements.txt's {ranges[name.lower()]}"
    assert {"deepspeed", "transformers", "peft"} <= set(checked)


def test_on_colab_the_setup_installs_libaio_once_and_reports_a_failure(monkeypatch):
    import subprocess

    calls = []

    def fake(installed, apt_rc=0):
        def run(cmd, **kw):
            calls.append(cmd)
            rc = 0 if cmd[0] == "dpkg" and installed else 1 if cmd[0] == "dpkg" else apt_rc
            return subprocess.CompletedProcess(cmd, rc, "", "E: no space left" if rc else "")
        return run

    assert "already there" in colab.install_system_packages(fake(True))
    assert all(c[0] == "dpkg" for c in calls)  # nothing installed twice
    calls.clear()
    assert colab.install_system_packages(fake(False)) == "installed libaio-dev (NVMe offload)"
    assert "apt-get install -y -qq libaio-dev" in calls[-1][-1]
    failed = colab.install_system_packages(fake(False, apt_rc=100))
    assert "could not install libaio-dev" in failed and "no space left" in failed
