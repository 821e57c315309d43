"""One value per meaning for the memory figures a learner reads: a T4's GPU memory (and what
PyTorch's allocator has of it), free Colab's RAM, the VM's own share of it and the RAM a run has,
wherever the kit states or prints them.

Each meaning has the phrases that name it (:data:`MEANINGS`) and the figures the kit's T4 profile
(``helpers.env.EMULATIONS["t4"]``) allows for it. tests/test_stated_facts.py holds the kit's text
to it (notebook cells, the README, the helpers' strings); as a pytest plugin (loaded by the root
conftest.py) this module reads every notebook cell's outputs as nbval runs it and fails the session
when a printed figure disagrees. Figures measured on the machine at hand (this kernel's RSS, the
RAM free now) have no phrase here: they differ from machine to machine by design.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

_FIGURE = r"(?P<value>\d+(?:\.\d+)?) ?(?P<unit>GiB|GB)\b"
#: Each meaning the kit's text names a figure for, with the phrases that name it (case-sensitive).
MEANINGS: dict[str, list[str]] = {
    "a T4's GPU memory, as CUDA reports it": [
        rf"T4's {_FIGURE}", rf"on a T4 \({_FIGURE}", rf"past {_FIGURE} fail",
        rf"(?:T4|Colab)[^.\n]{{0,40}}?\b{_FIGURE} of GPU", rf"GPU under its {_FIGURE}",
        rf"limits \({_FIGURE} and"],
    "what PyTorch's allocator has on a T4 (its memory less the CUDA context)": [
        rf"{_FIGURE} PyTorch has on a T4"],
    "free Colab's RAM": [
        rf"Colab's {_FIGURE}", rf"free Colab \({_FIGURE}", rf"on free Colab {_FIGURE}",
        rf"free Colab as the budget for later host-RAM checks: {_FIGURE}",
        rf"{_FIGURE} of RAM (?:runs out|$|\")", rf"Colab T4: [^\n]{{0,40}}? and {_FIGURE} of RAM",
        rf"GiB and {_FIGURE} under T4", rf"{_FIGURE} \(Colab T4's RAM\)"],
    "the VM's own use of that RAM": [rf"{_FIGURE} that the VM", rf"VM uses about {_FIGURE}",
                                     rf"{_FIGURE} \(the VM's own use"],
    "the RAM a run has on free Colab": [rf"{_FIGURE} of RAM left for a run",
                                        rf"tight \([\d.]+ of {_FIGURE}\)"],
}
#: Where each process of a pytest session writes the figures its notebook cells printed.
DIR_VARIABLE = "KIT_PRINTED_FIGURES_DIR"


def canonical_figures() -> dict[str, set[str]]:
    """The figures each meaning may be stated as: the kit's T4 profile (helpers.env), formatted."""
    from helpers import env

    t4, gib, gb = env.EMULATIONS["t4"], env.GiB, env.GB
    return {"a T4's GPU memory, as CUDA reports it": {f"{t4.gpu_bytes / gib:.2f} GiB"},
            "what PyTorch's allocator has on a T4 (its memory less the CUDA context)":
                {f"{t4.gpu_cap_bytes / gib:.2f} GiB"},
            "free Colab's RAM": {f"{t4.ram_bytes / gb:.1f} GB"},
            "the VM's own use of that RAM": {f"{t4.vm_overhead_bytes / gb:.1f} GB"},
            "the RAM a run has on free Colab": {f"{t4.ram_budget_bytes / gib:.1f} GiB",
                                                f"{t4.ram_budget_bytes / gb:.1f} GB"}}


def figures_by_meaning(texts: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """meaning -> figure as written -> where (text name), for every phrase of :data:`MEANINGS`."""
    found: dict[str, dict[str, list[str]]] = {meaning: {} for meaning in MEANINGS}
    for where, text in texts.items():
        for meaning, phrases in MEANINGS.items():
            for phrase in phrases:
                for m in re.finditer(phrase, text, flags=re.MULTILINE):
                    figure = f"{m.group('value')} {m.group('unit')}"
                    found[meaning].setdefault(figure, []).append(where)
    return found


def disagreements(found: dict[str, dict[str, list[str]]]) -> list[str]:
    """One line per figure that is not what the kit's T4 profile says for its meaning."""
    allowed = canonical_figures()
    return [f"{meaning}: {figure} in {', '.join(sorted(set(where)))} (the kit's T4 profile: "
            f"{' or '.join(sorted(allowed[meaning]))})"
            for meaning, figures in found.items() for figure, where in figures.items()
            if figure not in allowed[meaning]]


def printed_text(outputs: list[dict]) -> str:
    """What a notebook cell's outputs show as text: streams, plain text and Markdown."""
    parts = []
    for output in outputs:
        if output.get("output_type") == "stream":
            parts.append(str(output.get("text", "")))
        data = output.get("data") or {}
        parts += [str(data[kind]) for kind in ("text/plain", "text/markdown") if kind in data]
    return "\n".join(parts)


# ---- the pytest plugin: printed outputs, collected from every process of the session -------------
def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the main process: its workers inherit the folder
        os.environ.setdefault(DIR_VARIABLE, tempfile.mkdtemp(prefix="kit_printed_figures_"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    yield
    outputs = getattr(item, "test_outputs", None)  # an nbval cell, once it ran
    if call.when == "call" and outputs and os.environ.get(DIR_VARIABLE):
        text = printed_text(outputs)
        if text:
            record = {"where": f"{Path(str(item.path)).stem}: {item.name}", "text": text}
            out = Path(os.environ[DIR_VARIABLE]) / f"{os.getpid()}.jsonl"
            with out.open("a") as f:
                f.write(json.dumps(record) + "\n")


def read_printed(folder: Path) -> dict[str, str]:
    """Every cell's printed text the session's processes recorded in ``folder``, by cell, in the
    cells' order (not the order the processes, named by their pids, happened to write them)."""
    texts: dict[str, str] = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            texts[record["where"]] = texts.get(record["where"], "") + "\n" + record["text"]
    return dict(sorted(texts.items()))


_found: list[str] = []  # the disagreements
_listed: list[str] = []  # every printed figure with a meaning, one line per meaning


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    folder = os.environ.get(DIR_VARIABLE)
    if hasattr(session.config, "workerinput") or not folder or not Path(folder).is_dir():
        return
    printed = read_printed(Path(folder))
    shutil.rmtree(folder, ignore_errors=True)
    found = figures_by_meaning(printed)
    _listed.extend(f"{meaning}: " + "; ".join(f"{figure} in {len(set(where))} cell(s)"
                                              for figure, where in sorted(figures.items()))
                   for meaning, figures in found.items() if figures)
    _found.extend(disagreements(found))
    if _found and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    if _listed:
        terminalreporter.section("memory figures the notebooks printed, by meaning", sep="-")
        for line in _listed:
            terminalreporter.write_line(line)
    if _found:
        terminalreporter.section("printed figures that disagree with the kit's T4 profile",
                                 sep="=", red=True, bold=True)
        for line in _found:
            terminalreporter.write_line(line)
