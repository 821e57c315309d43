"""The helpers' layout (helpers.LAYERS in helpers/__init__.py): every import points down, lazy ones
included; every module has a layer; no cycles; lessons (helpers/lessons/) sit above the core and
the core never imports them. No module calls another's private name; one module starts training
runs; at most two build argument parsers; at most 16 core modules; CONTRIBUTING.md's layout is
rendered from the same list. Each checker is shown to fail on a bad example."""

import ast
import re
from pathlib import Path

import helpers
from tools import layout

HELPERS = Path(helpers.__file__).parent
ROOT = HELPERS.parent
#: An entry point a rank runs, named as a string ("helpers.runner:train_rank"): an import too.
ENTRY_POINT = re.compile(r"helpers((?:\.\w+)+):\w+")


def module_name(dotted: str) -> str | None:
    """``helpers.x`` or ``helpers.lessons.x`` (and anything inside them) as LAYERS names it."""
    parts = dotted.split(".")
    if parts[0] != "helpers" or len(parts) < 2:
        return None
    return f"lessons.{parts[2]}" if parts[1] == "lessons" and len(parts) > 2 else parts[1]


def imported_helpers(source: str) -> set[str]:
    """The helpers modules a source imports, at module level or inside functions, and the modules
    its entry-point strings name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module in ("helpers", "helpers.lessons"):
                found |= {module_name(f"{node.module}.{alias.name}") for alias in node.names}
            else:
                found.add(module_name(node.module))
        elif isinstance(node, ast.Import):
            found |= {module_name(a.name) for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if entry := ENTRY_POINT.fullmatch(node.value):
                found.add(module_name("helpers" + entry.group(1)))
    return found - {None, "lessons"}


def layer_of() -> dict[str, int]:
    return {name: i for i, layer in enumerate(helpers.LAYERS) for name in layer}


def upward_imports(name: str, source: str, layers: dict[str, int]) -> list[str]:
    """Imports of ``name`` that do not point to a lower layer."""
    return [f"{name} (layer {layers[name]}) imports {dep} (layer {layers.get(dep, '?')})"
            for dep in sorted(imported_helpers(source) - {name}) if layers.get(dep, 99) >= layers[name]]


def modules() -> dict[str, str]:
    """Every module of helpers/ and helpers/lessons/ by its LAYERS name, with its source."""
    core = {p.stem: p.read_text() for p in HELPERS.glob("*.py") if p.stem != "__init__"}
    lessons = {f"lessons.{p.stem}": p.read_text() for p in (HELPERS / "lessons").glob("*.py")
               if p.stem != "__init__"}
    return {**core, **lessons}


def core_modules() -> list[str]:
    """The core modules at helpers/'s top level (the ``python -m`` entry file not counted)."""
    return [name for name in modules() if not name.startswith(("lessons.", "__"))]


def test_every_module_has_exactly_one_layer_and_one_line():
    listed = [name for layer in helpers.LAYERS for name in layer]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert sorted(listed) == sorted(modules()), set(listed) ^ set(modules())
    assert all(what.strip() for layer in helpers.LAYERS for what in layer.values())


def test_every_import_points_down():
    layers = layer_of()
    found = [line for name, source in modules().items() for line in upward_imports(name, source, layers)]
    assert found == []


def test_lessons_sit_above_the_core():
    layers = layer_of()
    core = [i for name, i in layers.items() if not name.startswith("lessons.")]
    lessons = [i for name, i in layers.items() if name.startswith("lessons.")]
    assert lessons and max(core) < min(lessons)


def test_an_upward_import_is_caught_even_inside_a_function():
    layers = layer_of()
    lazy = "def f():\n    from helpers.lessons import stages_and_offload\n    return stages_and_offload\n"
    assert upward_imports("memory", lazy, layers) == [
        f"memory (layer 3) imports lessons.stages_and_offload (layer {layers['lessons.stages_and_offload']})"]
    assert upward_imports("runner", "import helpers.lessons.biggest_model\n", layers) != []
    assert upward_imports("runner", "ENTRY = 'helpers.lessons.gpu_check:run'\n", layers) != []
    sideways = "from helpers import doctor\n"
    assert upward_imports("runner", sideways, layers) == ["runner (layer 6) imports doctor (layer 6)"]
    beside = "from helpers.lessons import biggest_model\n"
    assert upward_imports("lessons.gpu_check", beside, layers) != []
    assert upward_imports("lessons.beyond_data_parallelism",
                          "from helpers.lessons import stages_and_offload\nfrom helpers import runner\n",
                          layers) == []


