"""Notebook 06's fine-tune alone: its cells up to the ladder, run headless as the notebook runs them
(the same kernel, the same cells), for a GPU run that the whole ladder would outlast.

    KIT_EMULATE=t4 python tools/gpu_finetune.py [--out build/finetune] [--set NAME=VALUE ...]

Writes the executed part as ``OUT/06_finetune.ipynb`` and prints each code cell's output; exits 1 if
a cell failed. The part ends at the markdown cell that opens the ladder ("How far it climbs"), and
takes the "Colab life" section (the resume from the kept weights) from the notebook's end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools import run_tutorial  # noqa: E402

NOTEBOOK = ROOT / "notebooks" / "06_biggest_model_on_a_t4.ipynb"
LADDER_HEADING = "## How far it climbs"
COLAB_LIFE_HEADING = "## Colab life"


def finetune_part(path: Path = NOTEBOOK, overrides: list[str] | None = None):
    """The notebook's cells before the ladder's heading and its "Colab life" section, as a notebook
    of its own; ``overrides`` ("NAME=VALUE", VALUE a Python literal) are assigned in a cell after
    the parameters cell, as papermill injects parameters."""
    import ast

    import nbformat

    nb = nbformat.read(path, as_version=4)
    end = next(i for i, c in enumerate(nb.cells) if c.source.startswith(LADDER_HEADING))
    life = next(i for i, c in enumerate(nb.cells) if c.source.startswith(COLAB_LIFE_HEADING))
    life_end = next(i for i in range(life + 1, len(nb.cells))
                    if nb.cells[i].cell_type == "markdown" and nb.cells[i].source.startswith("## "))
    cells = nb.cells[:end] + nb.cells[life:life_end]
    if overrides:
        lines = []
        for item in overrides:
            name, _, value = item.partition("=")
            lines.append(f"{name.strip()} = {ast.literal_eval(value.strip())!r}")
        at = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
        cells.insert(at + 1, nbformat.v4.new_code_cell("# injected by tools/gpu_finetune.py\n"
                                                       + "\n".join(lines)))
    # the part's own checks, asserted as the notebook's Checks cell would
    cells.append(nbformat.v4.new_code_cell(
        "from helpers import claims as kit_claims\n"
        "kit_claims.assert_all(finetune_claims\n"
        "                      + [lesson.resume_claim(resumed_loss, losses, kept_steps, first_step),\n"
        "                         deepspeed_fixes.lesson_claim([ds_config], in_kernel=True,\n"
        "                                                      on_cpu=not torch.cuda.is_available(),\n"
        "                                                      destroys=True)])"))
    nb.cells = cells
    return nb


def main(argv: list[str] | None = None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "build" / "finetune"))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a parameter to override, e.g. --set OFFLOAD_PARAMS=False")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    part = out / "src" / "06_finetune.ipynb"
    part.parent.mkdir(exist_ok=True)
    nbformat.write(finetune_part(overrides=args.set), part)
    # run in notebooks/ as the notebook itself would be
    staged = NOTEBOOK.parent / ".06_finetune_part.ipynb"
    staged.write_text(part.read_text())
    try:
        ok, seconds, error = run_tutorial.run_one(staged, out, timeout=3600)
    finally:
        staged.unlink(missing_ok=True)
    executed = nbformat.read(out / staged.name, as_version=4)
    for i, cell in enumerate(executed.cells):
        if cell.cell_type == "code":
            text = "".join(o.get("text", "") if o.get("name") == "stdout"
                           else o.get("data", {}).get("text/plain", "") + "\n" for o in cell.outputs
                           if o.get("name") == "stdout" or o.get("output_type") in
                           ("execute_result", "display_data"))
            print(f"--- cell {i}\n{text.rstrip()}")
    print(f"fine-tune part: {'passed' if ok else 'FAILED: ' + error} in {seconds:.1f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
