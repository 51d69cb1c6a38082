#!/usr/bin/env bash
# Set up the Python environment the suite runs in; safe to run again. Prints the python to use; says on stderr which
# one it chose and why. The first that applies:
#   1. MOE_USE_VENV=1: the suite's own .venv (below).
#   2. MOE_PYTHON (a python executable), else the python3 on PATH (the active environment: an activated venv, a
#      vLLM or SGLang environment, a FlashInfer source build), where it has torch and is not this checkout's own
#      .venv: that environment is tested as it is. ci/active_python.py names its torch and FlashInfer and installs
#      only the missing requirements of the [test] extra, with every installed distribution pinned: torch and
#      FlashInfer are never installed or changed there, and a FlashInfer that is missing or does not import is
#      reported, not replaced. A MOE_PYTHON without torch stops set-up. The packed caches of step 3 are not
#      restored there, and MOE_OTHER_FLASHINFER's environments are made only where it is set.
#   3. GPU host prepared offline (no network; docs/gpu-hosts.md): ~/gpu-env.sh is sourced and its python3 used
#      through ci/bundle_python.sh, which sources it again in the caller (also when the active python3 is that bundle's); a packed FlashInfer JIT cache (MOE_JIT_CACHE, default
#      .gpu/jit/fi-jit.tgz) is restored once, so the kernels load instead of compiling (minutes on a fresh host).
#   4. A machine whose Python has no torch (CI's CPU machine): a .venv in the repo at CI's exact versions
#      (ci/constraints.txt, applied to every pip install here; pyproject.toml declares only ranges), torch FIRST (the
#      CPU build on local disk; anything that depends on torch installed before it would pull a multi-GB CUDA
#      build), then the test deps and flashinfer-python (its public API is pinned by CPU tests). Re-installs when
#      either file is newer.
# Exit codes (ci/cli.py's table, one meaning across every command; ci/test.sh and ci/conformance.sh stop with them
# before pytest starts): 0 set up; 4 a bad setting, one line says which, checked before anything is installed (a
# MOE_PYTHON without torch or that does not run, a Python older than pyproject's requires-python, a bad MOE_USE_VENV or
# MOE_OTHER_FLASHINFER, a MOE_JIT_CACHE or MOE_JIT_AOT naming no file, a Python that cannot make a venv or has no pip,
# a ~/gpu-env.sh that fails or whose python3 lacks torch or pytest); 6 could not install (pip could not
# add what is missing: no package index, or a conflict), or any other failure of set-up: no verdict, fix and rerun.
# Never 1 (a verdict), 2, 3 or 5 (pytest's).
set -euo pipefail
INPUT=4 INCOMPLETE=6
trap 'rc=$?; if [ "$rc" != 0 ] && [ "$rc" != "$INPUT" ] && [ "$rc" != "$INCOMPLETE" ]; then
  echo "ci/setup.sh: set-up failed (exit $rc; the lines above say where): no verdict; fix it and rerun" >&2
  exit "$INCOMPLETE"; fi' EXIT
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${MOE_VENV:-$root/.venv}"
say() { echo "ci/setup.sh: $*" >&2; }
# "probe PYTHON": its python=, prefix= and torch= lines (ci/active_python.py where); nothing when it does not run
probe() { "$1" "$root/ci/active_python.py" where 2>/dev/null || true; }
field() { sed -n "s/^$1=//p" <<< "$2"; }
# the checkout's own environments (.venv, .venv-fi-*) are set up as step 4, not tested as a user's
ours() {
  local prefix
  prefix="$(cd "$(field prefix "$1")" 2>/dev/null && pwd -P)" || return 1
  [ "$prefix" = "$(cd "$venv" 2>/dev/null && pwd -P)" ] || [[ "$prefix" == "$(cd "$root" && pwd -P)"/.venv-fi-* ]]
}
# The settings read here are checked before anything is installed (fixtures/settings.py states what each accepts)
use_venv="${MOE_USE_VENV:-0}"
use_venv="${use_venv#"${use_venv%%[![:space:]]*}"}" use_venv="${use_venv%"${use_venv##*[![:space:]]}"}"  # trimmed
case "$use_venv" in 0 | 1) ;; *) say "MOE_USE_VENV='${MOE_USE_VENV}': expected 1 or 0"; exit "$INPUT" ;; esac
set -f  # the versions are words, never file patterns
for other in ${MOE_OTHER_FLASHINFER-}; do
  # a version pip can install (0.7.2.post1), never a word or a path: each one costs an environment of its own
  [[ "$other" =~ ^[0-9]+(\.[0-9A-Za-z]+)*$ ]] || {
    say "MOE_OTHER_FLASHINFER: '$other' is not a flashinfer-python version (e.g. 0.7.2.post1; empty: none)"
    exit "$INPUT"
  }
