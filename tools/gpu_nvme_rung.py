"""One rung of notebook 06's ladder, a ZeRO-3 + NVMe method only, exactly as the notebook runs it
(biggest_model.run_ladder with notebook 06's batch, steps and RAM budget), for a GPU session too short
for the whole ladder. Prints the disk's pace, the rung's row, its RSS phases, the estimator's verdict
and prediction beside the measurement, and the step-rise check.

    KIT_EMULATE=t4 python tools/gpu_nvme_rung.py SHAPE [weights]   # weights: "nvme" (default) or "gpu"
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import doctor, env, memory  # noqa: E402
from helpers.lessons import biggest_model  # noqa: E402

shape = sys.argv[1]
method = biggest_model.NVME if (sys.argv[2:] or ["nvme"])[0] == "nvme" else biggest_model.NVME_OPTIMIZER
env.emulate(None)
machine = env.describe()
doctor.apply_safe_fixes(machine)
path = str(env.default_offload_dir())
write, read = biggest_model.disk_bandwidth(path, megabytes=512)
info = memory.ModelInfo.for_shape(shape)
limit = env.ram_left_for_runs(machine)
print(f"{shape} {method}: {info.n_params:,} params, write {write:,.0f} MB/s, read {read:,.0f} MB/s; "
      f"killed past {limit / 1e9:.2f} GB ({machine.ram_budget_note()}); "
      f"GPU cap {(machine.gpu_cap_bytes or 0) / 2**30:.2f} GiB", flush=True)
biggest_model.METHODS = [m for m in biggest_model.METHODS if m[0] == method]
rungs = biggest_model.run_ladder([shape], machine, 4, 512, 5, path, env.libaio_available(),
                                 limit, headline=shape, progress=False)
r = rungs[0].result
print(biggest_model.nvme_table(rungs, write, read))
print(biggest_model.prediction_table(rungs, machine))
print(biggest_model.throughput_table(rungs, write, read))
print("step rise ok:", biggest_model.step_rise_ok(rungs[0]), "rise", biggest_model.step_rise(r),
      "limit", biggest_model.step_rise_limit(rungs[0]))
est = biggest_model.rung_estimate(rungs[0], machine)
print(json.dumps({"shape": shape, "method": method, "status": r.status, "message": r.message,
                  "losses": r.losses, "gpu": r.peak_gpu_allocated_bytes, "rss": r.peak_host_rss_bytes,
                  "nvme": r.peak_nvme_bytes, "s_step": r.median_step_s, "wall": r.wall_s,
                  "limit": limit, "verdict": biggest_model.rung_verdict(rungs[0], machine),
                  "predicted": {k: v for k, v in est.parts.items()} if est else None,
                  "phases": r.rss_phases, "write": write, "read": read}))
