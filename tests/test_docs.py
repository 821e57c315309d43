"""The learner's README and the docs around it: short, the badges on its first screen, and every
file they (or the code) name exists. Each rule is shown to fail on a bad example."""

import re
import subprocess
from pathlib import Path

from helpers import colab

ROOT = Path(__file__).resolve().parent.parent
#: The README a learner reads: at most this many lines, every badge within the first screen.
README_MAX_LINES = 150
FIRST_SCREEN_LINES = 40
_MD_NAME = re.compile(r"[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.md\b")


def readme_problems(text: str, notebooks: list[str]) -> list[str]:
    """What keeps ``text`` from being the learner's README: too long, or a notebook's Colab badge
    missing from its first screen."""
    lines = text.splitlines()
    out = [f"{len(lines)} lines, more than {README_MAX_LINES}"] if len(lines) > README_MAX_LINES else []
    first = "\n".join(lines[:FIRST_SCREEN_LINES])
    out += [f"no badge for {nb} in the first {FIRST_SCREEN_LINES} lines" for nb in notebooks
            if colab.badge_markdown(nb) not in first]
    return out


def missing_md_files(path: Path, text: str) -> list[str]:
    """Markdown files ``text`` names (``docs/setup.md``, ``../README.md``) that exist neither beside
    ``path`` nor at the repository's root."""
    return sorted({name for name in _MD_NAME.findall(text)
                   if not (path.parent / name).exists() and not (ROOT / name).exists()})


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if Path(n).suffix in {".md", ".py", ".ipynb", ".sh", ".json",
                                                          ".toml", ".txt"} and (ROOT / n).is_file()]


def _notebooks() -> list[str]:
    return sorted(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_readme_is_short_and_shows_every_notebook_on_its_first_screen():
    assert len(_notebooks()) >= 9
    assert readme_problems((ROOT / "README.md").read_text(), _notebooks()) == []


def test_a_long_readme_or_a_late_badge_fails():
    notebooks = _notebooks()
    good = (ROOT / "README.md").read_text()
    assert readme_problems(good + "more\n" * README_MAX_LINES, notebooks)[0].endswith(
        f"more than {README_MAX_LINES}")
    late = "\n" * FIRST_SCREEN_LINES + good
    assert len(readme_problems(late, notebooks)) == len(notebooks)


def test_every_markdown_file_the_kit_names_exists():
    files = [f for f in _tracked_text_files() if f != Path(__file__).resolve()]  # its examples
    assert len(files) > 50
    missing = {str(f.relative_to(ROOT)): m for f in files
               if (m := missing_md_files(f, f.read_text(errors="replace")))}
    assert missing == {}


def test_a_named_file_that_is_not_there_is_found(tmp_path):
    assert missing_md_files(ROOT / "docs" / "setup.md", "see gpu_runs.md and ../README.md") == []
    assert missing_md_files(ROOT / "helpers" / "memory.py", "see NOTES.md and docs/x.md") == [
        "NOTES.md", "docs/x.md"]


_NEXT = re.compile(r"Next: (\d\d) ·")


def next_problems(texts: dict[int, str]) -> list[str]:
    """Where the "Next: NN ·" links of notebook N (its cells and its lesson module) do not go to
    N + 1, or the last notebook points anywhere."""
    last = max(texts)
    out = []
    for number, text in sorted(texts.items()):
        found = {int(n) for n in _NEXT.findall(text)}
        wanted = set() if number == last else {number + 1}
        if found != wanted:
            out.append(f"{number:02d} points to {sorted(found)}, not {sorted(wanted)}")
    return out


def _notebook_texts() -> dict[int, str]:
    texts = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        # its lesson module (named after it: gpu_check for 01_gpu_check_and_install); 02's is doctor
        modules = [m for m in (ROOT / "helpers" / "lessons").glob("*.py")
                   if m.stem != "__init__" and path.stem[3:].startswith(m.stem)]
        if path.stem.startswith("02_"):
            modules.append(ROOT / "helpers" / "doctor.py")
        texts[int(path.stem[:2])] = path.read_text() + "".join(m.read_text() for m in modules)
    return texts


def test_every_notebook_says_next_is_the_one_after_it():
    texts = _notebook_texts()
    assert len(texts) >= 9 and next_problems(texts) == []


def test_a_link_back_or_from_the_last_notebook_fails():
    assert next_problems({7: "Next: 05 · stages", 8: "Next: 09 · x", 9: ""}) == [
        "07 points to [5], not [8]"]
    assert next_problems({8: "Next: 09 · x", 9: "Next: 06 · the biggest"}) == [
        "09 points to [6], not []"]


def test_every_deepspeed_fix_has_a_row_in_the_docs_table():
    from helpers import deepspeed_fixes

    gaps = (ROOT / "docs/deepspeed_gaps.md").read_text()
    table = gaps[gaps.index("## The kit's fixes"):gaps.index("## Each gap, measured")]
    rows = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert rows == [fix.__name__ for _, fix in deepspeed_fixes.FIXES]


#: A kit run or issue cited by number: "run 19", "runs 12 and 14", "issue 43" (an upstream project's
#: issue is cited with its name: "DeepSpeed issue 4872", "PEFT issues 2500", "colabtools#5448").
_KIT_NUMBER = re.compile(r"(?<!DeepSpeed )(?<!PEFT )(?<!upstream )\b(?:runs?|issues?) \d+\b"
                         r"(?! (?:ranks?|processes|GPUs?|steps?|times)\b)", re.IGNORECASE)


def kit_numbers(text: str) -> list[str]:
    """The kit's own run and issue numbers ``text`` cites (meaningless to whoever reads it later)."""
    return [m.group(0) for m in _KIT_NUMBER.finditer(text)]


def test_library_code_and_learner_prose_cite_no_run_or_issue_numbers():
    """helpers/ and the notebooks' cells say what was measured and when, not "run 19"."""
    import json

    found = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "helpers").rglob("*.py"))
             if (n := kit_numbers(p.read_text()))}
    for nb in _notebooks():
        cells = json.loads((ROOT / nb).read_text())["cells"]
        prose = "\n".join("".join(c["source"]) for c in cells)  # the prose and the code's comments
        if n := kit_numbers(prose):
            found[nb] = n
    assert found == {}


def test_a_cited_run_or_issue_number_is_found():
    assert kit_numbers("measured (docs/gpu_runs.md run 19); see runs 12 and 14, issue 43") == [
        "run 19", "runs 12", "issue 43"]
    assert kit_numbers("DeepSpeed issue 4872, PEFT issues 2500; runs 2 ranks with gloo; 2026-12-02") == []
