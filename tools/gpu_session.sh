#!/usr/bin/env bash
# One GPU session's jobs in the background (setsid), followed across calls (each call must end
# inside its limit and the next follow within 30 s: tools/gpu_record_run.sh says why).
#   source .whl/install-on-gpu.sh; bash tools/gpu_session.sh start JOB...
#     JOB: context (the CUDA context, measured first on the idle GPU), finetune (notebook 06's
#     fine-tune part; after the job KIT_FT_AFTER names, if set), nbval-a (01-04, 07),
#     nbval-NN[-NN...] (those notebooks; 06: KIT_LADDER_HEADLINE cuts the ladder), rungs
#     (tools/gpu_nvme_rung.py for each entry of KIT_RUNGS, one after another: its arguments joined
#     by "+", e.g. llama-3.2-3b-shaped+--weights=gpu+--freeze-embeddings), heldout (the memory
#     grid's held-out cases: tools/measure_memory_grid.py --held-out, rows in heldout.jsonl)
#     JOB@OTHER: JOB starts once job OTHER has ended (so a timed job does not share the machine)
#   bash tools/gpu_session.sh wait SECONDS    # until "all done"; logs land in $OUT
set -u
# DeepSpeed's ops where every run of the kit looks for them (helpers/__init__.py's default): built
# once below, never inside a measured run
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/zero-kit/torch_extensions}"
W=/tmp/kit_gpu_s
export KIT_EMULATE=t4 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 KIT_REPORT_TO=tools.run_log:append
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
job() {  # name, command: in the background, its own log, KIT_BENCH_LOG and NVMe folder
  local name=$1 first=""; shift
  [ -n "$after" ] && first="while [ ! -e $W/$after.done ]; do sleep 5; done;"
  KIT_BENCH_LOG=$W/runs_$name.jsonl KIT_OFFLOAD_DIR=/tmp/kit_nvme_$name setsid nohup bash -c \
    "$first $*; echo rc=\$? > $W/$name.done" > $W/job_$name.log 2>&1 < /dev/null &
  echo "$name" >> $W/jobs
}
# one pytest per notebook, one after another: each prints its failures as soon as it ends (one
# pytest over several printed them only at the very end, which run 23 never reached)
nbval() { local out="fail=0;" nb; for nb in "$@"; do
  out="$out python3 -m pytest -q -p no:cacheprovider --durations=10 -n 0 $nb || fail=1;"; done
  echo "$out test \$fail = 0"; }
case "$1" in
start)
  mkdir -p $W; rm -f $W/jobs $W/*.done
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader; df -h /tmp | tail -1
  [[ " ${*:2} " == *" context "* ]] && python3 tools/gpu_cuda_context.py | tee $W/context.log
  t=$SECONDS
  for op in FusedAdamBuilder CPUAdamBuilder AsyncIOBuilder; do
    python3 -c "from deepspeed.ops.op_builder import $op as B; B().load()" > $W/build_$op.log 2>&1 &
  done
  wait; echo "ops built in $((SECONDS - t)) s"; grep -h -i "error" $W/build_*.log | head -5
  for spec in "${@:2}"; do
    name=${spec%@*}; after=""; [ "$spec" != "$name" ] && after=${spec#*@}
    case $name in
      finetune) job finetune "${KIT_FT_AFTER:+while [ ! -e $W/$KIT_FT_AFTER.done ]; do sleep 5; done;} \
        /usr/bin/time -v python3 tools/gpu_finetune.py --out $W/ft ${KIT_FT_ARGS:-}" ;;
      nbval-a) job nbval-a "$(nbval notebooks/01_gpu_check_and_install.ipynb notebooks/02_ds_report.ipynb \
        notebooks/03_config_builder.ipynb notebooks/04_zero2_training.ipynb \
        notebooks/07_engine_and_accelerate.ipynb)" ;;
      nbval-*) nbs=""; for n in $(echo ${name#nbval-} | tr '-' ' '); do
          nbs="$nbs $(ls notebooks/${n}_*.ipynb)"; done
        job $name "$(nbval $nbs)" ;;
      heldout) job heldout "python3 tools/measure_memory_grid.py --held-out --out $W/heldout.jsonl \
        --parallel 3 --limit-minutes 12" ;;
      rungs) job rungs "for r in ${KIT_RUNGS:-}; do python3 tools/gpu_nvme_rung.py \${r//+/ }; done" ;;
    esac
  done ;;
wait)
  end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    left=0; for j in $(cat $W/jobs); do [ -e $W/$j.done ] || left=1; done
    [ $left = 0 ] && break; sleep 10
  done
  for j in $(cat $W/jobs); do echo "== $j: $(cat $W/$j.done 2>/dev/null || echo running)"; \
    grep -v -i "warn" $W/job_$j.log | tail -6; done
  nvidia-smi --query-gpu=memory.used --format=csv,noheader; df -h /tmp | tail -1
  [ -n "${OUT:-}" ] && (cd $W && tar czf $OUT/gpu_session.tgz *.log *.jsonl 2>/dev/null)
  left=0; for j in $(cat $W/jobs); do [ -e $W/$j.done ] || left=1; done
  [ $left = 0 ] && echo "all done" ;;
esac
