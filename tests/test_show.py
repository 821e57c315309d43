"""helpers.show: text clipped at whole words, and no prose in the helpers cut by a bare slice."""

import re
from pathlib import Path

from helpers import show

ROOT = Path(__file__).resolve().parent.parent


def test_clip_keeps_short_text_and_cuts_long_text_at_a_whole_word():
    assert show.clip("out of GPU memory", 40) == "out of GPU memory"
    text = "Lower the micro batch, turn on gradient checkpointing, or a smaller model"
    clipped = show.clip(text, 60)
    assert len(clipped) <= 60 and clipped.endswith(" ...")
    assert clipped == "Lower the micro batch, turn on gradient checkpointing ..."
    assert not clipped.removesuffix(" ...").endswith("sm")
    assert show.clip("x" * 100, 10) == "xxxxxx ..."  # one long word: cut it, but say so


def test_a_status_cell_is_clipped_at_a_word():
    assert show.status_cell("error", "the quick brown fox jumps", width=14) == "error: the quick ..."
    assert show.status_cell("ok", "anything") == "ok"


#: A message, reason or line cut with a bare slice (``message[:90]``): mid-word text in a notebook.
_SLICED_PROSE = re.compile(r"\b(?:message|why|line|first|text|err\w*)\)?\[:\d+\]")


#: Slices that cut no prose: a parse's look at the start of a file.
_NOT_PROSE = {"text[:4000]"}


def sliced_prose(source: str) -> list[str]:
    return [hit for hit in _SLICED_PROSE.findall(source) if hit not in _NOT_PROSE]


def test_no_helper_cuts_prose_with_a_bare_slice():
    found = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "helpers").rglob("*.py"))
             if (hits := sliced_prose(p.read_text()))}
    assert found == {}


def test_the_slice_rule_finds_a_bare_slice():
    assert sliced_prose('f"advice: {oom.message[:90]}."') == ["message[:90]"]
    assert sliced_prose("show.clip(oom.message, 90)") == []


def test_a_tables_note_is_the_line_under_it_in_text_and_html():
    from helpers.show import Table

    table = Table(["a"], [["1"]], title="T", note="fixes: none <here>")
    assert str(table).splitlines()[-1] == "fixes: none <here>"
    assert table._repr_html_().endswith("</table><p>fixes: none &lt;here&gt;</p>")
    assert "<p>" not in Table(["a"], [["1"]])._repr_html_()