# ---- no module calls another's private name ------------------------------------------------------


def private_calls(source: str) -> list[str]:
    """``module._name`` uses (and ``from helpers.x import _name``) of another helpers module."""
    tree = ast.parse(source)
    aliases = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers"):
            for alias in node.names:
                if node.module in ("helpers", "helpers.lessons"):
                    aliases.add(alias.asname or alias.name)
                elif alias.name.startswith("_"):
                    found.append(f"from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name.startswith("helpers.") and a.asname}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_calls_another_modules_private_name():
    found = {name: calls for name, source in modules().items() if (calls := private_calls(source))}
    assert found == {}


def test_the_private_check_catches_one():
    assert private_calls("from helpers import runner\nrunner._child_env(1)\n") == ["runner._child_env"]
    assert private_calls("from helpers.runner import _merge\n") == ["from helpers.runner import _merge"]
    assert private_calls("from helpers import runner\nrunner.run_ranks\nself._x\n") == []


# ---- who starts processes, who parses command lines ----------------------------------------------

#: The rule: a training run (a process that builds an engine and trains, started with
#: ``subprocess.Popen`` and watched, or under ``torchrun``) is started by helpers.runner only.
#: Short commands that answer and end (``subprocess.run``: pip, apt, git, nvcc, ds_report, one
#: op's build, the libaio probe, an offline model saved) are allowed where they belong:
STARTS_TRAINING_RUNS = {"runner"}
RUNS_SHORT_COMMANDS = {"runner", "env", "colab", "doctor", "models"}


def starts_training_runs(source: str) -> bool:
    """``subprocess.Popen`` or ``torch.distributed.run`` (torchrun) in the source."""
    return bool(re.search(r"\bPopen\b|torch\.distributed\.run\b", source))


def runs_commands(source: str) -> bool:
    return bool(re.search(r"^\s*(import subprocess|from subprocess import)", source, re.M))


def test_one_module_starts_training_runs():
    assert {n for n, s in modules().items() if starts_training_runs(s)} == STARTS_TRAINING_RUNS
    assert {n for n, s in modules().items() if runs_commands(s)} <= RUNS_SHORT_COMMANDS


def test_the_process_check_catches_one():
    assert starts_training_runs("import subprocess\nsubprocess.Popen(['python', '-m', 'x'])\n")
    assert starts_training_runs('cmd = [sys.executable, "-m", "torch.distributed.run"]\n')
    assert not starts_training_runs("import subprocess\nsubprocess.run(['nvcc', '--version'])\n")


def builds_argument_parsers(source: str) -> bool:
    """An ``argparse.ArgumentParser`` (or subclass) made, or options added to one."""
    return bool(re.search(r"ArgumentParser\(|\.add_argument\(|\.add_subparsers\(", source))


def test_at_most_two_modules_build_argument_parsers():
    found = {n for n, s in modules().items() if builds_argument_parsers(s)}
    assert len(found) <= 2, found
    assert not builds_argument_parsers("import argparse\nraise argparse.ArgumentTypeError('x')\n")
    assert builds_argument_parsers("parser = cli.OneLineParser(prog='x')\nparser.add_argument('--x')\n")


def test_at_most_16_core_modules():
    """Hand-written ones: helpers/taught.py is generated from the notebooks (tools/nbtool.py export)."""
    hand_written = [name for name in core_modules() if name != "taught"]
    assert 0 < len(hand_written) <= 16, hand_written


# ---- CONTRIBUTING.md's layout comes from the same list ------------------------------------------------


def test_contributings_layout_is_rendered_from_the_layers():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert layout.layout_block(text) == layout.render(), "run python tools/layout.py"
    rendered = layout.render()
    for name in modules():
        assert re.search(rf"^\s+\d+\s+{re.escape(name.removeprefix('lessons.'))}\s", rendered, re.M), name


def test_the_rendering_follows_the_list():
    changed = [dict(layer) for layer in helpers.LAYERS]
    changed[0]["show"] = "something else"
    assert layout.render(changed) != layout.render()
