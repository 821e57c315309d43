#!/usr/bin/env bash
# The GPU record run of notebooks 05, 06 and 08 (docs/gpu_runs.md), on a machine with 2 GPUs, in T4 emulation.
# Long jobs run in the background (setsid) so that they outlast one command; `wait` follows them.
#   source .whl/install-on-gpu.sh; bash tools/gpu_record_run.sh start [05] [cli] [06] [nbval-a] [nbval-05] [nbval-06] [nbval-08] [nbval-09] [grid] [rung-2.7b]
#   bash tools/gpu_record_run.sh wait 500
#   bash tools/gpu_record_run.sh wait 560      # again, until it prints "all done"; results land in $OUT
# Each call must end on its own, inside its limit (start + ops build take about 90 s: "wait 420" in the
# first call), and the next call must follow within the machine's idle release (30 s): a call killed at
# its limit, or a longer pause, gives the machine back and its jobs and results with it (run 15).
set -u
# DeepSpeed's ops where every run of the kit looks for them (helpers/__init__.py's default): built
# once below, never inside a measured run
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/zero-kit/torch_extensions}"
W=/tmp/kit_gpu
# Every run and probe the notebooks report goes to the file KIT_BENCH_LOG names (tools/run_log.py).
export KIT_REPORT_TO=tools.run_log:append
export KIT_EMULATE=t4 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "$1" in
start)
  mkdir -p $W
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; df -h /tmp | tail -1
  python3 -c 'import torch, deepspeed; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "gpus", torch.cuda.device_count())'
  # Build DeepSpeed's three JIT ops side by side, once, before the jobs share them.
  t=$SECONDS
  for op in FusedAdamBuilder CPUAdamBuilder AsyncIOBuilder; do
    python3 -c "from deepspeed.ops.op_builder import $op as B; B().load()" > $W/build_$op.log 2>&1 &
  done
  wait; echo "ops built in $((SECONDS - t)) s"; grep -h -i "error" $W/build_*.log | head -5
  # A: notebook 05 on both GPUs (1-GPU matrix, then the 2-GPU section). A2: the command line, 2 GPUs, 124M.
  # B: notebook 06's ladder on GPU 1, up to GPT-2 XL.
  jobs=" ${*:2} "; [ "$jobs" = "  " ] && jobs=" 05 cli 06 "
  # nbval: notebooks under pytest --nbval-lax, as CI runs them but in full mode on the GPU.
  # "nbval-a": 01-04 and 07 one after the other; "nbval-05" and "nbval-06" beside them.
  nbval() {  # name, notebooks...
    local name=$1; shift
    KIT_BENCH_LOG=$W/runs_$name.jsonl KIT_OFFLOAD_DIR=/tmp/kit_nvme_$name setsid nohup python3 -m pytest -q -p no:cacheprovider \
      --durations=0 "$@" > $W/job_$name.log 2>&1 < /dev/null &
  }
  # With two GPUs, the 1-GPU work of lanes a and 05 goes to GPU 1 (device order "1,0"), so that GPU 0
  # keeps room for the grid's six processes; 05's and 08's 2-rank runs use both.
  ngpu=$(nvidia-smi -L | wc -l); flip=$([ "$ngpu" -ge 2 ] && echo "1,0" || echo "0")
  [[ $jobs == *" nbval-a "* ]] && CUDA_VISIBLE_DEVICES=$flip nbval a notebooks/01_gpu_check_and_install.ipynb notebooks/02_ds_report.ipynb \
    notebooks/03_config_builder.ipynb notebooks/04_zero2_training.ipynb notebooks/07_engine_and_accelerate.ipynb
  [[ $jobs == *" nbval-05 "* ]] && CUDA_VISIBLE_DEVICES=$flip nbval 05 notebooks/05_stages_and_offload.ipynb
  # 06's ladder climbs to its headline, 2.7B (about 20 minutes), on GPU 1 when there are two.
  [[ $jobs == *" nbval-06 "* ]] && CUDA_VISIBLE_DEVICES=$(( $(nvidia-smi -L | wc -l) - 1 )) \
    nbval 06 notebooks/06_biggest_model_on_a_t4.ipynb
  # 08 uses both GPUs (2-rank pipeline, MoE and AutoTP runs): start it alone, or beside 1-GPU lanes only.
  [[ $jobs == *" nbval-08 "* ]] && nbval 08 notebooks/08_beyond_data_parallelism.ipynb
  # 09's measured runs share one GPU with nothing else: their step times are its benchmark.
  [[ $jobs == *" nbval-09 "* ]] && CUDA_VISIBLE_DEVICES=$flip nbval 09 notebooks/09_zero_or_lora.ipynb
  # The memory grid of issue 16 (tools/measure_memory_grid.py), 6 cases at a time on GPU 0. It resumes
  # $W/grid.jsonl: copy the recorded rows there first (tools/grid_runs/); KIT_GRID_ARGS adds options.
  [[ $jobs == *" grid "* ]] && CUDA_VISIBLE_DEVICES=0 KIT_OFFLOAD_DIR=/tmp/kit_nvme_grid setsid nohup python3 \
    tools/measure_memory_grid.py --out $W/grid.jsonl --parallel ${KIT_GRID_PARALLEL:-6} --limit-minutes ${KIT_GRID_MINUTES:-7} ${KIT_GRID_ARGS:-} \
    > $W/job_grid.log 2>&1 < /dev/null &
  [[ $jobs == *" 05 "* ]] && KIT_BENCH_LOG=$W/runs05.jsonl setsid nohup python3 tools/run_tutorial.py --check --out $W/tutorial \
    notebooks/05_stages_and_offload.ipynb > $W/job05.log 2>&1 < /dev/null &
  [[ $jobs == *" cli "* ]] && KIT_BENCH_LOG=$W/runscli.jsonl setsid nohup python3 -m helpers matrix --world-size 2 --shape gpt2-124m \
    --micro-batch 4 --seq-len 512 --grad-ckpt --steps 4 --only "stage 0,stage 1,stage 2,stage 3,stage 2 + CPU offload" \
    > $W/jobcli.log 2>&1 < /dev/null &
  [[ $jobs == *" 06 "* ]] && CUDA_VISIBLE_DEVICES=1 KIT_LADDER_MINUTES=0 KIT_OFFLOAD_DIR=/tmp/kit_nvme06 KIT_BENCH_LOG=$W/runs06.jsonl setsid nohup python3 tools/run_tutorial.py \
    --check --out $W/tutorial notebooks/06_biggest_model_on_a_t4.ipynb > $W/job06.log 2>&1 < /dev/null &
  # "rung-2.7b": notebook 06's 2.7B NVMe rung with its own disk probe (tools/gpu_nvme_rung.py), alone on
  # the disk: it starts once the other jobs have ended (about 7 minutes). The brackets keep the loop's
  # own command line from matching its pattern.
  [[ $jobs == *" rung-2.7b "* ]] && KIT_BENCH_LOG=$W/runs_rung.jsonl KIT_OFFLOAD_DIR=/tmp/kit_nvme_rung setsid nohup bash -c \
    'sleep 5; while pgrep -f "[r]un_tutorial.py|[h]elpers.matrix|[p]ytest|[m]easure_memory_grid" > /dev/null; do sleep 5; done
     python3 tools/gpu_nvme_rung.py gpt2-2.7b' > $W/job_rung.log 2>&1 < /dev/null &
  sleep 2; echo "jobs started";;
