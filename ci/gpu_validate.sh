#!/usr/bin/env bash
# A validation pass on a GPU host prepared per ../shared/gpu/README.md. Logs go to $VAL_DIR, else $OUT
# (the device tool's folder), else results/gpu-<date>. Phases (one or several, in order):
#   env        versions, GPU, driver
#   product    the user's command, exactly: bash ci/test.sh -m ${ARCH:-sm90} (set-up and JIT cache restore
#              included), with its per-case records and a JUnit file in the log folder; wall time last
#   bench      drawn cases per minute and the phase split, from the product run's records (ci/bench_cases.py)
#   host       what idle rank pools cost this process's CPU work, per thread count (ci/bench_host_threads.py)
#   calibrate  error distributions of each backend of $ARCH against its recipe (ci/calibrate.py)
#   parallel   concurrent jobs sharing the GPU, one "name|pytest arguments" (or "name|python3 -m ...") a
#              line in $PAR_JOBS; PAR_TIMEOUT bounds each; a line per job last
#   jit        pack the JIT caches for the next fresh host: FlashInfer's (~/.cache/flashinfer) and the CuTe
#              DSL's compiled kernels (cutlass_python_cache); .gpu/jit/fi-jit.tgz is restored by ci/setup.sh
set -uo pipefail
cd "$(dirname "$0")/.."
test -f ~/gpu-env.sh || { echo FRESH-HOST; exit 3; }
# shellcheck disable=SC1090
source ~/gpu-env.sh
out="${VAL_DIR:-${OUT:-results/gpu-$(date +%Y%m%d-%H%M)}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
arch="${ARCH:-sm90}"
stamp() { echo "=== $(date -u +%FT%TZ) $*"; }

for phase in "$@"; do
  case "$phase" in
  env)
    { stamp env; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
      git log -1 --format='commit %H %s' 2>/dev/null
      python3 -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "cuda", torch.version.cuda); [print(n, m.version(n)) for n in ("flashinfer-python","nvidia-cutlass-dsl","nvshmem4py-cu13","hypothesis","pytest","pytest-xdist")]'
      ls .gpu/jit/fi-jit.tgz 2>/dev/null && echo "a JIT cache is present: ci/setup.sh restores it" || echo "no JIT cache: first builds compile"
    } 2>&1 | tee -a "$out/env.log" ;;
  product)
    stamp "bash ci/test.sh -m $arch ${PRODUCT_ARGS:-}" | tee -a "$out/product.log"
    start=$(date +%s)
    # shellcheck disable=SC2086
    # SIGINT first: pytest then writes its summary and the JUnit file of what ran
    timeout -s INT -k 60 "${PRODUCT_TIMEOUT:-3000}" bash ci/test.sh -m "$arch" --results-dir "$out/results" \
      --junitxml "$out/junit.xml" --durations=25 ${PRODUCT_ARGS:-} >> "$out/product.log" 2>&1
    echo "exit $? after $(( $(date +%s) - start ))s" | tee -a "$out/product.log"
    tail -n 5 "$out/product.log" ;;
  bench)
    stamp bench | tee -a "$out/bench.log"
    python3 -m ci.bench_cases --from "$out/results" 2>&1 | tee -a "$out/bench.log"
    python3 -m ci.summarise_cases "$out/results" 2>&1 | tee -a "$out/bench.log" ;;
  host)
    stamp host | tee -a "$out/host.log"
    timeout "${HOST_TIMEOUT:-240}" python3 -m ci.bench_host_threads --json "$out/host-threads.json" 2>&1 \
      | grep -v "^\[" | tail -n 12 | tee -a "$out/host.log" ;;
  calibrate)
    for impl in $(python3 -m ci.backends "$arch"); do
      tag=$(echo "$impl" | tr -c 'a-z0-9_\n' '_')
      stamp "calibrate $impl" | tee -a "$out/calibrate.log"
      timeout "${CAL_TIMEOUT:-200}" python3 -m ci.calibrate --impl "$impl" --batches "${CAL_BATCHES:-12}" \
        --models "${CAL_MODELS:-8}" --json "$out/cal-$tag.json" >> "$out/calibrate.log" 2>&1 \
        || echo "calibrate $impl exited $?" | tee -a "$out/calibrate.log"
      grep -E "^(SUMMARY|SKIPPED)" "$out/calibrate.log" | tail -1
    done ;;
  parallel)
    [ -n "${PAR_JOBS:-}" ] || { echo "parallel: set PAR_JOBS to a job file"; exit 2; }
    stamp "parallel jobs from $PAR_JOBS" | tee -a "$out/parallel.log"
    while IFS= read -r job; do
      case "$job" in ''|'#'*) continue ;; esac
      name="${job%%|*}"; args="${job#*|}"
      ( set -f; start=$(date +%s)
        eval "cmd=($args)"  # quotes in a job line group words; globbing is off
        [[ "${cmd[0]}" == python* ]] || cmd=(python3 -m pytest "${cmd[@]}" -p no:cacheprovider --results-dir "$out/$name" -v -rsx --durations=10)
        timeout "${PAR_TIMEOUT:-480}" "${cmd[@]}" > "$out/$name.log" 2>&1
        echo "$name exit $? after $(( $(date +%s) - start ))s: $(tail -n 1 "$out/$name.log")" >> "$out/parallel.log" ) &
    done < "$PAR_JOBS"
    wait
    cat "$out/parallel.log" ;;
  jit)
    cute="${CUTE_DSL_CACHE_DIR:-${TMPDIR:-/tmp}/$(id -un)/cutlass_python_cache}"
    extra=(); [ -d "$cute" ] && extra=(-C "$(dirname "$cute")" "$(basename "$cute")")
    tar czf "$out/fi-jit.tgz" -C ~/.cache flashinfer "${extra[@]}" && ls -la "$out/fi-jit.tgz" ;;
  *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
