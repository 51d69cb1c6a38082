#!/usr/bin/env bash
# Restore a packed FlashInfer JIT cache so that ninja does not rebuild it on a fresh host.
#   ci/restore_jit_cache.sh TARBALL CACHE_PARENT SITE_DIR...
# TARBALL: `tar czf fi-jit.tgz -C ~/.cache flashinfer` from an earlier host (evidence/gpu_host/gpu_validate.sh jit), with the
# CuTe DSL's file cache of compiled kernels beside it (cutlass_python_cache/: restored where the DSL looks,
# $CUTE_DSL_CACHE_DIR or ${TMPDIR:-/tmp}/$USER/cutlass_python_cache; it holds only kernels built through the
# DSL's implicit JIT: `cute.compile`, which FlashInfer's SM90 pull kernels use, never caches); CACHE_PARENT: ~/.cache;
# SITE_DIR: where the wheels were just installed (their headers and sources are the modules' inputs).
# Ninja (>= 1.10) rebuilds an output when an input is newer than the output's mtime recorded in
# .ninja_log, and when the output is newer than its .ninja_deps entry. So the outputs keep their packed
# mtimes (tar keeps them) and the freshly installed inputs are dated 2000-01-01. Prints a ninja dry run
# per module: "no work to do" or ninja's reason for a rebuild.
# Exit codes (ci/cli.py's table): 0 restored; 4 a missing argument, or a TARBALL that cannot be unpacked into
# CACHE_PARENT (one line says which).
set -uo pipefail
[ $# -ge 2 ] || { echo "ci/restore_jit_cache.sh: usage: ci/restore_jit_cache.sh TARBALL CACHE_PARENT SITE_DIR..." >&2; exit 4; }
tarball=$1 cache=$2; shift 2
mkdir -p "$cache" && tar xzf "$tarball" -C "$cache" --exclude 'cutlass_python_cache*' 2>/dev/null \
  || { echo "ci/restore_jit_cache.sh: cannot unpack $tarball into $cache: give a tarball of ~/.cache/flashinfer" >&2; exit 4; }
if tar tzf "$tarball" | grep -q '^cutlass_python_cache/'; then
  cute="${CUTE_DSL_CACHE_DIR:-${TMPDIR:-/tmp}/$(id -un)/cutlass_python_cache}"
  mkdir -p "$cute" && tar xzf "$tarball" -C "$cute" --strip-components=1 cutlass_python_cache \
    && echo "restored the CuTe DSL kernel cache into $cute ($(ls "$cute" | wc -l) entries)"
fi
for site in "$@"; do find "$site" -exec touch -h -d @946684800 {} +; done
for d in "$cache"/flashinfer/*/*/cached_ops/*/; do
  [ -f "$d/build.ninja" ] || continue
  echo "ninja dry run $(basename "$d"): $(ninja -C "$d" -n -d explain 2>&1 | grep -m1 -E 'explain|no work')"
done