done
set +f
# "python_ok PROBE": this Python meets pyproject.toml's requires-python, or one line says why not and set-up stops
python_ok() {
  [ "$(field python_ok "$2")" = 1 ] && return 0
  say "$1 is Python $(field version "$2"); the suite needs Python $(field requires "$2") (pyproject.toml)"
  exit "$INPUT"
}
# "source_gpu_env": ~/gpu-env.sh in this shell, as a user's own file may be written: unset variables allowed, and
# whatever it prints kept off stdout, which carries only the python to use
source_gpu_env() {
  local rc=0
  set +u
  # shellcheck disable=SC1091
  source "$HOME/gpu-env.sh" >&2 || rc=$?
  set -u
  return "$rc"
}
mode=venv why="the python3 on PATH has no torch"
if [ "$use_venv" = 1 ]; then
  why="MOE_USE_VENV=1"
elif [ -n "${MOE_PYTHON:-}" ]; then
  info="$(probe "$MOE_PYTHON")"
  if [ -z "$(field torch "$info")" ]; then
    if [ -n "$info" ]; then
      say "MOE_PYTHON=$MOE_PYTHON has no torch: set-up installs no torch into it; install torch there, or unset" \
          "MOE_PYTHON for the suite's own .venv"
    else
      say "MOE_PYTHON=$MOE_PYTHON does not run: give a python executable (a path, or a name on PATH), or unset" \
          "MOE_PYTHON for the python3 on PATH"
    fi
    exit "$INPUT"
  fi
  mode=active why="MOE_PYTHON=$MOE_PYTHON"
else
  info="$(probe python3)"
  if [ -n "$(field torch "$info")" ] && ours "$info"; then
    why="the python3 on PATH is this checkout's $(field prefix "$info")"
  elif [ -n "$(field torch "$info")" ]; then
    mode=active why="the python3 on PATH has torch"
  fi
  if [ -f "$HOME/gpu-env.sh" ]; then
    if [ "$mode" = venv ]; then
      mode=bundle why="~/gpu-env.sh exists; $why"
    elif [ "$info" = "$(source_gpu_env >/dev/null 2>&1; probe python3)" ]; then
      mode=bundle why="the python3 on PATH is ~/gpu-env.sh's"
    fi
  fi
fi
if [ "$mode" = active ]; then
  py="$(field python "$info")"
  named="${MOE_PYTHON:+MOE_PYTHON=$MOE_PYTHON}"  # the variable where it chose this Python
  python_ok "${named:-$py}" "$info"
  say "testing $py ($why): its torch and FlashInfer as installed"
  # its own exit code: 4 (this Python has no pip to add the missing requirements with) or 6 (pip could not add them)
  "$py" "$root/ci/active_python.py" prepare "$root" >&2 || exit $?
