"""CONTRIBUTING.md's layout section, rendered from helpers.LAYERS (the one list of the helpers' modules
and their layers), so that the two cannot drift apart (tests/test_layers.py compares them).

    python tools/layout.py           # rewrite CONTRIBUTING.md's layout block
    python tools/layout.py --check   # exit 1 when CONTRIBUTING.md's block differs from the rendering
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import helpers  # noqa: E402

CONTRIBUTING = ROOT / "CONTRIBUTING.md"
BEGIN = "<!-- layout: python tools/layout.py writes this block from helpers.LAYERS -->"
END = "<!-- end of layout -->"
INDENT = " " * 19

#: The folders around helpers/, as CONTRIBUTING.md describes them.
BEFORE = ["notebooks/         the tutorial, in order"]
AFTER = [
    "configs/           DeepSpeed JSON configs, one idea per file",
    "tests/             pytest tests of helpers, configs and notebook hygiene",
    "tools/             nbtool.py (check, sync, clear, regen notebooks; export helpers/taught.py),",
    f"{INDENT}ci_rules.py (a skip fails CI), run_tutorial.py (headless run; --check",
    f"{INDENT}compares checked cells as nbval does), layout.py (this block),",
    f"{INDENT}system_packages.sh (make setup's apt step),",
    f"{INDENT}python_floor.py (make setup's first step: the lock's oldest Python),",
    f"{INDENT}stated_figures.py (one value per meaning for the memory figures text and",
    f"{INDENT}printed outputs state; a pytest plugin like ci_rules.py);",
    f"{INDENT}the measurement campaign: calibrate_memory.py (the stage rows, predicted vs",
    f"{INDENT}measured), measure_memory_grid.py (the memory grid, merged into",
    f"{INDENT}helpers/memory_measurements.json), gpu_finetune.py (notebook 06's fine-tune",
    f"{INDENT}alone), gpu_nvme_rung.py (one ZeRO-Infinity rung), gpu_session.sh and",
    f"{INDENT}gpu_record_run.sh (GPU runs in the background), run_log.py (their JSON log)",
]


def render(layers: list[dict[str, str]] | None = None) -> str:
    """The layout block: the folders, and every module of helpers/ with its layer and its line."""
    layers = helpers.LAYERS if layers is None else layers
    core = [(i, name, what) for i, layer in enumerate(layers) for name, what in layer.items()
            if not name.startswith("lessons.")]
    lessons = [(i, name.removeprefix("lessons."), what) for i, layer in enumerate(layers)
               for name, what in layer.items() if name.startswith("lessons.")]
    def rows(modules: list[tuple[int, str, str]]) -> list[str]:
        width = max(len(name) for _, name, _ in modules)
        return [f"  {i:>2}  {name:<{width}}  {what}" for i, name, what in modules]

    lines = ["```", *BEFORE,
             "helpers/           the package the notebooks call, one module per concern, in one-way",
             f"{INDENT}layers (the number: a module imports only lower ones; helpers.LAYERS",
             f"{INDENT}lists them, tests/test_layers.py enforces them):",
             *rows(core),
             "helpers/lessons/   one module per notebook that needs one, named after it, above the core:",
             *rows(lessons),
             *AFTER, "```"]
    return "\n".join([BEGIN, *lines, END])


def layout_block(text: str) -> str:
    """The layout block CONTRIBUTING.md holds now (empty when its markers are missing)."""
    if BEGIN not in text or END not in text:
        return ""
    return text[text.index(BEGIN):text.index(END) + len(END)]


def main(argv: list[str] | None = None) -> int:
    """Rewrite CONTRIBUTING.md's block, or with ``--check`` say whether it is up to date."""
    args = sys.argv[1:] if argv is None else argv
    text = CONTRIBUTING.read_text()
    block = layout_block(text)
    if args == ["--check"]:
        ok = block == render()
        print("CONTRIBUTING.md's layout is up to date" if ok else "CONTRIBUTING.md's layout differs: "
              "run python tools/layout.py")
        return 0 if ok else 1
    if not block:
        print(f"CONTRIBUTING.md has no layout markers ({BEGIN})", file=sys.stderr)
        return 2
    CONTRIBUTING.write_text(text.replace(block, render()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
