"""One rung of notebook 06's ladder, a ZeRO-3 + NVMe method only, exactly as the notebook runs it
(biggest_model.run_ladder with notebook 06's batch, steps and RAM budget), for a GPU session too short
for the whole ladder. Prints the disk's pace, the rung's row, its RSS phases, the estimator's verdict
and prediction beside the measurement, and the step-rise check. Two levers for models past the
budget: ``--freeze-embeddings`` (the input embedding, and a head tied to it, does not train) and
``--fp16-master`` (DeepSpeed's ``fp16.fp16_master_weights_and_grads``: the optimizer's master
weights and gradients in fp16, so its swap buffers and gradient files in 2 bytes, not 4), and
``--sub-group-size`` (the optimizer's sub-groups, whose largest sets the swap buffers' size).
``--disk-margin`` sets the disk check's margin over the files expected (1.25). The rung is the
ladder's headline, so it also saves its 16-bit weights in shards and reloads them (the logits'
largest difference in the row and the JSON).

    KIT_EMULATE=t4 python tools/gpu_nvme_rung.py SHAPE [--weights nvme|gpu] [--freeze-embeddings]
        [--fp16-master] [--sub-group-size N] [--disk-margin X] [--steps N]
"""

import argparse
import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import config, doctor, env, memory  # noqa: E402
from helpers.lessons import biggest_model  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("shape")
parser.add_argument("--weights", choices=["nvme", "gpu"], default="nvme")
parser.add_argument("--freeze-embeddings", action="store_true")
parser.add_argument("--fp16-master", action="store_true")
parser.add_argument("--sub-group-size", type=int)
parser.add_argument("--disk-margin", type=float, default=biggest_model.DISK_MARGIN)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()

method, choice = next(m for m in biggest_model.METHODS
                      if m[0] == (biggest_model.NVME if args.weights == "nvme" else biggest_model.NVME_OPTIMIZER))
levers = [name for name, on in (("embedding frozen", args.freeze_embeddings),
                                ("fp16 master weights and grads", args.fp16_master),
                                (f"sub-groups of {args.sub_group_size:,}" if args.sub_group_size else "",
                                 args.sub_group_size)) if on]
if levers:
    method = f"{method}, {', '.join(levers)}"
    choice = {**choice, "freeze_embeddings": args.freeze_embeddings}
biggest_model.METHODS = [(method, choice)]
biggest_model.check_disk = functools.partial(biggest_model.check_disk, margin=args.disk_margin)
zero_infinity = config.zero_infinity


def with_levers(*a, **k):
    """The ladder's own ZeRO-Infinity config with this run's config levers set on it."""
    ds = zero_infinity(*a, **k)
    if args.fp16_master and ds["fp16"]["enabled"]:
        ds["fp16"]["fp16_master_weights_and_grads"] = True
    if args.sub_group_size:
        ds["zero_optimization"]["sub_group_size"] = args.sub_group_size
    return ds


config.zero_infinity = with_levers
env.emulate(None)
machine = env.describe()
doctor.apply_safe_fixes(machine)
path = str(env.default_offload_dir())
write, read = biggest_model.disk_bandwidth(path, megabytes=512)
info = memory.ModelInfo.for_shape(args.shape)
limit = env.ram_left_for_runs(machine)
print(f"{args.shape} {method}: {info.n_params:,} params, write {write:,.0f} MB/s, read {read:,.0f} MB/s; "
      f"killed past {limit / 1e9:.2f} GB ({machine.ram_budget_note()}); "
      f"GPU cap {(machine.gpu_cap_bytes or 0) / 2**30:.2f} GiB", flush=True)
rungs = biggest_model.run_ladder([args.shape], machine, 4, 512, args.steps, path, env.libaio_available(),
                                 limit, headline=args.shape, progress=False)
r = rungs[0].result
print(biggest_model.nvme_table(rungs, write, read))
print(biggest_model.prediction_table(rungs, machine))
print(biggest_model.throughput_table(rungs, write, read))
print("step rise ok:", biggest_model.step_rise_ok(rungs[0]), "rise", biggest_model.step_rise(r),
      "limit", biggest_model.step_rise_limit(rungs[0]))
est = biggest_model.rung_estimate(rungs[0], machine)
print(json.dumps({"shape": args.shape, "method": method, "status": r.status, "message": r.message,
                  "losses": r.losses, "gpu": r.peak_gpu_allocated_bytes, "rss": r.peak_host_rss_bytes,
                  "nvme": r.peak_nvme_bytes, "s_step": r.median_step_s, "wall": r.wall_s,
                  "step_times": r.step_times_s, "n_trainable": r.n_trainable, "n_params": r.n_params,
                  "skipped": r.skipped_steps, "limit": limit,
                  "verdict": biggest_model.rung_verdict(rungs[0], machine),
                  "predicted": {k: v for k, v in est.parts.items()} if est else None,
                  "phases": r.rss_phases, "write": write, "read": read,
                  "reload_logit_diff": r.reload_logit_diff, "saved_bytes": r.saved_bytes,
                  "save_s": r.save_s}))
