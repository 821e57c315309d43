"""pyproject.toml lists what the helpers import, with the same ranges as requirements.txt, and its
colab extra pins what requirements-colab.txt pins (and never torch, numpy or ipywidgets)."""

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import helpers
from helpers import colab

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow"}
#: imported by the helpers but installed with another dependency (transformers brings these;
#: DeepSpeed brings py-cpuinfo, whose use by its op builders deepspeed_fixes.fix_cpu_info_once mends)
COMES_WITH = {"tokenizers", "safetensors", "numpy", "pydantic", "huggingface_hub", "cpuinfo"}


def requirement_lines(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            out[re.split(r"[<>=!~\[]", line)[0].strip().lower()] = line.replace(" ", "")
    return out


def third_party_imports() -> set[str]:
    found = set()
    for path in Path(helpers.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            found |= {n.split(".")[0] for n in names}
    stdlib = set(sys.stdlib_module_names) | {"helpers", "google", "tools", "IPython"}
    return {DISTRIBUTION.get(n, n).lower() for n in found - stdlib}


def test_every_third_party_import_of_the_helpers_is_a_dependency():
    declared = {re.split(r"[<>=!~\\[]", d)[0].lower() for d in PROJECT["dependencies"]}
    assert third_party_imports() - declared - COMES_WITH == set()


def test_dependencies_have_the_ranges_of_requirements_txt():
    pinned = requirement_lines(ROOT / "requirements.txt")
    for dep in PROJECT["dependencies"]:
        name = re.split(r"[<>=!~\[]", dep)[0].lower()
        assert pinned.get(name) == dep.replace(" ", ""), (dep, pinned.get(name))


def test_the_colab_extra_pins_what_requirements_colab_pins_and_keeps_colabs_own():
    extra = {re.split(r"[<>=!~\[]", d)[0].lower(): d for d in PROJECT["optional-dependencies"]["colab"]}
    assert extra == requirement_lines(ROOT / "requirements-colab.txt")
    assert not set(extra) & set(colab.KEEP_AS_IS)


def test_pip_install_gives_a_kit_that_runs_outside_the_repository(tmp_path):
    """`pip install .` (here into a target folder, the dependencies already installed) then, from
    another folder: every helper module imports, the presets load, install hints keep their ranges,
    and `python -m helpers doctor --help` answers."""
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    probe = ("import importlib, pkgutil, helpers\n"
             "assert 'site' in helpers.__file__, helpers.__file__\n"
             "for m in pkgutil.iter_modules(helpers.__path__): importlib.import_module('helpers.' + m.name)\n"
             "from helpers import colab, config\n"
             "print(sorted(config.presets()))\n"
             "print(colab.install_command('deepspeed'))\n")
    child = {**os.environ, "PYTHONPATH": str(target)}
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=child,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    presets, command = ran.stdout.strip().splitlines()[-2:]
    assert "zero2" in presets and "zero3_nvme" in presets
    ranges = command.removeprefix('pip install "deepspeed').rstrip('"').split(",")
    assert command.startswith('pip install "deepspeed') and {">=0.19.5", "<0.20"} <= set(ranges)
    doctor = subprocess.run([sys.executable, "-m", "helpers", "doctor", "--help"], capture_output=True, text=True,
                            cwd=tmp_path, env=child, timeout=300)
    assert doctor.returncode == 0 and "ds_report" in doctor.stdout
