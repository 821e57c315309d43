#!/usr/bin/env bash
# One GPU session's jobs in the background (setsid), followed across calls (each call must end
# inside its limit and the next follow within 30 s: tools/gpu_record_run.sh says why).
#   source .whl/install-on-gpu.sh; bash tools/gpu_session.sh start JOB...   (JOB: finetune, nbval-a)
#   bash tools/gpu_session.sh wait SECONDS    # until "all done"; logs land in $OUT
set -u
# DeepSpeed's ops where every run of the kit looks for them (helpers/__init__.py's default): built
# once below, never inside a measured run
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/zero-kit/torch_extensions}"
W=/tmp/kit_gpu_s
export KIT_EMULATE=t4 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
case "$1" in
start)
  mkdir -p $W; rm -f $W/jobs $W/*.done
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; df -h /tmp | tail -1
  t=$SECONDS
  for op in FusedAdamBuilder CPUAdamBuilder AsyncIOBuilder; do
    python3 -c "from deepspeed.ops.op_builder import $op as B; B().load()" > $W/build_$op.log 2>&1 &
  done
  wait; echo "ops built in $((SECONDS - t)) s"; grep -h -i "error" $W/build_*.log | head -5
  for job in "${@:2}"; do
    case $job in
      finetune) KIT_OFFLOAD_DIR=/tmp/kit_nvme_ft setsid nohup bash -c \
        "/usr/bin/time -v python3 tools/gpu_finetune.py --out $W/ft ${KIT_FT_ARGS:-}; echo rc=\$? > $W/finetune.done" \
        > $W/job_finetune.log 2>&1 < /dev/null & ;;
      nbval-a) setsid nohup bash -c "python3 -m pytest -q -p no:cacheprovider --durations=0 \
        notebooks/01_gpu_check_and_install.ipynb notebooks/02_ds_report.ipynb \
        notebooks/03_config_builder.ipynb notebooks/04_zero2_training.ipynb \
        notebooks/07_engine_and_accelerate.ipynb; echo rc=\$? > $W/nbval-a.done" \
        > $W/job_nbval-a.log 2>&1 < /dev/null & ;;
    esac
    echo "$job" >> $W/jobs
  done ;;
wait)
  end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    left=0; for j in $(cat $W/jobs); do [ -e $W/$j.done ] || left=1; done
    [ $left = 0 ] && break; sleep 10
  done
  for j in $(cat $W/jobs); do echo "== $j: $(cat $W/$j.done 2>/dev/null || echo running)"; \
    tail -4 $W/job_$j.log; cp $W/job_$j.log $OUT/ 2>/dev/null; done
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  left=0; for j in $(cat $W/jobs); do [ -e $W/$j.done ] || left=1; done
  [ $left = 0 ] && echo "all done" ;;
esac
