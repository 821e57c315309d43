"""What the notebooks state as fact, held to the kit's estimator and to DeepSpeed 0.19.8's and
transformers 5.24's own code (issue 27, item 5): each test reads the statement where it is made
(a notebook's text or the helper that prints it) and fails when the two part."""

from __future__ import annotations

import json
import re

from helpers import memory
from helpers.lessons import gpu_check
from tools import nbtool


def markdown(stem: str) -> str:
    """Every markdown cell of a notebook, joined."""
    cells = json.loads((nbtool.NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]
    return "\n".join(nbtool.source(c) for c in cells if c["cell_type"] == "markdown")


# ---- pinned host memory: notebook 01 against helpers.memory ------------------------------------------


def test_notebook_01s_bytes_per_parameter_are_the_estimators():
    """Notebook 01 once said 2 bytes per parameter for pinned buffers where the estimator counts 6:
    its verdict now prints the estimator's own figures, which must add up to the limit's slope."""
    for pin in (False, True):
        kinds = gpu_check.offload_host_bytes_per_param(pin)
        low, high = (memory.cpu_offload_host_bytes(n, pin) for n in (10**9, 2 * 10**9))
        assert abs(sum(kinds.values()) - (high - low) / 10**9) < 0.05, (pin, kinds)
    pinned, plain = gpu_check.offload_host_bytes_per_param(True), gpu_check.offload_host_bytes_per_param(False)
    assert pinned["pinned buffers"] == memory.HOST_PINNED_BYTES and "pinned buffers" not in plain
    sentence = gpu_check.offload_host_sentence()
    assert f"{sum(plain.values()):g} bytes" in sentence and f"{sum(pinned.values()):g} bytes" in sentence
    assert f"{memory.HOST_PINNED_BYTES:g} more for pinned" in sentence


def test_notebook_01s_text_states_no_byte_count_of_its_own():
    """The figures come from the printed verdict only: no 'N bytes' or 'N more if ... pinned' in the
    prose, where they could drift from the estimator again."""
    text = markdown("01_gpu_check_and_install")
    assert not re.search(r"\d+ bytes|\d+ more if", text), re.findall(r".{40}\d+ (?:bytes|more if).{20}", text)
