#!/usr/bin/env bash
# The main job: set up, then run the conformance suites against every registered implementation
# (reference-ep plus every FlashInfer MegaMoE backend with a descriptor). Backends whose GPU is absent
# skip with the reason. Per-case JSON results land in results/. Extra arguments go to pytest, e.g.
#   bash ci/conformance.sh -m sm90            # the Hopper backends only
#   bash ci/conformance.sh --ep 1,2 --impl sm90_fp8_fp8_bf16_pull_cutedsl
set -euo pipefail
cd "$(dirname "$0")/.."
py="$(bash ci/setup.sh)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MOE_HYPOTHESIS_PROFILE="${MOE_HYPOTHESIS_PROFILE:-ci}"
exec "$py" -m pytest suites/conformance suites/flashinfer --impl "${MOE_CONFORMANCE_IMPL:-all}" \
  --results-dir "${MOE_RESULTS_DIR:-results}" "$@"
