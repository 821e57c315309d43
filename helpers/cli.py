"""Every command line of the kit, ``python -m helpers <command>``: ``bench`` (one run measured),
``matrix`` (the stage and offload rows), ``doctor`` (ds_report explained, the ops prebuilt) and
``sizing`` (any model's memory per stage and offload). Each refuses a bad value up front, in one
line: ``bench: --stage 5: choose 0, 1, 2 or 3``, before a subprocess starts or DeepSpeed is imported.

The parts every command line uses (tools/ too) come first. The ``type=`` functions raise
``argparse.ArgumentTypeError("<value>: <what is wrong and the fix>")``; argparse prefixes the option
("argument --stage: ..."), and :class:`OneLineParser` turns that into ``<name>: --stage <value>: ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path

from helpers import config as kit_config
from helpers import doctor, models, runner, sizing
from helpers import env as kit_env

_ARGUMENT = re.compile(r"argument (?P<opt>\S+): (?P<rest>.*)", re.S)
_CHOICE = re.compile(r"invalid choice: (?P<value>.*) \(choose from (?P<choices>.*)\)", re.S)
_TYPE = re.compile(r"invalid (?P<type>\S+) value: (?P<value>.*)", re.S)


def one_line(text: str) -> str:
    """``text`` with its lines joined by spaces (a message that must fit on one line)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def quoted(value: str) -> str:
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
            raise argparse.ArgumentTypeError(f"{quoted(value)}: must be a whole number >= {minimum}")
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
            raise argparse.ArgumentTypeError(f"{quoted(value)}: unknown; {kind}: {listed(choices)}")
        raise argparse.ArgumentTypeError(f"{quoted(value)}: choose {listed(choices, ' or ')}")

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
    parser.error(f"{option} {quoted(str(value))}: {why}")


