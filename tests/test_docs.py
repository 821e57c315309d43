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