fi
if [ "$mode" = bundle ]; then
  say "using ~/gpu-env.sh's python3 ($why)"
  source_gpu_env || { say "~/gpu-env.sh failed (exit $?): fix it, or MOE_USE_VENV=1"; exit "$INPUT"; }
  # the bundle must hold torch and the [test] extra (docs/gpu-hosts.md): without them pytest could not even start
  info="$(probe python3)"
  if [ -z "$(field torch "$info")" ]; then
    say "~/gpu-env.sh's python3 ($(command -v python3)) has no torch: the bundle must hold torch, FlashInfer and" \
        "the [test] extra (docs/gpu-hosts.md), or MOE_USE_VENV=1 for the suite's own .venv"
    exit "$INPUT"
  fi
  python_ok "~/gpu-env.sh's python3" "$info"
  [ -n "$(field pytest "$info")" ] || {
    say "~/gpu-env.sh's python3 ($(command -v python3)) has no pytest: the bundle must hold the [test] extra" \
        "(docs/gpu-hosts.md), or MOE_USE_VENV=1 for the suite's own .venv"
    exit "$INPUT"
  }
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
  # a tarball named by its variable must be there; the default ones are restored where they are
  for named in MOE_JIT_CACHE MOE_JIT_AOT; do
    if [ -n "${!named:-}" ] && [ ! -f "${!named}" ]; then
      say "$named=${!named}: no such file (a .tgz file; unset: the default under .gpu/jit/ where present)"
      exit "$INPUT"
    fi
  done
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
  # the caller's shell has not sourced ~/gpu-env.sh (this one did, in its own process): a wrapper that does
  echo "$root/ci/bundle_python.sh"
  exit 0
fi
constraints="$root/ci/constraints.txt"
base="${MOE_PYTHON:-python3}"
stale() { [ ! -f "$1" ] || [ "$root/pyproject.toml" -nt "$1" ] || [ "$constraints" -nt "$1" ]; }
# "pip_in PYTHON CONSTRAINTS ARGS...": a quiet pip install at the exact versions of CONSTRAINTS
pip_in() {
  local python=$1 pins=$2
  shift 2
  "$python" -m pip install -q -c "$pins" "$@" 2>&1 | grep -v "is ignored" >&2 || true
}
if [ "$mode" = venv ]; then
  say "using $venv/bin/python ($why)"
  if stale "$venv/.moe-installed"; then
    "$base" -m venv "$venv" >&2 || { say "$base cannot make a venv at $venv (python3-venv missing?)"; exit "$INPUT"; }
    "$venv/bin/python" -m pip install -q -c "$constraints" --upgrade pip >&2 2>/dev/null || true
    pip_in "$venv/bin/python" "$constraints" torch
    pip_in "$venv/bin/python" "$constraints" -e "$root[test,flashinfer]"
    "$venv/bin/python" -c "import torch, pytest, hypothesis, flashinfer" >&2 \
      || { say "could not install the suite's requirements into $venv (pip's lines above say why)"; exit "$INCOMPLETE"; }
    touch "$venv/.moe-installed"
  fi
fi
# The other FlashInfer version the suite supports, in a small environment of its own: the CPU tier runs
# the FlashInfer API tests against it too (suites/flashinfer/test_other_versions.py). "" skips it; beside a
# user's environment (step 2) only a set MOE_OTHER_FLASHINFER makes them. Its constraints are CI's without the
# flashinfer-python pin, which that version replaces.
others="${MOE_OTHER_FLASHINFER-0.7.2.post1}"
[ "$mode" = venv ] || others="${MOE_OTHER_FLASHINFER-}"
for other in $others; do  # each checked above: a version, never a file pattern
  env2="$root/.venv-fi-$other"
  if stale "$env2/.moe-installed"; then
    "$base" -m venv "$env2" >&2
    grep -v '^flashinfer-python==' "$constraints" > "$env2/constraints.txt"
    pip_in "$env2/bin/python" "$env2/constraints.txt" torch
    pip_in "$env2/bin/python" "$env2/constraints.txt" -e "$root[test]" "flashinfer-python==$other"
    "$env2/bin/python" -c "import torch, pytest, hypothesis, flashinfer" >&2 && touch "$env2/.moe-installed" || {
      say "could not install flashinfer-python==$other into $env2 (pip's lines above say why; MOE_OTHER_FLASHINFER=\"\": none)"
      exit "$INCOMPLETE"
    }
  fi
done
if [ "$mode" = active ]; then echo "$py"; else echo "$venv/bin/python"; fi
