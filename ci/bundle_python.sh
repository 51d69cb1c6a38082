#!/usr/bin/env bash
# The prepared GPU host's python3 (docs/gpu-hosts.md): ~/gpu-env.sh sourced, then its python3 with these arguments.
# ci/setup.sh prints this script's path where it chose that bundle, so the caller's shell need not have sourced
# ~/gpu-env.sh: the environment it sets reaches pytest, its workers and the rank processes.
# Exit codes: python3's own; 4 (a bad setting: ci/cli.py's table) where ~/gpu-env.sh fails.
# whatever ~/gpu-env.sh prints goes to stderr: stdout is the command's
# shellcheck disable=SC1091
source "$HOME/gpu-env.sh" >&2 || { echo "ci/bundle_python.sh: ~/gpu-env.sh failed (exit $?)" >&2; exit 4; }
exec python3 "$@"
