#!/usr/bin/env bash
# A validation pass on a GPU host prepared offline as docs/gpu-hosts.md says (~/gpu-env.sh). Logs go to $VAL_DIR, else $OUT
# (the device tool's folder), else results/gpu-<date>. Phases (one or several, in order):
#   env        versions, GPU, driver
#   product    the user's command, exactly: bash ci/test.sh -m ${ARCH:-sm90} (set-up and JIT cache restore
#              included), with its per-case records and a JUnit file in the log folder; wall time last
#   bench      drawn cases per minute and the phase split, from the product run's records (tools/bench_cases.py)
#   host       what idle rank pools cost this process's CPU work, per thread count (evidence/probes/bench_host_threads.py)
#   calibrate  error distributions of each backend of $ARCH (or of $CAL_IMPLS) against its recipe (tools/calibrate.py)
#   parallel   concurrent jobs sharing the GPU, one "name|pytest arguments" (or "name|python3 -m ...") a
#              line in $PAR_JOBS; PAR_TIMEOUT bounds each; a line per job last
#   nightly    python -m ci.nightly into $out/night ($NIGHTLY_PROFILE, default nightly; ci = the product's profile)
#   faulty     a faulty wrapper's test_matches_reference relabelled as the clean kernel, compare_runs against the
#              clean folder of an earlier phase: the planted regression must be flagged (exit 1)
#   jit        pack the JIT caches for the next fresh host: FlashInfer's (~/.cache/flashinfer), the DeepGEMM
#              cubins (~/.cache/moe-conformance) and the CuTe DSL's compiled kernels (cutlass_python_cache);
#              .gpu/jit/fi-jit.tgz is restored by ci/setup.sh
#   done       mark $out/DONE: the phases before it are over (for `wait`)
#   wait       from a later call: wait up to WAIT_S s for $out/DONE, then print where the run stands
#   snapshot   from a later call: the log folder and the JIT caches into $SNAP_DIR, whatever phase is running
set -uo pipefail
cd "$(dirname "$0")/../.."
test -f ~/gpu-env.sh || { echo FRESH-HOST; exit 3; }
# shellcheck disable=SC1090
source ~/gpu-env.sh
out="${VAL_DIR:-${OUT:-results/gpu-$(date +%Y%m%d-%H%M)}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
arch="${ARCH:-sm90}"
stamp() { echo "=== $(date -u +%FT%TZ) $*"; }
# FlashInfer's JIT cache (~/.cache/flashinfer), the DeepGEMM cubins (~/.cache/moe-conformance:
# fixtures/backends/flashinfer/deepgemm_cache.py) and the CuTe DSL's compiled kernels, into one tarball that
# ci/setup.sh restores on the next fresh host
pack_jit() {
  local cute="${CUTE_DSL_CACHE_DIR:-${TMPDIR:-/tmp}/$(id -un)/cutlass_python_cache}" extra=() own=() have=()
  [ -d "$cute" ] && extra=(-C "$(dirname "$cute")" "$(basename "$cute")")
  [ -d ~/.cache/flashinfer ] && have=(flashinfer)
  [ -d ~/.cache/moe-conformance ] && own=(moe-conformance)
  if [ ${#have[@]} -eq 0 ] && [ ${#own[@]} -eq 0 ] && [ ${#extra[@]} -eq 0 ]; then
    echo "no JIT cache on this host yet"; return 0
  fi
  tar czf "$1" --warning=no-file-changed -C ~/.cache "${have[@]}" "${own[@]}" "${extra[@]}" && ls -la "$1"
}

for phase in "$@"; do
  case "$phase" in
  env)
    { stamp env; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
      git log -1 --format='commit %H %s' 2>/dev/null
      python3 -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "cuda", torch.version.cuda); [print(n, m.version(n)) for n in ("flashinfer-python","nvidia-cutlass-dsl","nvshmem4py-cu13","hypothesis","pytest","pytest-xdist")]'
      ls .gpu/jit/fi-jit.tgz 2>/dev/null && echo "a JIT cache is present: ci/setup.sh restores it" || echo "no JIT cache: first builds compile"
      ls .gpu/jit/fi-aot.tgz 2>/dev/null && echo "AOT modules are present: ci/setup.sh installs them" || echo "no AOT modules (python -m tools.build_jit_modules)"
    } 2>&1 | tee -a "$out/env.log" ;;
  product)
    stamp "bash ci/test.sh -m $arch ${PRODUCT_ARGS:-}" | tee -a "$out/product.log"
    start=$(date +%s)
    # the GPU's memory and load every 5 s beside it: what sizes the workers (ci/workers.py)
    nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -l 5 \
      > "$out/gpu-memory.csv" 2>/dev/null & sampler=$!
    # shellcheck disable=SC2086
    # SIGINT first: pytest then writes its summary and the JUnit file of what ran
    timeout -s INT -k 60 "${PRODUCT_TIMEOUT:-3000}" bash ci/test.sh -m "$arch" --results-dir "$out/results" \
      --junitxml "$out/junit.xml" --durations=25 ${PRODUCT_ARGS:-} >> "$out/product.log" 2>&1
    echo "exit $? after $(( $(date +%s) - start ))s" | tee -a "$out/product.log"
    kill "$sampler" 2>/dev/null
    sort -t, -k2 -n "$out/gpu-memory.csv" | tail -n 1 | sed 's/^/most GPU memory used: /' | tee -a "$out/product.log"
    tail -n 5 "$out/product.log" ;;
  bench)
    stamp bench | tee -a "$out/bench.log"
    python3 -m tools.bench_cases --from "$out/results" 2>&1 | tee -a "$out/bench.log"
    python3 -m tools.summarise_cases "$out/results" 2>&1 | tee -a "$out/bench.log" ;;
  host)
    stamp host | tee -a "$out/host.log"
    timeout "${HOST_TIMEOUT:-240}" python3 -m evidence.probes.bench_host_threads --json "$out/host-threads.json" 2>&1 \
      | grep -v "^\[" | tail -n 12 | tee -a "$out/host.log" ;;
  calibrate)
    for impl in ${CAL_IMPLS:-$(python3 -m ci.backends "$arch")}; do
      tag=$(echo "$impl" | tr -c 'a-z0-9_\n' '_')
      stamp "calibrate $impl" | tee -a "$out/calibrate.log"
      timeout "${CAL_TIMEOUT:-200}" python3 -m tools.calibrate --impl "$impl" --batches "${CAL_BATCHES:-12}" \
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
  nightly)
    # the nightly entry point into $out/night, under $NIGHTLY_PROFILE (default nightly; with "ci", the product's
    # profile, its pytest phase is exactly the README's bash ci/test.sh -m $arch), then its latency and report
    stamp "python -m ci.nightly --profile ${NIGHTLY_PROFILE:-nightly}" | tee -a "$out/nightly.log"
    start=$(date +%s)
    timeout -s INT -k 60 "${NIGHTLY_TIMEOUT:-5400}" python3 -m ci.nightly --profile "${NIGHTLY_PROFILE:-nightly}" \
      --out "$out/night" -- --durations=25 >> "$out/nightly.log" 2>&1
    echo "exit $? after $(( $(date +%s) - start ))s" | tee -a "$out/nightly.log"
    grep -h "Building JIT module\|Failed to load AOT" "$out/night/nightly.log" 2>/dev/null | sort | uniq -c \
      | tee -a "$out/nightly.log" ;;
  faulty)
    # a planted regression for ci.compare_runs between real results folders: test_matches_reference of a faulty
    # wrapper ($FAULT, default scale_1e-2) around $FAULT_IMPL (default the arch's first backend), its records
    # relabelled as the clean kernel's, against the clean folder of an earlier phase ($CLEAN_DIR, default
    # $out/night, else $out/results); compare_runs must exit 1
    clean="${CLEAN_DIR:-$out/night}"; [ -d "$clean" ] || clean="$out/results"
    fault="${FAULT:-scale_1e-2}"; impl="${FAULT_IMPL:-$(python3 -m ci.backends "$arch" | head -n 1)}"
    stamp "faulty:$fault@$impl, relabelled as $impl, against $clean" | tee -a "$out/faulty.log"
    rm -rf "$out/faulty" "$out/faulty-as-clean"; mkdir -p "$out/faulty" "$out/faulty-as-clean"
    start=$(date +%s)
    MOE_HYPOTHESIS_PROFILE="${FAULT_PROFILE:-no-shrink}" timeout -s INT -k 30 "${FAULT_TIMEOUT:-300}" bash ci/test.sh \
      suites/conformance/test_generic.py -k test_matches_reference --impl "faulty:$fault@$impl" --ep 1 \
      -p no:cacheprovider --results-dir "$out/faulty" --junitxml "$out/faulty/junit.xml" >> "$out/faulty.log" 2>&1
    echo "faulty run exit $? after $(( $(date +%s) - start ))s" | tee -a "$out/faulty.log"
    # the run's records sit in a run folder of their own (and junit.xml beside it): relabel every file, keeping paths
    (cd "$out/faulty" && find . -type f) | while read -r f; do
      mkdir -p "$(dirname "$out/faulty-as-clean/$f")"; sed "s|faulty:$fault@||g" "$out/faulty/$f" > "$out/faulty-as-clean/$f"
    done
    python3 -m ci.compare_runs "$clean" "$out/faulty-as-clean" > "$out/compare-faulty.txt" 2>&1
    echo "compare_runs $clean $out/faulty-as-clean: exit $? (1 = the planted regression flagged)" \
      | tee -a "$out/faulty.log"
    grep -E "^REGRESSION|^verdict" "$out/compare-faulty.txt" | head -n 8 ;;
  jit)
    pack_jit "$out/fi-jit.tgz" ;;
  done)
    touch "$out/DONE" && stamp "the phases before this one are done: $out/DONE" ;;
  wait)
    # for a poll from a later call, while the phases run in the background: up to WAIT_S (default 540) s for
    # $out/DONE (the `done` phase), then where the run stands
    end=$(( $(date +%s) + ${WAIT_S:-540} ))
    # every 2 s: a poll that ends at DONE, or at WAIT_S, ends within 2 s of it (a 10-s step overslept short waits)
    while [ ! -f "$out/DONE" ] && [ "$(date +%s)" -lt "$end" ]; do sleep 2; done
    if [ -f "$out/DONE" ]; then echo "DONE"; else echo "still running after ${WAIT_S:-540} s"; fi
    grep -h "\[progress\]\|^exit \|^=== " "$out"/*.log 2>/dev/null | sed 's/.*\[progress\]/[progress]/' | tail -n 15 ;;
  snapshot)
    # what the end of a lease would lose, into $SNAP_DIR (the device tool's $OUT), whatever phase is running:
    # the log folder (no packed caches, no shared objects) and the JIT caches as the `jit` phase packs them (the
    # eighth H200 run's lease ended mid-run and its compiled modules were lost with the host)
    snap="${SNAP_DIR:?snapshot: set SNAP_DIR (e.g. to \$OUT)}"
    mkdir -p "$snap"
    tar czf "$snap/val.tgz" --warning=no-file-changed -C "$out" --exclude fi-jit.tgz --exclude '*.so' . \
      || echo "snapshot: tar said $? (files written while read)"
    pack_jit "$snap/fi-jit.tgz" ;;
  *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
