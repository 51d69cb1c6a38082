#!/usr/bin/env bash
# Set up the Python environment the suite runs in; safe to run again. Prints the python to use.
#   CPU machine: a .venv in the repo at CI's exact versions (ci/constraints.txt, applied to every pip
#   install here; pyproject.toml declares only ranges), torch FIRST (the CPU build on local disk; anything
#   that depends on torch installed before it would pull a multi-GB CUDA build), then the test deps and
#   flashinfer-python (its public API is pinned by CPU tests). Re-installs when either file is newer.
#   GPU host prepared offline (no network; docs/gpu-hosts.md): ~/gpu-env.sh is sourced and its python3 used;
#   a packed FlashInfer JIT cache (MOE_JIT_CACHE, default .gpu/jit/fi-jit.tgz) is restored once, so the
#   kernels load instead of compiling (minutes on a fresh host).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -f "$HOME/gpu-env.sh" ] && [ "${MOE_USE_VENV:-0}" != "1" ]; then
  # shellcheck disable=SC1091
  source "$HOME/gpu-env.sh"
  # Each packed cache is restored once per host (a marker per tarball's hash); a failed restore leaves no marker
  # and is tried again next time: "restore_once NAME TARBALL MESSAGE CMD..." (MESSAGE may be empty)
  restore_once() {
    local name=$1 tarball=$2 message=$3 marker
    shift 3
    [ -f "$tarball" ] || return 0
    marker="$HOME/.cache/moe-$name-restored-$(sha256sum "$tarball" | cut -c1-16)"
    [ -f "$marker" ] && return 0
    [ -z "$message" ] || echo "$message" >&2
    if "$@" >&2; then mkdir -p "$HOME/.cache" && touch "$marker"; fi
  }
  jit="${MOE_JIT_CACHE:-$root/.gpu/jit/fi-jit.tgz}"
  restore_once jit "$jit" "restoring the FlashInfer JIT cache $jit" bash "$root/ci/restore_jit_cache.sh" "$jit" "$HOME/.cache" "$HOME/gpu-site"
  # FlashInfer AOT modules built without a GPU (python -m tools.build_jit_modules; MOE_JIT_AOT, default
  # .gpu/jit/fi-aot.tgz): FlashInfer loads them instead of compiling its JIT modules on this fresh host
  install_aot() {
    local where
    where=$(python3 -c 'import importlib.metadata as m, flashinfer.jit.env as e; print(e.FLASHINFER_AOT_DIR, m.version("flashinfer-python"))' 2>/dev/null) \
      || { echo "FlashInfer is not importable here: the AOT modules of $1 are not installed"; return 1; }
    # shellcheck disable=SC2086
    bash "$root/ci/restore_aot_modules.sh" "$1" $where
  }
  aot="${MOE_JIT_AOT:-$root/.gpu/jit/fi-aot.tgz}"
  restore_once aot "$aot" "" install_aot "$aot"  # restore_aot_modules.sh says what it installed
  echo "python3"
  exit 0
fi
venv="${MOE_VENV:-$root/.venv}"
constraints="$root/ci/constraints.txt"
stale() { [ ! -f "$1" ] || [ "$root/pyproject.toml" -nt "$1" ] || [ "$constraints" -nt "$1" ]; }
# "pip_in PYTHON CONSTRAINTS ARGS...": a quiet pip install at the exact versions of CONSTRAINTS
pip_in() {
  local python=$1 pins=$2
  shift 2
  "$python" -m pip install -q -c "$pins" "$@" 2>&1 | grep -v "is ignored" >&2 || true
}
if stale "$venv/.moe-installed"; then
  python3 -m venv "$venv" >&2
  "$venv/bin/python" -m pip install -q -c "$constraints" --upgrade pip >&2 2>/dev/null || true
  pip_in "$venv/bin/python" "$constraints" torch
  pip_in "$venv/bin/python" "$constraints" -e "$root[test,flashinfer]"
  "$venv/bin/python" -c "import torch, pytest, hypothesis, flashinfer" >&2
  touch "$venv/.moe-installed"
fi
# The other FlashInfer version the suite supports, in a small environment of its own: the CPU tier runs
# the FlashInfer API tests against it too (suites/flashinfer/test_other_versions.py). "" skips it. Its
# constraints are CI's without the flashinfer-python pin, which that version replaces.
for other in ${MOE_OTHER_FLASHINFER-0.7.2.post1}; do
  env2="$root/.venv-fi-$other"
  if stale "$env2/.moe-installed"; then
    python3 -m venv "$env2" >&2
    grep -v '^flashinfer-python==' "$constraints" > "$env2/constraints.txt"
    pip_in "$env2/bin/python" "$env2/constraints.txt" torch
    pip_in "$env2/bin/python" "$env2/constraints.txt" -e "$root[test]" "flashinfer-python==$other"
    "$env2/bin/python" -c "import torch, pytest, hypothesis, flashinfer" >&2 && touch "$env2/.moe-installed"
  fi
done
echo "$venv/bin/python"
