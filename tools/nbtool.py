"""Notebook maintenance: hygiene checks, setup-cell and badge sync, output clearing and regeneration.

    python tools/nbtool.py check            # what the hygiene test checks, as a list of problems
    python tools/nbtool.py sync             # rewrite setup cells and Colab badges from helpers/colab.py
    python tools/nbtool.py clear [NB ...]   # drop outputs except on '# NBVAL_CHECK_OUTPUT' cells
    python tools/nbtool.py regen [NB ...]   # run in smoke mode, keep outputs only on checked cells
    python tools/nbtool.py export           # write helpers/taught.py from the cells tagged export

Rules (CONTRIBUTING.md, "Working on the notebooks"): a stored output needs an execution count;
only checked cells keep outputs; every checked cell has one; markers are spelled exactly.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from helpers import colab  # noqa: E402

NOTEBOOKS = ROOT / "notebooks"
CHECK_MARKER = "# NBVAL_CHECK_OUTPUT"
KNOWN_MARKERS = {"NBVAL_CHECK_OUTPUT", "NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP", "NBVAL_RAISES_EXCEPTION"}
_MARKER_LIKE = re.compile(r"^\s*#\s*(nbval\w*.*)$", re.M | re.I)


#: The generated module of the lesson definitions the kit's own code calls (see :func:`render_taught`).
TAUGHT = ROOT / "helpers" / "taught.py"
EXPORT_TAG = "export"
_TAUGHT_HEAD = '''"""The lesson code the kit's own runs call, generated from the notebooks: every function a
cell tagged "export" defines, as the cell writes it, headed by its notebook and cell. Do not edit:
edit the notebook's cell, then run  python tools/nbtool.py export  (tests/test_taught.py fails
while this file and the notebooks differ). Each cell's imports come along; nothing else of it runs.
"""
'''


def render_taught(paths: list[Path] | None = None) -> str:
    """helpers/taught.py as the notebooks' export cells make it: each cell's imports and function
    definitions, verbatim (comments included), in notebook and cell order."""
    blocks = []
    for path in paths or notebook_paths():
        cells = json.loads(path.read_text())["cells"]
        for index, cell in enumerate(cells):
            if cell.get("cell_type") != "code" or EXPORT_TAG not in cell.get("metadata", {}).get("tags", []):
                continue
            text = source(cell)
            nodes = [n for n in ast.parse(text).body if isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef))]
            if not any(isinstance(n, ast.FunctionDef) for n in nodes):
                raise ValueError(f"{path.name}, cell {index}: tagged {EXPORT_TAG!r} but defines no function")
            imports = [ast.get_source_segment(text, n) for n in nodes if not isinstance(n, ast.FunctionDef)]
            functions = [ast.get_source_segment(text, n) for n in nodes if isinstance(n, ast.FunctionDef)]
            head = f"# ---- {path.relative_to(ROOT).as_posix()}, cell {index} "
            blocks.append("\n".join([head.ljust(100, "-"), *imports]) + ("\n\n" if imports else "\n")
                          + "\n\n\n".join(functions))
    return _TAUGHT_HEAD + "".join(f"\n\n{block}\n" for block in blocks)


#: The longest code line a notebook cell may hold.
MAX_LINE = 100


def notebook_paths(args: list[str] | None = None) -> list[Path]:
    """The notebooks named, or every notebook under notebooks/ in order."""
    if args:
        return [Path(a).resolve() for a in args]
    return sorted(p for p in NOTEBOOKS.glob("*.ipynb"))


def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_checked(cell: dict) -> bool:
    """True for a code cell with '# NBVAL_CHECK_OUTPUT' alone on a line."""
    return cell.get("cell_type") == "code" and any(
        line.strip() == CHECK_MARKER for line in source(cell).splitlines()
    )


def problems(path: Path) -> list[str]:
    """Every hygiene rule a notebook breaks, one sentence each."""
    rel = path.relative_to(ROOT).as_posix()
    try:
        nb = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        return [f"{rel}: not a readable notebook ({err})"]
    out = []
    kernel = nb.get("metadata", {}).get("kernelspec", {}).get("name")
    if kernel != "python3":
        out.append(f"{rel}: kernelspec is {kernel!r}, not 'python3'")
    if "widgets" in nb.get("metadata", {}):
        out.append(f"{rel}: widget state stored in the metadata (run: python tools/nbtool.py clear)")
    cells = nb.get("cells", [])
    if not cells or cells[0].get("cell_type") != "markdown":
        out.append(f"{rel}: the first cell must be the markdown title cell")
    elif colab.badge_markdown(rel) not in source(cells[0]):
        out.append(f"{rel}: the title cell lacks the Colab badge for its own path ({colab.colab_url(rel)})")
    setups = [c for c in cells if source(c).startswith(colab.SETUP_MARKER)]
    if len(setups) != 1:
        out.append(f"{rel}: expected one generated setup cell, found {len(setups)}")
    elif source(setups[0]) != colab.setup_cell_source():
        out.append(f"{rel}: the setup cell differs from helpers/colab.py (run: python tools/nbtool.py sync)")
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in cells):
        out.append(f"{rel}: no cell is tagged 'parameters'")
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        text, outputs = source(cell), cell.get("outputs", [])
        long = [n for n, line in enumerate(text.splitlines(), 1) if len(line) > MAX_LINE]
        if long:
            out.append(f"{rel} cell {i}: line {long[0]} is over {MAX_LINE} characters (code lines stay readable "
                       "in Colab without scrolling)")
        for found in _MARKER_LIKE.finditer(text):
            marker = found.group(1).strip()
            if marker not in KNOWN_MARKERS:
                out.append(f"{rel} cell {i}: marker {marker!r} is not one nbval knows (so it does nothing)")
            elif found.group(0).strip() != f"# {marker}":
                out.append(f"{rel} cell {i}: write the marker as '# {marker}' alone on its line")
        if is_checked(cell):
            if not outputs:
                out.append(f"{rel} cell {i}: NBVAL_CHECK_OUTPUT with no stored output checks nothing")
            if cell.get("execution_count") is None:
                out.append(f"{rel} cell {i}: checked cell has no execution count (nbval fails it)")
        elif outputs:
            out.append(f"{rel} cell {i}: outputs stored on an unchecked cell (run: python tools/nbtool.py clear)")
        elif cell.get("execution_count") is not None:
            out.append(f"{rel} cell {i}: execution count stored on an unchecked cell")
    return out


def clear(nb: dict) -> dict:
    """Drop outputs and counts except on checked cells; drop stderr streams everywhere; drop the
    widget state a run leaves in the notebook's metadata (progress bars: run output, not source)."""
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        if is_checked(cell):
            cell["outputs"] = [o for o in cell.get("outputs", []) if o.get("name") != "stderr"]
        else:
            cell["outputs"], cell["execution_count"] = [], None
        cell.get("metadata", {}).pop("execution", None)
    return nb


