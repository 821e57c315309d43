"""Measure the stage/offload matrix on GPT-2-shaped models and print predicted vs measured memory.

    KIT_EMULATE=t4 python tools/calibrate_memory.py --shapes gpt2-124m gpt2-355m --out runs.jsonl

What helpers.memory's constants were checked against (docs/gpu_runs.md keeps the figures).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import cli, config, env, memory, runner  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from helpers.models import MODEL_SHAPES

    parser = cli.OneLineParser(description=__doc__, name="calibrate_memory",
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["gpt2-124m", "gpt2-355m"],
                        type=cli.one_of(MODEL_SHAPES, "kit shapes"),
                        help=f"model shapes to measure, of {', '.join(MODEL_SHAPES)}")
    parser.add_argument("--rows", nargs="*", type=cli.one_of([label for label, _ in config.STAGE_ROWS], "matrix rows"),
                        help="matrix labels to run (default: all)")
    parser.add_argument("--micro-batch", type=cli.positive_int, default=4)
    parser.add_argument("--seq-len", type=cli.whole_number(8), default=512)
    parser.add_argument("--steps", type=cli.positive_int, default=4)
    parser.add_argument("--out", default="calibration.jsonl", help="a JSON-lines file the rows are appended to")
    args = parser.parse_args(argv)
    if Path(args.out).is_dir() or not Path(args.out).resolve().parent.is_dir():
        why = "is a folder" if Path(args.out).is_dir() else "its folder does not exist"
        cli.refuse(parser, "--out", args.out, f"{why}: give a file in an existing folder")
    machine = env.describe()
    out = open(args.out, "a")
    for shape in args.shapes:
        info = memory.ModelInfo.for_shape(shape)
        for label, choice in config.STAGE_ROWS:
            if args.rows and label not in args.rows:
                continue
            ds = config.for_row(choice, info, machine, args.micro_batch)
            spec = runner.RunSpec(ds_config=ds, shape=shape, seq_len=args.seq_len, steps=args.steps, grad_ckpt=True, label=f"{shape} {label}",
                                 zero_init=choice["stage"] == 3 and "nvme" in choice.values())
            result = runner.measure(spec)
            est = memory.estimate(info, ds, micro_batch=args.micro_batch, seq_len=args.seq_len, grad_ckpt=True,
                                  on_gpu=machine.has_gpu)
            row = {"shape": shape, "label": label, "predicted_gpu": est.total("gpu"), "predicted_cpu": est.total("cpu"),
                   "predicted_parts": est.parts, **asdict(result)}
            out.write(json.dumps(row) + "\n")
            out.flush()
            gpu = result.peak_gpu_allocated_bytes
            print(f"{spec.label:40s} {result.status:18s} gpu pred {est.total('gpu') / 2**30:6.2f} meas "
                  f"{'-' if gpu is None else f'{gpu / 2**30:6.2f}'}  host pred {est.total('cpu') / 2**30:6.2f} meas "
                  f"{result.peak_host_rss_bytes / 2**30:6.2f}  s/step {result.median_step_s or 0:.2f}  "
                  f"loss {result.losses[:1]} -> {result.losses[-1:]}  {result.message[:120]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