# ---- bench: one run, measured --------------------------------------------------------------------


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options every measuring command line shares (bench's and the matrix's): the model shape,
    the batch, the steps, the ranks, each validated by its type."""
    parser.add_argument("--shape", default="tiny", type=one_of(models.MODEL_SHAPES, "kit shapes"),
                        help=f"the model: {', '.join(models.MODEL_SHAPES)} (default: tiny)")
    parser.add_argument("--micro-batch", type=positive_int, default=2)
    parser.add_argument("--seq-len", type=whole_number(8), default=64)
    parser.add_argument("--steps", type=positive_int, default=4)
    parser.add_argument("--world-size", type=positive_int, default=1)
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def refuse_more_ranks_than_gpus(parser: argparse.ArgumentParser, world_size: int) -> None:
    """Exit in one line when ``world_size`` ranks need more GPUs than this machine has."""
    machine = kit_env.describe()
    if world_size > 1 and machine.has_gpu and machine.gpu_count < world_size:
        refuse(parser, "--world-size", world_size,
                   f"needs {world_size} GPUs, this machine has {machine.gpu_count}: use --world-size "
                   f"{machine.gpu_count}, or a machine with more GPUs (Kaggle: GPU T4 x2)")


def bench_command(argv: list[str]) -> int:
    """``python -m helpers bench``: one run measured. Every bad value is refused here, in one line on stderr and exit status 2,
    before a subprocess starts or DeepSpeed is imported (a ``--config`` file is checked with
    DeepSpeed's own classes, still before any run)."""
    parser = OneLineParser(prog="python -m helpers bench", name="bench",
                               description="Measure one DeepSpeed config on a kit model shape, in a subprocess.")
    parser.add_argument("--config", type=_config_path,
                        help="a DeepSpeed JSON config file or a preset of configs/ (e.g. zero2); "
                             "else built from the options below")
    parser.add_argument("--stage", type=one_of((0, 1, 2, 3)), default=2, choices=(0, 1, 2, 3))
    parser.add_argument("--offload-optimizer", default="none", type=one_of(kit_config.OFFLOAD_DEVICES),
                        choices=kit_config.OFFLOAD_DEVICES)
    parser.add_argument("--offload-param", default="none", type=one_of(kit_config.OFFLOAD_DEVICES),
                        choices=kit_config.OFFLOAD_DEVICES, help="needs --stage 3")
    parser.add_argument("--precision", default="auto", type=one_of(kit_config.PRECISIONS),
                        choices=kit_config.PRECISIONS)
    add_run_options(parser)
    args = parser.parse_args(argv)
    _refuse_combinations(parser, args)
    if args.config:
        ds_config = _engine_config(parser, args)
    else:
        ds_config = kit_config.build(stage=args.stage, offload_optimizer=args.offload_optimizer,
                                     offload_param=args.offload_param, precision=args.precision,
                                     micro_batch=args.micro_batch, world_size=args.world_size, trainer=False)
    spec = runner.RunSpec(ds_config=ds_config, shape=args.shape, seq_len=args.seq_len, steps=args.steps,
                          grad_ckpt=args.grad_ckpt)
    result = runner.measure(spec)
    print(json.dumps(asdict(result), indent=1) if args.json else runner.results_table([result]))
    return 0 if result.status == runner.OK else 1


def _config_path(value: str) -> str:
    """``--config``'s type: a file that exists, or a preset name of configs/ (as helpers.config.load reads it)."""
    path = Path(value)
    preset = not path.exists() and not path.suffix and (kit_config.CONFIG_DIR / f"{value}.json").is_file()
    if path.is_file() or preset:
        return value
    presets = ", ".join(p.stem for p in sorted(kit_config.CONFIG_DIR.glob("*.json")))
    what = "a folder, not a file" if path.exists() else "no such file"
    raise argparse.ArgumentTypeError(f"{value!r}: {what}; give a JSON file or a preset: {presets}")


def _refuse_combinations(parser: argparse.ArgumentParser, args) -> None:
    """The checks that need several options; each exits through ``parser.error`` in one line."""
    if not args.config and args.offload_param != "none" and args.stage != 3:
        refuse(parser, "--offload-param", args.offload_param,
                   f"parameter offload needs --stage 3 (this is --stage {args.stage}); "
                   f"or offload only the optimizer: --offload-optimizer {args.offload_param}")
    refuse_more_ranks_than_gpus(parser, args.world_size)


def _engine_config(parser: argparse.ArgumentParser, args) -> dict:
    """``--config`` read and checked (helpers.config.load), its "auto" values filled for deepspeed.initialize,
    and checked again with the run's world size; a config with errors is refused in one line."""

    def refuse_config(err_text: str) -> None:
        first, *rest = [line.strip() for line in err_text.splitlines() if line.strip()] or [""]
        why = " ".join([first, " | ".join(x.lstrip("- ") for x in rest)]).strip()
        refuse(parser, "--config", args.config, why)

    loaded, failed, filled, errors = None, "", {}, []
    with quiet():  # importing DeepSpeed for the checks prints a line or two
        try:
            loaded = kit_config.load(args.config)
        except kit_config.ConfigError as err:
            failed = str(err)
        if loaded is not None:
            filled = kit_config.for_engine(loaded, micro_batch=args.micro_batch, world_size=args.world_size,
                                           precision=None if args.precision == "auto" else args.precision)
            errors = [p for p in kit_config.check(filled, for_trainer=False, world_size=args.world_size)
                      if p.level == "error"]
    if failed:
        refuse_config(failed)
    if errors:
        refuse_config(f"with --micro-batch {args.micro_batch} --world-size {args.world_size}, {len(errors)} error(s):\n"
                      + "\n".join(f"- {p}" for p in errors))
    return filled


# ---- matrix: the stage and offload rows ----------------------------------------------------------


def _rows_option(value: str) -> list[str]:
    """``--only``'s type: comma-separated rows of :data:`helpers.config.STAGE_ROWS`."""
    known = [label for label, _ in kit_config.STAGE_ROWS]
    rows = [x.strip() for x in value.split(",") if x.strip()]
    unknown = [x for x in rows if x not in known]
    if unknown or not rows:
        what = f"unknown matrix row(s) {', '.join(map(repr, unknown))}" if unknown else "names no matrix row"
        raise argparse.ArgumentTypeError(f"{value!r}: {what}; choose from {', '.join(map(repr, known))}")
    return rows


def matrix_command(argv: list[str]) -> int:
    """``python -m helpers matrix``, notebook 05's stage and offload rows from a terminal: every row (or ``--only`` some), a table of measured and predicted
    bytes, and each rank's bytes. Bad options end in one line and exit status 2."""
    parser = OneLineParser(prog="python -m helpers matrix", name="matrix",
                               description="Run notebook 05's stage and offload matrix, each row in a subprocess.")
    add_run_options(parser)
    parser.add_argument("--only", type=_rows_option,
                        help="a comma-separated list of rows, e.g. 'stage 0,stage 3'")
    args = parser.parse_args(argv)
    refuse_more_ranks_than_gpus(parser, args.world_size)
    machine = kit_env.describe()
    kinds = [dict(kit_config.STAGE_ROWS)[label] for label in args.only] if args.only else None
    rows = runner.run_matrix(args.shape, machine, args.micro_batch, args.seq_len, args.steps, grad_ckpt=args.grad_ckpt,
                             nvme_ready=kit_env.libaio_available(), kinds=kinds, world_size=args.world_size,
                             progress=False)
    if args.json:
        print(json.dumps([asdict(r.result) for r in rows], indent=1))
    else:
        print(runner.rows_table(rows, machine))
        print(runner.ranks_table(rows))
    return 0 if all(runner.explained(r.result) for r in rows) else 1


# ---- doctor: ds_report explained -----------------------------------------------------------------


def doctor_command(argv: list[str]) -> int:
    """``python -m helpers doctor``: ds_report explained (notebook 02), or ``--prebuild`` the ops."""
    parser = OneLineParser(prog="python -m helpers doctor", name="doctor",
                               description="ds_report explained: ops, diagnoses, verdict")
    parser.add_argument("--prebuild", action="store_true", help="compile and load each op the kit uses")
    parser.add_argument("--jobs", type=int, default=1, help="with --prebuild: ops built side by side")
    parser.add_argument("--ops-only", action="store_true",
                        help="with --prebuild: print the ops table only; exit 1 unless every op loads")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--load", metavar="OP", help=argparse.SUPPRESS)  # used by build_op's subprocess
    args = parser.parse_args(argv)
    if args.load:
        with quiet():  # DeepSpeed's import prints; the op list needs it
            known = doctor.op_builder(args.load) is not None
        if not known:
            refuse(parser, "--load", args.load, "no such DeepSpeed op on this accelerator; "
                       f"the kit's ops: {', '.join(doctor.OP_PURPOSE)}")
        return doctor.load_in_this_process(args.load)
    environment = kit_env.describe()
    doctor.apply_safe_fixes(environment)
    if args.prebuild and args.ops_only:
        statuses = doctor.prebuild(progress=False, jobs=args.jobs)
        print(doctor.ops_table(statuses))
        return 0 if all(s.loads for s in statuses) else 1
    facts = doctor.gather_facts(environment)
    found = doctor.diagnose(facts)
    statuses = (doctor.prebuild(progress=False, jobs=args.jobs) if args.prebuild
                else doctor.op_report(environment=environment))
    rows = doctor.verdict(facts, statuses, found)
    if args.json:
        print(json.dumps({"facts": asdict(facts), "ops": [asdict(s) for s in statuses],
                          "diagnoses": [asdict(d) for d in found], "verdict": rows}, indent=1, default=str))
    else:
        print(doctor.ops_table(statuses), doctor.diagnoses_table(found), doctor.verdict_table(rows), sep="\n\n")
    return 0


# ---- sizing: any model's memory per stage and offload --------------------------------------------


def sizing_command(argv: list[str]) -> int:
    """``python -m helpers sizing``: the size table for one model; bad options and unknown models end in one line,
    exit 2."""
    parser = OneLineParser(
        prog="python -m helpers sizing",
        name="sizing",
        description="Predict a model's GPU, host and disk memory per ZeRO stage and offload.",
    )
    parser.add_argument(
        "--model", required=True, help="a kit shape, a local model folder, or a Hub name"
    )
    parser.add_argument("--micro-batch", type=positive_int, default=4)
    parser.add_argument("--seq-len", type=whole_number(8), default=512)
    parser.add_argument("--grad-ckpt", action="store_true")
    parser.add_argument("--world-size", type=positive_int, default=1)
    parser.add_argument(
        "--freeze-embeddings",
        action="store_true",
        help="the input embedding (and a head tied to it) does not train: no gradient, no optimizer"
             " state (notebook 06's lever for a 3B model on free Colab)",
    )
    parser.add_argument(
        "--save-in-shards",
        action="store_true",
        help="the weights saved after training, in 1 GB shards (notebook 06's save_16bit_in_shards):"
             " the host RAM it holds counted where it is the peak",
    )
    parser.add_argument(
        "--ranks-per-host",
        type=positive_int,
        default=None,
        help="ranks sharing one host's RAM and disk (default: one per GPU of the machine)",
    )
    parser.add_argument(
        "--emulate",
        type=one_of(["t4", "none"]),
        default=None,
        help="t4: the verdict for a free Colab T4 (its GPU less the CUDA context; 12.7 GB of RAM"
             " less the VM's own use and this process's RSS)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also print DeepSpeed's and Accelerate's estimates beside the kit's",
    )
    args = parser.parse_args(argv)
    if args.compare and args.freeze_embeddings:
        refuse(parser, "--compare", "with --freeze-embeddings",
               "DeepSpeed's and Accelerate's estimators size every parameter trained: drop one")
    try:
        with quiet():
            info, hf = sizing.resolve(args.model)
    except sizing.SizingError as err:
        refuse(parser, "--model", args.model, str(err))
    if why := sizing.seq_len_problem(info, args.seq_len):
        refuse(parser, "--seq-len", args.seq_len, why)
    machine = sizing.machine_for(None if args.emulate == "none" else args.emulate)
    if why := sizing.ranks_problem(machine, args.world_size, args.ranks_per_host):
        refuse(parser, "--ranks-per-host", args.ranks_per_host, why)
    sizes = (args.micro_batch, args.seq_len, args.grad_ckpt, args.world_size)
    print(sizing.size_table(info, machine, *sizes, ranks_per_host=args.ranks_per_host,
                            frozen_embeddings=args.freeze_embeddings,
                            save_in_shards=args.save_in_shards))
    print(sizing.verdict_line(machine))
    if args.compare:
        with quiet():
            table = sizing.side_by_side(info, hf, machine, *sizes, ranks_per_host=args.ranks_per_host)
        print()
        print(table)
        print(sizing.ACCELERATE_NOTE)
    return 0


#: Every command, ``python -m helpers <command> [options]``.
COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "bench": bench_command, "matrix": matrix_command, "doctor": doctor_command, "sizing": sizing_command,
}


def main(argv: list[str] | None = None) -> int:
    """``python -m helpers <command> ...``: run one of :data:`COMMANDS`; without one, or with an
    unknown one, say which there are (one line, exit status 2)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] not in COMMANDS:
        what = f"unknown command {quoted(args[0])}" if args and not args[0].startswith("-") else "no command"
        print(f"python -m helpers: {what}; choose {listed(COMMANDS, ' or ')} (then --help)", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    return COMMANDS[args[0]](args[1:])
