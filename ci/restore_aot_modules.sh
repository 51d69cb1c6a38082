#!/usr/bin/env bash
# Install a tarball of FlashInfer AOT modules (python -m tools.build_jit_modules) into FlashInfer's AOT folder, where
# FlashInfer loads a module before it would compile one.
#   ci/restore_aot_modules.sh TARBALL AOT_DIR INSTALLED_VERSION
# Only into the FlashInfer version the modules were built for (BUILD_INFO's first line): a module of another
# version may carry the same name (dsv3_fused_routing has no hash in it) and other code.
# Exit codes (ci/cli.py's table): 0 done, every fit module installed (none, when they are another version's or their
# check could not run: the line says so); 4 a missing argument, or a TARBALL that is no such build (one line).
set -euo pipefail
[ $# -eq 3 ] || { echo "ci/restore_aot_modules.sh: usage: ci/restore_aot_modules.sh TARBALL AOT_DIR INSTALLED_VERSION" >&2; exit 4; }
tarball=$1 aot=$2 installed=$3
info=$(tar xzf "$tarball" -O flashinfer-aot/BUILD_INFO 2>/dev/null) \
  || { echo "ci/restore_aot_modules.sh: $tarball holds no flashinfer-aot/BUILD_INFO: give python -m tools.build_jit_modules' tarball" >&2; exit 4; }
built=$(sed -n 's/^flashinfer-python //p' <<< "$info")
if [ "$built" != "$installed" ]; then
  echo "AOT modules of $tarball are for flashinfer-python ${built:-unknown}, this host has $installed: not installed"
  exit 0
fi
# Each module is checked first (ci/aot_linkage.py): one that calls the CUDA driver without listing libcuda.so.1,
# or needs any symbol this host cannot supply, would not fail to load, it would end the run at its first call
# (--load binds every symbol at load to find out); left out, FlashInfer compiles it here
staged=$(mktemp -d)
trap 'rm -rf "$staged"' EXIT
tar xzf "$tarball" -C "$staged" --strip-components=1 --exclude 'flashinfer-aot/BUILD_INFO'
root="$(cd "$(dirname "$0")/.." && pwd)"
status=0
unfit=$(PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" python3 -m ci.aot_linkage --load "$staged") || status=$?
if [ "$status" -ne 0 ] && [ -z "$unfit" ]; then  # the check itself did not run: trust no module
  echo "the modules' check (ci/aot_linkage.py) exited $status and named none: no AOT module installed; FlashInfer compiles them here"
  exit 0
fi
while IFS= read -r line; do
  [ -n "$line" ] || continue
  module=${line%%: *}
  echo "not installed: $(basename "$module") ${line#*: }"
  rm -rf "$(dirname "$module")"
done <<< "$unfit"
mkdir -p "$aot"
cp -r "$staged"/. "$aot"/
echo "installed $(find "$staged" -name '*.so' | wc -l) of $(tar tzf "$tarball" | grep -c '\.so$') FlashInfer AOT modules ($(tr '\n' ' ' <<< "$info")) into $aot"
