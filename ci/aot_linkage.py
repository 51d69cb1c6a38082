"""Whether a FlashInfer module built off the GPU host (``ci.build_jit_modules``) can run there: every CUDA driver
symbol it calls must come from a library it lists as NEEDED, libcuda.so.1.

Why: torch opens the driver with ``dlopen(RTLD_LOCAL)``, so its symbols are not there for other libraries. A module
that calls ``cuLibraryLoadData`` without listing libcuda.so.1 loads fine, then the dynamic loader ends the whole
process at the first call ("symbol lookup error: ... undefined symbol: cuLibraryLoadData", exit 127, no pytest
summary; the H200, 2026-12-01, eighth session). A module linked against a libcuda stub that exports nothing comes
out that way, because the linker's ``--as-needed`` drops a library that defines none of the symbols.

    python -m ci.aot_linkage [--names] PATH...   # each a module (.so) or a folder of them; exit 1 if one is unfit

Needs binutils' ``readelf``. Where it is missing, every module counts as unfit: an unchecked module can end the
run, and a module left out is only compiled by FlashInfer as usual.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

DRIVER_LIBRARY = "libcuda.so.1"
# Driver API entry points: cuInit, cuLibraryLoadData, cuGetErrorString. The runtime (cuda*), cuBLAS (cublas*) and
# cuRAND (curand*) have a lower-case letter after "cu", and their libraries are found the usual way.
DRIVER_SYMBOL = re.compile(r"^cu[A-Z]\w*$")


def _readelf(path: Path, *flags: str) -> str:
    tool = shutil.which("readelf")
    if tool is None:
        raise RuntimeError("readelf not found (binutils): linkage not checked")
    done = subprocess.run([tool, "-W", *flags, str(path)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"not an ELF shared object ({done.stderr.strip().splitlines()[-1] if done.stderr else 'readelf failed'})")
    return done.stdout


def dynamic_symbols(path: Path, *, defined: bool) -> list[str]:
    """The dynamic symbols ``path`` defines (``defined=True``) or needs from elsewhere, without their versions."""
    names = []
    for line in _readelf(path, "--dyn-syms").splitlines():
        parts = line.split()  # Num: Value Size Type Bind Vis Ndx Name
        if len(parts) >= 8 and parts[0].endswith(":") and parts[0][:-1].isdigit():
            if (parts[6] != "UND") == defined:
                names.append(parts[7].split("@")[0])
    return names


def needed(path: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf(path, "--dynamic"))


def unfit(path: Path) -> str | None:
    """Why ``path`` would end the GPU host's process, or None where it can run there."""
    try:
        calls = sorted(s for s in dynamic_symbols(path, defined=False) if DRIVER_SYMBOL.match(s))
        if calls and DRIVER_LIBRARY not in needed(path):
            shown = ", ".join(calls[:4]) + (f" and {len(calls) - 4} more" if len(calls) > 4 else "")
            return (f"calls the CUDA driver ({shown}) without listing {DRIVER_LIBRARY} as NEEDED (as when "
                    f"linked against a libcuda stub that defines none of them): its first call would end the process")
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return str(err)
    return None


def modules(paths: list[Path]) -> list[Path]:
    return [m for p in paths for m in (sorted(p.rglob("*.so")) if p.is_dir() else [p])]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", type=Path, nargs="+")
    p.add_argument("--names", action="store_true", help="print only the unfit modules' paths, one a line")
    a = p.parse_args(argv)
    bad = 0
    for module in modules(a.paths):
        why = unfit(module)
        bad += why is not None
        if why is not None:
            print(module if a.names else f"{module}: {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
