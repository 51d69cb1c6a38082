#!/usr/bin/env bash
# The project's own tests, set-up included: the README's test command, and what .ci/run calls.
# On a CPU machine every GPU test skips with its reason; the CPU tier runs reference-ep at EP1/2/4/8.
set -euo pipefail
cd "$(dirname "$0")/.."
py="$(bash ci/setup.sh)"
export MOE_HYPOTHESIS_PROFILE="${MOE_HYPOTHESIS_PROFILE:-ci}"
exec "$py" -m pytest "$@"
