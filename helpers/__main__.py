"""``python -m helpers <command>``: the kit's command lines (helpers.cli: bench, matrix, doctor,
sizing), and ``python -m helpers worker <spec.json>``, one rank of a run as helpers.runner starts it
(before any command line is imported)."""

import sys


def main(argv: list[str] | None = None) -> int:
    """``worker`` to helpers.runner, every other command to helpers.cli."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "worker":
        from helpers import runner

        return runner.worker(args[1])
    from helpers import cli

    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