def sync(nb: dict, rel: str) -> dict:
    """Rewrite the setup cell and the title cell's badge from helpers/colab.py."""
    cells = nb["cells"]
    for cell in cells:
        if source(cell).startswith(colab.SETUP_MARKER):
            cell["source"] = colab.setup_cell_source()
    title = source(cells[0])
    badge = colab.badge_markdown(rel)
    if "[![Open In Colab]" in title:
        title = re.sub(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)", lambda _m: badge, title)
    else:
        title = badge + "\n\n" + title
    cells[0]["source"] = title
    return nb


def regen(path: Path, timeout: int = 1800) -> None:
    """Execute a notebook in smoke mode (CPU) and store outputs only on its checked cells."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    os.environ["KIT_SMOKE"] = "1"
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nbformat.from_dict(clear(json.loads(nbformat.writes(nb)))), path)


def _rewrite(path: Path, change) -> None:
    nb = json.loads(path.read_text())
    nb = change(nb)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["check", "sync", "clear", "regen", "export"])
    parser.add_argument("notebooks", nargs="*")
    args = parser.parse_args(argv)
    paths = notebook_paths(args.notebooks)
    if args.command == "export":
        TAUGHT.write_text(render_taught())
        print(f"export: {TAUGHT.relative_to(ROOT).as_posix()}")
        return 0
    if args.command == "check":
        found = [p for path in paths for p in problems(path)]
        print("\n".join(found) or f"{len(paths)} notebooks clean")
        return 1 if found else 0
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        if args.command == "sync":
            _rewrite(path, lambda nb: sync(nb, rel))
        elif args.command == "clear":
            _rewrite(path, clear)
        else:
            regen(path)
        print(f"{args.command}: {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
