"""The lesson cells' own definitions, for tests that exercise them: the functions a notebook
teaches (notebook 04's ``training_args`` and ``train_or_advise``), run as the notebook defines
them, not a copy in helpers/."""

from __future__ import annotations

import ast
import json
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def definitions(source: str) -> str:
    """A cell's imports, functions and UPPER_CASE assignments, without the statements that run."""
    keep = [node for node in ast.parse(source).body
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef))
            or isinstance(node, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)]
    return "\n".join(ast.unparse(node) for node in keep)


def lesson_sources(stem: str) -> list[str]:
    """The sources of the cells tagged ``lesson`` in ``notebooks/<stem>.ipynb``, in order."""
    cells = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]
    return ["".join(c["source"]) for c in cells if "lesson" in c["metadata"].get("tags", [])]


def lesson_functions(stem: str, names: list[str], **values) -> dict:
    """A namespace holding ``values`` (the parameters the lesson reads) and the definitions of each
    lesson cell that defines one of ``names``; fails when a name is defined by no lesson cell."""
    namespace = dict(values)
    for name in names:
        cell = next((s for s in lesson_sources(stem) if f"def {name}(" in s), None)
        assert cell is not None, f"no lesson cell of {stem} defines {name}"
        exec(definitions(cell), namespace)
    return namespace


def parameter(stem: str, name: str):
    """The literal value ``notebooks/<stem>.ipynb``'s parameters cell assigns to ``name``."""
    cells = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]
    source = "".join(next(c["source"] for c in cells if "parameters" in c["metadata"].get("tags", [])))
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"the parameters cell of {stem} assigns no literal {name}")
