"""Write a link-time stub of the CUDA driver, ``libcuda.so`` with soname libcuda.so.1, that exports every driver
entry point ``cuda.h`` declares, for a toolkit that has none (a bare nvcc taken from wheels has no lib64/stubs).

    python -m tools.driver_stub [--cuda-home DIR] [--out FILE]   # default $CUDA_HOME/lib64/stubs/libcuda.so

The stub is only linked against, never run: on the GPU host the module finds the real driver by the soname. It
must define the symbols, or the linker's ``--as-needed`` drops it and the module does not list libcuda.so.1 at all
(``ci.aot_linkage`` says why that ends the process on the GPU host). Each function returns CUDA_ERROR_UNKNOWN.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ci import aot_linkage, cli

DECLARATION = re.compile(r"\bCUresult\s+(?:CUDAAPI\s+)?(cu[A-Z]\w*)\s*\(")
CUDA_ERROR_UNKNOWN = 999
PROBE = "cuGetErrorString"  # in every driver since CUDA 6; the FP8 push kernel's module calls it


def exports_driver(library: Path) -> bool:
    """Whether ``library`` defines the driver's symbols (a real stub, or this one), not just carries the soname."""
    try:
        return PROBE in aot_linkage.dynamic_symbols(library, defined=True)
    except RuntimeError:
        return False


def entry_points(cuda_home: Path, cc: str) -> list[str]:
    """Every driver function cuda.h declares: as written (cuCtxCreate), as its macros make it (cuCtxCreate_v4),
    and in the per-thread default stream's spelling (cuMemcpyAsync_ptsz), since compiled code names any of them."""
    header = cuda_home / "include" / "cuda.h"
    names = set(DECLARATION.findall(header.read_text()))
    for defines in ([], ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"]):
        done = subprocess.run(
            [cc, "-E", "-P", "-x", "c", *defines, f"-I{cuda_home / 'include'}", str(header)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        names |= set(DECLARATION.findall(done.stdout))
    return sorted(names)


def write(cuda_home: Path, out: Path, cc: str = "cc") -> int:
    names = entry_points(cuda_home, cc)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "libcuda_stub.c"
        source.write_text("".join(f"int {n}(void) {{ return {CUDA_ERROR_UNKNOWN}; }}\n" for n in names))
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out), str(source)], check=True, timeout=300
        )
    return len(names)


@cli.command("tools.driver_stub")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.driver_stub",
        description=__doc__.splitlines()[0],
        codes={
            cli.VERDICT: "the stub was written, yet exports no driver entry point",
            cli.INPUT: "--cuda-home names no folder",
            cli.INCOMPLETE: "no --cuda-home, and FlashInfer cannot name a CUDA toolkit here",
        },
    )
    p.add_argument("--cuda-home", type=Path, default=None, help="default: the toolkit FlashInfer compiles with")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    cuda_home = a.cuda_home
    if cuda_home is not None and not cuda_home.is_dir():
        raise cli.InputError(f"--cuda-home {cuda_home}: no such folder; give a CUDA toolkit's folder")
    if cuda_home is None:
        try:
            from flashinfer.jit.cpp_ext import get_cuda_path

            cuda_home = Path(get_cuda_path())
        except Exception as err:  # noqa: BLE001 (no FlashInfer, or no toolkit it can find)
            raise cli.Incomplete(
                f"no CUDA toolkit found through FlashInfer ({type(err).__name__}: {err}); give --cuda-home"
            ) from None
    out = a.out or cuda_home / "lib64" / "stubs" / "libcuda.so"
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    count = write(cuda_home, out, cc)
    if not exports_driver(out):
        print(f"{out}: written, yet it exports no {PROBE}")
        return cli.VERDICT
    print(f"{out}: {count} driver entry points, soname libcuda.so.1")
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
