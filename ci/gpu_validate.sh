#!/usr/bin/env bash
# One validation pass on a GPU host prepared per ../shared/gpu/README.md. Logs go to $OUT (the device
# tool's folder) or results/gpu-<date>. Phases (run one or several, in order):
#   env        versions, GPU, JIT cache restore
#   calibrate  error distributions of each SM90 backend against its recipe (ci/calibrate.py)
#   suite      pytest -m sm90 at EP1, then the shared-GPU EP sizes of the pull kernel
#   faults     faulty wrappers around real SM90 layers must each be caught
#   bench      cases per minute per SM90 backend (ci/bench_cases.py)
#   parallel   concurrent jobs sharing the GPU, listed in $PAR_JOBS (ci/gpu_jobs/*.txt); PAR_TIMEOUT
#              bounds each; a line per job last
#   jit        pack the FlashInfer JIT cache for the next fresh host
set -uo pipefail
cd "$(dirname "$0")/.."
test -f ~/gpu-env.sh || { echo FRESH-HOST; exit 3; }
# shellcheck disable=SC1090
source ~/gpu-env.sh
out="${VAL_DIR:-${OUT:-results/gpu-$(date +%Y%m%d-%H%M)}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MOE_CASE_TIMEOUT="${MOE_CASE_TIMEOUT:-420}" MOE_MAX_POOLS="${MOE_MAX_POOLS:-1}" MOE_MAX_LAYERS="${MOE_MAX_LAYERS:-4}"
export MOE_HYPOTHESIS_PROFILE="${MOE_HYPOTHESIS_PROFILE:-dev}"
SM90="${SM90_IMPLS:-sm90_fp8_fp8_bf16_pull_cutedsl[blockwise] sm90_bf16_bf16_bf16_push_cake sm90_fp8_fp8_bf16_push_cuda sm90_fp8_fp8_bf16_pull_cutedsl[per_tensor]}"
stamp() { echo "=== $(date -u +%FT%TZ) $*"; }

for phase in "$@"; do
  case "$phase" in
  env)
    { stamp env; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      python3 -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "cuda", torch.version.cuda); [print(n, m.version(n)) for n in ("flashinfer-python","nvidia-cutlass-dsl","nvshmem4py-cu13","hypothesis","pytest")]'
      if [ -f .gpu/jit/fi-jit.tgz ]; then bash ci/restore_jit_cache.sh .gpu/jit/fi-jit.tgz ~/.cache ~/gpu-site \
        && echo "JIT cache restored"  # seen 2026-11-29: touching the outputs instead rebuilt every module
      else echo "no JIT cache: first builds compile"; fi
    } 2>&1 | tee -a "$out/env.log" ;;
  calibrate)
    for impl in $SM90; do
      tag=$(echo "$impl" | tr -c 'a-z0-9_\n' '_')
      stamp "calibrate $impl" | tee -a "$out/calibrate.log"
      timeout "${CAL_TIMEOUT:-200}" python3 -m ci.calibrate --impl "$impl" --batches "${CAL_BATCHES:-12}" \
        --models "${CAL_MODELS:-8}" --json "$out/cal-$tag.json" >> "$out/calibrate.log" 2>&1 \
        || echo "calibrate $impl exited $?" | tee -a "$out/calibrate.log"
      grep SUMMARY "$out/calibrate.log" | tail -1
    done ;;
  suite)
    stamp "pytest -m sm90 EP1" | tee -a "$out/suite.log"
    timeout "${SUITE_TIMEOUT:-500}" python3 -m pytest suites -m "sm90" --impl "${SUITE_IMPLS:-all}" --ep "${SUITE_EP:-1}" \
      -p no:cacheprovider --results-dir "$out" -q -rs --durations=15 ${SUITE_ARGS:-} 2>&1 | tail -n 400 >> "$out/suite.log"
    tail -n 30 "$out/suite.log" ;;
  ep)
    stamp "pytest -m 'sm90 and ep' EP2,4,8" | tee -a "$out/ep.log"
    timeout "${EP_TIMEOUT:-500}" python3 -m pytest suites -m "sm90 and ep" --impl all --ep 2,4,8 \
      -p no:cacheprovider --results-dir "$out" -q -rs ${EP_ARGS:-} 2>&1 | tail -n 400 >> "$out/ep.log"
    tail -n 30 "$out/ep.log" ;;
  faults)
    stamp "faulty wrappers" | tee -a "$out/faults.log"
    timeout "${FAULT_TIMEOUT:-300}" python3 -m pytest suites/flashinfer/test_gpu_faults.py -p no:cacheprovider \
      --results-dir "$out" -q -s 2>&1 | tail -n 200 >> "$out/faults.log"
    tail -n 20 "$out/faults.log" ;;
  bench)
    stamp bench | tee -a "$out/bench.log"
    timeout "${BENCH_TIMEOUT:-300}" python3 -m ci.bench_cases --seconds "${BENCH_SECONDS:-30}" >> "$out/bench.log" 2>&1
    tail -n 12 "$out/bench.log" ;;
  parallel)
    # Jobs: lines "name|pytest arguments" or "name|python3 -m module ..." in $PAR_JOBS (default
    # ci/gpu_jobs/full.txt); {EP} in a line is replaced by $PAR_EP. Each job gets its own log and
    # results dir, and PAR_TIMEOUT seconds.
    stamp "parallel jobs from ${PAR_JOBS:-ci/gpu_jobs/full.txt}" | tee -a "$out/parallel.log"
    while IFS= read -r job; do
      case "$job" in ''|'#'*) continue ;; esac
      name="${job%%|*}"; args="${job#*|}"; args="${args//\{EP\}/${PAR_EP:-1,2,4,8}}"
      ( set -f; start=$(date +%s)
        eval "cmd=($args)"  # quotes in a job line group words; globbing is off
        [[ "${cmd[0]}" == python* ]] || cmd=(python3 -m pytest "${cmd[@]}" -p no:cacheprovider --results-dir "$out/$name" -v -rsx --durations=10)
        timeout "${PAR_TIMEOUT:-480}" "${cmd[@]}" > "$out/$name.log" 2>&1
        echo "$name exit $? after $(( $(date +%s) - start ))s: $(tail -n 1 "$out/$name.log")" >> "$out/parallel.log" ) &
    done < "${PAR_JOBS:-ci/gpu_jobs/full.txt}"
    wait
    cat "$out/parallel.log" ;;
  jit)
    tar czf "$out/fi-jit.tgz" -C ~/.cache flashinfer && ls -la "$out/fi-jit.tgz" ;;
  *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
