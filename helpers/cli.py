"""Command lines that refuse a bad value up front, in one line: ``bench: --stage 5: choose 0, 1, 2 or 3``.

Only standard-library imports, so that helpers.bench, helpers.doctor and tools/ can all use it
without import cycles and ``--help`` stays fast. The ``type=`` functions here raise
``argparse.ArgumentTypeError("<value>: <what is wrong and the fix>")``; argparse prefixes the option
("argument --stage: ..."), and :class:`OneLineParser` turns that into ``<name>: --stage <value>: ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterable

_ARGUMENT = re.compile(r"argument (?P<opt>\S+): (?P<rest>.*)", re.S)
_CHOICE = re.compile(r"invalid choice: (?P<value>.*) \(choose from (?P<choices>.*)\)", re.S)
_TYPE = re.compile(r"invalid (?P<type>\S+) value: (?P<value>.*)", re.S)


def one_line(text: str) -> str:
    """``text`` with its lines joined by spaces (a message that must fit on one line)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def show(value: str) -> str:
    """A value as a message quotes it: numbers bare (``5``), anything else quoted (``'nosuch'``)."""
    return value if re.fullmatch(r"[+-]?\d+", value.strip()) else repr(value)


def listed(names: Iterable, last: str = ", ") -> str:
    """``a, b or c`` (with ``last=" or "``) or ``a, b, c``."""
    names = [str(n) for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + last + names[-1]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr, ``<name>: <message>``, and exit status 2.

    argparse's own ``error()`` prints the whole usage first; here the message names the option, the
    bad value and the fix, and ``--help`` still shows the usage. ``name`` is the short name the
    message starts with (default: ``prog``).
    """

    def __init__(self, *args, name: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.name = name or self.prog

    def error(self, message: str):
        self.exit(2, f"{self.name}: {_rephrase(one_line(message))}\n")


def _rephrase(message: str) -> str:
    """argparse's "argument --x: <value>: <why>" as "--x <value>: <why>"."""
    found = _ARGUMENT.fullmatch(message)
    if not found:
        return message
    opt, rest = found["opt"], found["rest"]
    if choice := _CHOICE.fullmatch(rest):
        return f"{opt} {choice['value']}: choose {choice['choices']}"
    if bad := _TYPE.fullmatch(rest):
        return f"{opt} {bad['value']}: not a valid {bad['type']}"
    return f"{opt} {rest}" if ": " in rest else f"{opt}: {rest}"


def whole_number(minimum: int = 1) -> Callable[[str], int]:
    """A ``type=`` function: a whole number >= ``minimum``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise argparse.ArgumentTypeError(f"{show(value)}: must be a whole number >= {minimum}")
        return number

    parse.__name__ = f"whole_number_from_{minimum}"
    return parse


positive_int = whole_number(1)


def one_of(choices: Iterable, kind: str = "") -> Callable[[str], object]:
    """A ``type=`` function: one of ``choices`` (ints or strings; the value is converted to their type).

    With ``kind`` the refusal reads "'x': unknown; <kind>: a, b, c"; without, "5: choose 0, 1, 2 or 3".
    """
    choices = list(choices)

    def parse(value: str):
        for choice in choices:
            if str(choice) == value.strip():
                return choice
        if kind:
            raise argparse.ArgumentTypeError(f"{show(value)}: unknown; {kind}: {listed(choices)}")
        raise argparse.ArgumentTypeError(f"{show(value)}: choose {listed(choices, ' or ')}")

    parse.__name__ = "one_of"
    return parse


@contextlib.contextmanager
def quiet():
    """Silence file descriptors 1 and 2 for a while (what DeepSpeed prints when a check imports it), then restore them.

    Exceptions still come out, after the restore; a refusal printed afterwards stays the only line."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(os.devnull, "w") as null:
            for fd in saved:
                os.dup2(null.fileno(), fd)
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def refuse(parser: argparse.ArgumentParser, option: str, value, why: str):
    """Exit through ``parser.error`` with "<option> <value>: <why>" (a check that needs several options)."""
    parser.error(f"{option} {show(str(value))}: {why}")
