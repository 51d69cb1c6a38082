"""Whether a FlashInfer module built off the GPU host (``tools.build_jit_modules``) can run there: every CUDA driver
symbol it calls must come from a library it lists as NEEDED, libcuda.so.1.

Why: in the suite's process the driver is opened with ``dlopen`` (by the CUDA runtime), not made global, so its
symbols are there only for libraries that list it. A module that calls ``cuLibraryLoadData`` without listing
libcuda.so.1 loads fine, then the dynamic loader ends the whole process at the first call ("symbol lookup error:
... undefined symbol: cuLibraryLoadData", exit 127, no pytest summary: reference.evidence.AOT_CRASH_AND_CUT_SHORT). A
module linked against a libcuda stub that exports nothing comes out that way, because the linker's
``--as-needed`` drops a library that defines none of the symbols.

    python -m ci.aot_linkage [--names] [--load] PATH...   # modules (.so) or folders of them; exit 1 if one is unfit

``--load`` also loads each module in a process like FlashInfer's (torch and tvm_ffi imported) with ``RTLD_NOW``,
which binds every symbol at load: any symbol this host cannot supply is then an error, not a death at its first
call. On the CPU machine, FlashInfer's own loader under ``LD_BIND_NOW=1`` refused the 7 modules this rule names,
and loaded the other 9 and all 16 of the rebuilt tarball (a libcuda.so.1 stub on the library path).

Needs binutils' ``readelf``. Where it is missing, every module counts as unfit: an unchecked module can end the
run, and a module left out is only compiled by FlashInfer as usual.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from ci import cli

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
        said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "readelf failed"
        raise RuntimeError(f"not an ELF shared object ({said})")
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
            return (
                f"calls the CUDA driver ({shown}) without listing {DRIVER_LIBRARY} as NEEDED (as when "
                f"linked against a libcuda stub that defines none of them): its first call would end the process"
            )
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return str(err)
    return None


# FlashInfer's process holds torch and tvm_ffi before it loads a module (tvm_ffi's symbols come from there, and
# libcudart from torch); RTLD_NOW binds every symbol at once, so a missing one is an error here, not a death later
_LOADER = """
import ctypes, os, sys
for name in ("torch", "tvm_ffi"):
    try:
        __import__(name)
    except ImportError as err:
        print("!" + name + "\t" + str(err), flush=True)
for path in sys.argv[1:]:
    try:
        ctypes.CDLL(path, mode=os.RTLD_NOW)
    except OSError as err:
        print(path + "\t" + str(err).replace(path + ": ", ""), flush=True)
"""


def load_failures(paths: list[Path], python: str = sys.executable) -> dict[Path, str]:
    """Each module of ``paths`` that a process like FlashInfer's cannot load with every symbol bound, and why. A
    check for this host: another host has other libraries (the CPU machine has no libcuda.so.1 at all)."""
    if not paths:
        return {}
    try:
        done = subprocess.run([python, "-c", _LOADER, *map(str, paths)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {p: "the bind-now load did not end within 600 s" for p in paths}
    if done.returncode != 0:  # a static constructor that ends the process: none of them is trusted
        return {
            p: f"the bind-now load ended its process (status {done.returncode}): {done.stderr.strip()[-300:]}"
            for p in paths
        }
    failed = dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)
    missing = "".join(f" ({p[1:]} not importable by {python}: {why})" for p, why in failed.items() if p.startswith("!"))
    return {
        Path(p): f"would not load with every symbol bound: {why}{missing}"
        for p, why in failed.items()
        if not p.startswith("!")
    }


def modules(paths: list[Path]) -> list[Path]:
    return [m for p in paths for m in (sorted(p.rglob("*.so")) if p.is_dir() else [p])]


@cli.command("ci.aot_linkage")
def main(argv=None) -> int:
    p = cli.Parser(
        "ci.aot_linkage",
        description=__doc__.splitlines()[0],
        codes={cli.VERDICT: "a module is unfit (each named on stdout, with why unless --names)"},
    )
    p.add_argument("paths", type=Path, nargs="+")
    p.add_argument("--names", action="store_true", help="print only the unfit modules' paths, one a line")
    p.add_argument(
        "--load",
        action="store_true",
        help="also load each module here with every symbol bound (on the GPU host, before installing)",
    )
    a = p.parse_args(argv)
    found = modules(a.paths)
    why = {m: reason for m in found if (reason := unfit(m))}
    if a.load:
        why.update(load_failures([m for m in found if m not in why]))
    for module in found:
        if module in why:
            print(module if a.names else f"{module}: {why[module]}")
    return cli.VERDICT if why else cli.OK


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
