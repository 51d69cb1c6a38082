#!/usr/bin/env bash
# The project's own tests, set-up included: the README's test command, and what .ci/run calls.
# Set-up (ci/setup.sh), then the same pytest command a user types in the checkout: the suite's plugin decides the
# rest (pytest-xdist workers, the rank processes' environment, the hypothesis profile: fixtures.scheduling.spread). On a CPU
# machine every GPU test skips with its reason; the CPU tier runs reference-ep at EP1/2/4/8.
# Relative PYTHONPATH entries and a relative MOE_PYTHON name the caller's folders (ci/caller_paths.sh); path arguments
# name the checkout's.
set -euo pipefail
caller="$PWD"
cd "$(dirname "$0")/.."
# shellcheck source=ci/caller_paths.sh
source ci/caller_paths.sh
# --help: the exit codes first (ci/cli.py, standard library only: no set-up needed), then pytest's help
case " $* " in *" --help "* | *" -h "*) python3 ci/cli.py ci/test.sh || true ;; esac
# a set-up that fails stops here with its own code (ci/setup.sh: 4 a bad setting, 6 could not install), never one of
# pytest's; after it, pytest's exit code is this command's (docs/running.md#exit-codes)
py="$(bash ci/setup.sh)" || exit $?
# The ini and rootdir named: pytest looks for them from its path arguments, and a folder outside the checkout among
# the arguments (--results-dir /tmp/run) would be taken for the root, leaving the suite's options unregistered.
exec "$py" -m pytest --rootdir "$PWD" -c "$PWD/pytest.ini" "$@"
