#!/usr/bin/env bash
# The main job: set up, then run the conformance suites against every registered implementation
# (reference-ep plus every FlashInfer MegaMoE backend with a descriptor). Backends whose GPU is absent
# skip with the reason. Per-case JSON results land in results/. Extra arguments go to pytest, e.g.
#   bash ci/conformance.sh -m sm90                                   # the Hopper backends only
#   bash ci/conformance.sh --ep 1,2 --impl sm90_fp8_fp8_bf16_push_cuda  # one backend (--impl, or MOE_CONFORMANCE_IMPL)
set -euo pipefail
# relative PYTHONPATH entries and a relative MOE_PYTHON name the caller's folders (ci/caller_paths.sh)
caller="$PWD"
cd "$(dirname "$0")/.."
# shellcheck source=ci/caller_paths.sh
source ci/caller_paths.sh
# --help: the exit codes first (ci/cli.py, standard library only: no set-up needed), then pytest's help
case " $* " in *" --help "* | *" -h "*) python3 ci/cli.py ci/conformance.sh || true ;; esac
# a set-up that fails stops here with its own code (ci/setup.sh: 4 a bad setting, 6 could not install), never one of
# pytest's; after it, pytest's exit code is this command's (docs/running.md#exit-codes)
py="$(bash ci/setup.sh)" || exit $?
# the workers, the rank processes' environment and the hypothesis profile: the suite's plugin (fixtures.scheduling.spread)
# every registered implementation unless --impl or MOE_CONFORMANCE_IMPL names some (an --impl argument wins over the
# variable: fixtures.core.selection.selected_impls)
export MOE_CONFORMANCE_IMPL="${MOE_CONFORMANCE_IMPL:-all}"
exec "$py" -m pytest --rootdir "$PWD" -c "$PWD/pytest.ini" suites/conformance suites/flashinfer \
  --results-dir "${MOE_RESULTS_DIR:-results}" "$@"
