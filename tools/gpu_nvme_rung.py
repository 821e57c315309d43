"""One rung of notebook 06's ladder, ZeRO-3 + NVMe only, exactly as the notebook runs it
(biggest_model.run_ladder with notebook 06's batch, steps and RAM budget), for a GPU session too short
for the whole ladder. Prints the disk's pace, the rung's row, its RSS phases and the step-rise check.

    KIT_EMULATE=t4 python tools/gpu_nvme_rung.py gpt2-2.7b
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import doctor, env, memory  # noqa: E402
from helpers.lessons import biggest_model  # noqa: E402

shape = sys.argv[1]
env.emulate(None)
machine = env.describe()
doctor.apply_safe_fixes(machine)
path = str(env.default_offload_dir())
write, read = biggest_model.disk_bandwidth(path, megabytes=512)
info = memory.ModelInfo.for_shape(shape)
print(f"{shape}: {info.n_params:,} params, write {write:,.0f} MB/s, read {read:,.0f} MB/s, "
      f"bound {biggest_model.predicted_nvme_step_s(info, write, read):.2f} s/step", flush=True)
biggest_model.METHODS = [m for m in biggest_model.METHODS if m[1].get("offload_param") == "nvme"]
rungs = biggest_model.run_ladder([shape], machine, 4, 512, 5, path, env.libaio_available(),
                            machine.ram_budget_bytes, headline=shape, progress=False)
r = rungs[0].result
print(biggest_model.nvme_table(rungs, write, read))
print("step rise ok:", biggest_model.step_rise_ok(r, info.n_params), "rise", biggest_model.step_rise(r))
print(json.dumps({"shape": shape, "status": r.status, "message": r.message, "losses": r.losses,
                  "gpu": r.peak_gpu_allocated_bytes, "rss": r.peak_host_rss_bytes,
                  "nvme": r.peak_nvme_bytes, "s_step": r.median_step_s, "wall": r.wall_s,
                  "phases": r.rss_phases, "write": write, "read": read}))
