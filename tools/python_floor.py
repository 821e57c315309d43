"""The oldest Python the lock installs on, checked before make setup builds anything.

    python tools/python_floor.py [requirements-lock.txt]   # exit 0, or 2 with the fix

The floor is the lock's own line '# requires-python: >=X.Y.Z': the newest Requires-Python among the
locked packages (tests/test_lock.py checks it against their metadata, both ways). Without this check
an older Python (Debian 12's 3.11.2, say) meets pip's "resolution-too-deep" after minutes of
backtracking, a message that names neither the Python nor the package. Standard library only: it
runs under the Python that is about to be used, before anything is installed (annotations are
quoted so that an old Python reaches the message).
"""

import re
import sys
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "requirements-lock.txt"
_FLOOR_LINE = re.compile(r"^# requires-python: >=(\d+)\.(\d+)\.(\d+)(.*)$", re.M)


def lock_floor(lock: Path = LOCK) -> "tuple[tuple[int, int, int], str]":
    """The lock's Python floor and the reason it gives (the packages that set it)."""
    found = _FLOOR_LINE.search(lock.read_text())
    if not found:
        raise ValueError(f"{lock} has no '# requires-python: >=X.Y.Z' line")
    return (int(found[1]), int(found[2]), int(found[3])), found[4].strip(" ()")


def problem(version: "tuple[int, int, int]", lock: Path = LOCK) -> "str | None":
    """What is wrong with installing the lock on this Python version, and the fix; None if nothing."""
    floor, why = lock_floor(lock)
    if tuple(version) >= floor:
        return None
    have, need = ".".join(map(str, version)), ".".join(map(str, floor))
    return (f"setup: Python {have} ({sys.executable}) is older than the locked packages need: "
            f"{need} or newer ({why}; {lock.name}).\n"
            f"Fix: export PYTHON=python3.12 (any Python {need}+; Colab has 3.12), then make as "
            "before: every make command then uses it (the environment is keyed to the Python). Or "
            "install the kit's ranges into your own environment: pip install -r requirements.txt")


def main(argv: "list[str]") -> int:
    lock = Path(argv[0]) if argv else LOCK
    message = problem(tuple(sys.version_info[:3]), lock)
    if message:
        print(message, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
