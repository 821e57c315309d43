"""pyproject.toml lists what the helpers import, with the same ranges as requirements.txt, and its
colab extra pins what requirements-colab.txt pins (and never torch, numpy or ipywidgets)."""

import ast
import re
import sys
import tomllib
from pathlib import Path

import helpers
from helpers import colab

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: import name -> distribution name, where they differ
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow"}
#: imported by the helpers but installed with another dependency (transformers brings these)
COMES_WITH = {"tokenizers", "safetensors", "numpy", "pydantic", "huggingface_hub"}


def requirement_lines(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            out[re.split(r"[<>=!~\[]", line)[0].strip().lower()] = line.replace(" ", "")
    return out


def third_party_imports() -> set[str]:
    found = set()
    for path in Path(helpers.__file__).parent.glob("*.py"):
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
