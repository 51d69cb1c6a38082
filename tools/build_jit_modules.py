"""Compile the FlashInfer JIT modules of the SM90 kernels on a machine with nvcc and no GPU, into a tarball of
FlashInfer AOT modules that ``ci/setup.sh`` installs on a GPU host (so a fresh host does not spend minutes in nvcc).

    python -m tools.build_jit_modules [--out .gpu/jit/fi-aot.tgz] [--list]

The modules are those of ``fixtures/flashinfer/jit_modules.py`` for the installed FlashInfer. Each is built by
FlashInfer's own JitSpec (its sources, flags and module name; the name is a hash of the sources and flags, so a
module built here is the one the GPU host would build) for ``FLASHINFER_CUDA_ARCH_LIST`` (default 9.0a). nvcc
must be the host's CUDA major version, and its toolkit must hold the cuBLAS, NVRTC and cuRAND headers (a full
toolkit does; a bare nvcc can take them from the nvidia-cublas, nvidia-cuda-nvrtc and nvidia-curand wheels'
include folders). ``CUDA_HOME`` names the toolkit where ``which nvcc`` does not sit in it.

The tarball holds ``flashinfer-aot/<name>/<name>.so`` and ``flashinfer-aot/BUILD_INFO`` (FlashInfer version,
nvcc version, arch list); ``ci/restore_aot_modules.sh`` installs it only into the same FlashInfer version. Each
module is checked before it is packed, and again before it is installed, for the one fault that a build without
a GPU can make and that FlashInfer cannot recover from: calls into the CUDA driver without libcuda.so.1 among its
NEEDED libraries (``ci/aot_linkage.py``). Such a module is not a load failure that FlashInfer would rebuild: the
dynamic loader ends the process at the module's first driver call (the H200, 2026-12-01, eighth session: every
module built against an empty libcuda stub, exit 127 in the middle of the run).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from ci import ROOT, aot_linkage
from tools import driver_stub

# What the modules' sources include or link beyond nvcc itself, and where a bare nvcc can take it from; a full
# toolkit has all of it (this project's CPU machine, 2026-12-01, had none of it: ninja stopped on each in turn)
TOOLKIT_NEEDS = (
    ("include/cublasLt.h", "the nvidia-cublas wheel's nvidia/cu13/include"),
    ("include/nvrtc.h", "the nvidia-cuda-nvrtc wheel's nvidia/cu13/include"),
    ("include/curand_kernel.h", "the nvidia-curand wheel's nvidia/cu13/include"),
    ("lib64/libcudart.so", "the toolkit's cudart (nvidia-cuda-runtime wheel: nvidia/cu13/lib)"),
    ("lib64/stubs/libcuda.so", "the toolkit's driver stub; without a toolkit, python -m tools.driver_stub writes one"),
)
STUB = "lib64/stubs/libcuda.so"


def missing_from_toolkit(cuda_home: str | Path) -> list[str]:
    """What TOOLKIT_NEEDS lacks under ``cuda_home``, each with where to take it from. The driver stub must also
    define the driver's symbols: one that only carries the soname links, and the modules it makes end the GPU
    host's process (ci/aot_linkage.py; an empty stub did so on the H200, 2026-12-01)."""
    missing = [f"{cuda_home}/{rel} (from {source})" for rel, source in TOOLKIT_NEEDS
               if not (Path(cuda_home) / rel).exists()]
    stub = Path(cuda_home) / STUB
    if stub.exists() and not driver_stub.exports_driver(stub):
        missing.append(f"{stub} defines no driver symbol ({driver_stub.PROBE}): the modules would not list "
                       f"libcuda.so.1; python -m tools.driver_stub writes a stub that does")
    return missing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / ".gpu" / "jit" / "fi-aot.tgz")
    p.add_argument("--list", action="store_true", help="list the modules and build nothing")
    a = p.parse_args(argv)
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    from flashinfer.jit.cpp_ext import get_cuda_path  # the toolkit FlashInfer compiles with

    from fixtures.flashinfer import jit_modules

    if not a.list and (missing := missing_from_toolkit(get_cuda_path())):
        print("the CUDA toolkit FlashInfer found (CUDA_HOME, else `which nvcc`'s parent) lacks:\n  "
              + "\n  ".join(missing))
        return 2
    version = importlib.metadata.version("flashinfer-python")
    table = jit_modules.calls(version)
    if not table:
        print(f"flashinfer-python {version}: no JIT module table (fixtures/flashinfer/jit_modules.py)")
        return 2
    built, failed = {}, []
    for kernel, calls in table.items():
        for call in calls:
            spec = jit_modules.spec(call)
            if a.list:
                print(f"{kernel}: {spec.name} <- {call}")
                continue
            started = time.monotonic()
            library = Path(spec.jit_library_path)
            try:
                spec.build(need_lock=True)
                if why := aot_linkage.unfit(library):  # linked before the stub was mended? ninja does not track -lcuda
                    library.unlink()
                    spec.build(need_lock=True)
                    why = aot_linkage.unfit(library)
            except Exception as err:  # noqa: BLE001 (the next module may still build; the summary says which not)
                failed.append(spec.name)
                print(f"{kernel}: {spec.name} FAILED: {type(err).__name__}: {str(err)[-600:]}", flush=True)
                continue
            if why:
                failed.append(spec.name)
                print(f"{kernel}: {spec.name} built, NOT PACKED: {why}", flush=True)
                continue
            built[spec.name] = library
            print(f"{kernel}: {spec.name} built in {time.monotonic() - started:.0f} s", flush=True)
    if a.list:
        return 0
    nvcc = subprocess.run([os.path.join(get_cuda_path(), "bin", "nvcc"), "--version"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "flashinfer-aot"
        for name, library in built.items():
            (root / name).mkdir(parents=True)
            shutil.copy2(library, root / name / f"{name}.so")
        root.mkdir(exist_ok=True)
        (root / "BUILD_INFO").write_text(f"flashinfer-python {version}\n"
                                         f"arch {os.environ['FLASHINFER_CUDA_ARCH_LIST']}\n"
                                         f"nvcc {nvcc[-1] if nvcc else 'unknown'}\n")
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(a.out, "w:gz") as tar:
            tar.add(root, arcname="flashinfer-aot")
    print(f"{len(built)} modules into {a.out}" + (f"; {len(failed)} failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
