#!/usr/bin/env bash
# The project's own tests, set-up included: the README's test command, and what .ci/run calls.
# On a CPU machine every GPU test skips with its reason; the CPU tier runs reference-ep at EP1/2/4/8.
# MOE_WORKERS (default auto: ci/workers.py) spreads the run over pytest-xdist workers: without a GPU one per core, up
# to 2, each implementation on one (on 2 cores the CPU tier took about half one process's time,
# reference.evidence.SESSION16); on a GPU host three, the rank-pool tests at EP1 on one, at larger EP sizes on another
# and the rest on the third (fixtures.pool_order.gpu_host_group; 560 s for -m sm90, reference.evidence.SESSION19).
set -euo pipefail
cd "$(dirname "$0")/.."
py="$(bash ci/setup.sh)"
export MOE_HYPOTHESIS_PROFILE="${MOE_HYPOTHESIS_PROFILE:-ci}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The ini and rootdir named: pytest looks for them from its path arguments, and a results folder that
# already exists outside the checkout (--results-dir /tmp/run) would be taken for one, leaving the suite's
# options unregistered ("unrecognized arguments: --results-dir", H200, 2026-12-01, ci.nightly).
where=(--rootdir "$PWD" -c "$PWD/pytest.ini")
spread=()
# An invalid MOE_WORKERS runs one process, and pytest's start-of-run check names it (fixtures.options).
workers=0
[ "${MOE_WORKERS:-auto}" = 0 ] || workers="$("$py" -m ci.workers 2>/dev/null || echo 0)"
# One process where the arguments ask for it or need it: -n given, xdist off, a test's own output shown (-s: an
# xdist worker's stdout goes nowhere) or a debugger (--pdb, --trace: xdist refuses them).
if [ "$workers" != 0 ] && ! [[ " $* ${PYTEST_ADDOPTS:-} " =~ " -n"|" --numprocesses"|"no:xdist"|" -s "|" --capture=no"|" --capture no"|" --pdb"|" --trace" ]]; then
  # A replacement for a crashed worker parses the command line before any conftest or ini is found
  # (H200, 2026-12-01: every replacement died on "unrecognized arguments: --results-dir"): name the
  # options plugin, the ini and the rootdir explicitly.
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  spread=(-n "$workers" --dist loadgroup -p fixtures.options)
fi
exec "$py" -m pytest "${where[@]}" "${spread[@]}" "$@"
