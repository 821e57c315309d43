"""The helpers' layers (helpers/__init__.py): every import points down, lazy ones included; every
module has a layer; no cycles. The checker itself is shown to fail on an upward import."""

import ast
from pathlib import Path

import helpers

HELPERS = Path(helpers.__file__).parent


def imported_helpers(source: str) -> set[str]:
    """The helpers modules a source imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "helpers":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("helpers."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("helpers.")}
    return found


def layer_of() -> dict[str, int]:
    return {name: i for i, layer in enumerate(helpers.LAYERS) for name in layer}


def upward_imports(name: str, source: str, layers: dict[str, int]) -> list[str]:
    """Imports of ``name`` that do not point to a lower layer."""
    return [f"{name} (layer {layers[name]}) imports {dep} (layer {layers.get(dep, '?')})"
            for dep in sorted(imported_helpers(source) - {name}) if layers.get(dep, 99) >= layers[name]]


def modules() -> dict[str, str]:
    return {p.stem: p.read_text() for p in HELPERS.glob("*.py") if p.stem != "__init__"}


def test_every_module_has_exactly_one_layer():
    listed = [name for layer in helpers.LAYERS for name in layer]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert sorted(listed) == sorted(modules()), set(listed) ^ set(modules())


def test_every_import_points_down():
    layers = layer_of()
    found = [line for name, source in modules().items() for line in upward_imports(name, source, layers)]
    assert found == []


def test_an_upward_import_is_caught_even_inside_a_function():
    layers = layer_of()
    lazy = "def f():\n    from helpers import matrix\n    return matrix\n"
    assert upward_imports("memory", lazy, layers) == ["memory (layer 3) imports matrix (layer 7)"]
    sideways = "from helpers import doctor\n"
    assert upward_imports("runner", sideways, layers) == ["runner (layer 6) imports doctor (layer 6)"]
    assert upward_imports("matrix", "from helpers import runner, show\n", layers) == []