wait)
  end=$((SECONDS + ${2:-500}))
  while [ $SECONDS -lt $end ]; do
    running=$(pgrep -f "run_tutorial.py|helpers matrix|pytest|measure_memory_grid|gpu_nvme_rung" | wc -l)
    [ "$running" -eq 0 ] && break
    sleep 20
    echo "[$(date +%T)] runs done:" $(for f in $W/runs*.jsonl; do [ -f $f ] && echo "$(basename $f .jsonl)=$(wc -l < $f)"; done)
  done
  [ "$(pgrep -f 'run_tutorial.py|helpers matrix|pytest|measure_memory_grid|gpu_nvme_rung' | wc -l)" -eq 0 ] && echo "all done" || echo "still running"
  python3 - $W <<'PY'
import json, pathlib, sys
w = pathlib.Path(sys.argv[1])
sys.path.insert(0, ".")
from helpers import memory
from helpers.lessons import biggest_model
for f in sorted(w.glob("runs*.jsonl")):
    disk = None
    for line in f.read_text().splitlines():
        r = json.loads(line)
        if r.get("probe") == "disk":  # notebook 06's probe: each NVMe row's bound comes from it
            disk = (r["write_mb_s"], r["read_mb_s"])
            print(f.stem, f"disk probe at {r['path']}: write {disk[0]:,.0f} MB/s, read {disk[1]:,.0f} MB/s")
            continue
        if disk and r["status"] == "ok" and "NVMe" in r["label"] and r["median_step_s"]:
            bound = biggest_model.predicted_nvme_step_s(memory.ModelInfo.for_shape(r["shape"]), *disk)
            print(f.stem, r["label"], f"{r['median_step_s']:.1f} s/step against the disk's bound "
                  f"{bound:.1f} s: {r['median_step_s'] / bound:.2f}x")
        gib = lambda b: "-" if not b else f"{b / 2**30:.2f}"
        print(f.stem, r["shape"], r["label"], r["status"], r["message"][:100], "gpu", gib(r["peak_gpu_allocated_bytes"]),
              "rss", gib(r["peak_host_rss_bytes"]), "nvme", gib(r["peak_nvme_bytes"]), "s/step", r["median_step_s"],
              "wall", round(r["wall_s"]), "loss", [round(x, 3) for x in r["losses"]],
              "ranks", [(x.get("optimizer_bytes"), x.get("grads_bytes"), x.get("params_bytes"), gib(x.get("peak_gpu_allocated_bytes"))) for x in r["ranks"]],
              "rss phases", [(p["name"], gib(p["start_bytes"]), gib(p["peak_bytes"])) for p in r.get("rss_phases", [])])
PY
  [ -f $W/job_rung.log ] && grep -v -i warn $W/job_rung.log | tail -n 8
  for f in $W/job05.log $W/job06.log; do [ -f $f ] && grep -v WARNING $f | tail -n 3; done
  for f in $W/job_*.log; do [ -f $f ] && { echo "== $f"; grep -E "passed|failed|FAILED|Error|these checks failed" $f | tail -n 8; }; done
  [ -f $W/jobcli.log ] && tail -n 25 $W/jobcli.log
  if [ -n "${OUT:-}" ]; then
    (cd $W && tar czf $OUT/gpu_results.tgz *.jsonl job*.log build_*.log 2>/dev/null)  # one file: at most 8 come back
    [ -d $W/tutorial ] && (cd $W && tar czf $OUT/tutorial.tgz tutorial 2>/dev/null)
  fi;;
esac
