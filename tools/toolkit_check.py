"""What the FlashInfer JIT modules need from a CUDA toolkit beyond nvcc, and what a toolkit lacks of it, each piece
named with where it comes from, so that ``tools.build_jit_modules`` stops before compiling instead of in ninja.

The libraries are read from the modules' own ninja files, as FlashInfer's JitSpec writes them: its ``ldflags``
(``-L$cuda_home/lib64 -L$cuda_home/lib64/stubs -lcudart -lcuda`` and each module's own, such as push_cuda's GEMM
``-lnvrtc``) are resolved as the linker would, in the ``-L`` folders and then the compiler's own. The headers are
those the modules' sources include that a bare nvcc's tree lacks (ninja stopped on each in turn without them:
reference.evidence.AOT_BUILT_ON_CPU).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tools import driver_stub

HEADERS = (
    ("cuda.h", "nvidia-cuda-runtime"),
    ("cuda_runtime.h", "nvidia-cuda-runtime"),
    ("cublasLt.h", "nvidia-cublas"),
    ("nvrtc.h", "nvidia-cuda-nvrtc"),
    ("curand_kernel.h", "nvidia-curand"),
)
WHEEL_OF = {
    "cudart": "nvidia-cuda-runtime",
    "nvrtc": "nvidia-cuda-nvrtc",
    "cublas": "nvidia-cublas",
    "cublasLt": "nvidia-cublas",
    "curand": "nvidia-curand",
}
DRIVER = "cuda"  # -lcuda: the driver stub, whose symbols must be defined (ci/aot_linkage.py says why)
_LDFLAGS = re.compile(r"^ldflags = ((?:.*\$\n)*.*)$", re.M)


@dataclass
class Links:
    """What a set of modules links: the ``-L`` folders in order (``$cuda_home`` unexpanded) and each ``-l``
    library with the modules that link it."""

    folders: list[str] = field(default_factory=list)
    libraries: dict[str, list[str]] = field(default_factory=dict)


def ldflags(ninja: str) -> list[str]:
    """The tokens of a ninja file's ``ldflags`` variable (its lines continue with ``$``)."""
    found = _LDFLAGS.search(ninja)
    return found.group(1).replace("$\n", " ").split() if found else []


def links(ninjas: dict[str, str]) -> Links:
    """What the modules link, from their ninja files (module name -> text)."""
    out = Links()
    for module, text in ninjas.items():
        for token in ldflags(text):
            if token.startswith("-L") and token[2:] not in out.folders:
                out.folders.append(token[2:])
            elif token.startswith("-l"):
                users = out.libraries.setdefault(token[2:], [])
                if module not in users:
                    users.append(module)
    return out


def compiler_folders(cxx: str = "c++") -> list[Path]:
    """The folders the compiler's link searches after the ``-L`` ones (``-print-search-dirs``)."""
    try:
        said = subprocess.run([cxx, "-print-search-dirs"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return []
    found = re.search(r"^libraries: =(.*)$", said, re.M)
    return [Path(p) for p in found.group(1).split(":") if p] if found else []


def resolve(library: str, folders: list[Path]) -> Path | None:
    """The file ``-l<library>`` links, as the linker picks it: the first folder holding it, .so before .a."""
    for folder in folders:
        for suffix in (".so", ".a"):
            if (folder / f"lib{library}{suffix}").exists():
                return folder / f"lib{library}{suffix}"
    return None


def _source(library: str) -> str:
    if library == DRIVER:
        return "the driver stub, which python -m tools.driver_stub writes from cuda.h"
    if library in WHEEL_OF:
        return (
            f"the {WHEEL_OF[library]} wheel's lib folder (it ships only lib{library}.so.<major>: "
            f"the link needs the unversioned name)"
        )
    return "not a CUDA library this project knows"


def missing(cuda_home: Path, needs: Links, after: list[Path] = ()) -> list[str]:
    """Each piece ``cuda_home`` lacks, one line naming it and where it comes from; ``after``: the folders the link
    searches after the ``-L`` ones."""
    lines = []
    if not (cuda_home / "bin" / "nvcc").exists():
        lines.append(
            f"{cuda_home}/bin/nvcc: no nvcc (a toolkit's, or the nvidia-cuda-nvcc wheel's, of the GPU "
            f"host's CUDA major)"
        )
    for header, wheel in HEADERS:
        if not (cuda_home / "include" / header).exists():
            lines.append(f"{cuda_home}/include/{header}: from the {wheel} wheel's include folder")
    folders = [Path(f.replace("$cuda_home", str(cuda_home))) for f in needs.folders]
    for library, users in needs.libraries.items():
        found = resolve(library, [*folders, *after])
        who = users[0] if len(users) == 1 else f"{len(users)} modules"
        if found is None:
            lines.append(
                f"lib{library}.so (-l{library}, linked by {who}) is in none of "
                f"{', '.join(map(str, folders))}: from {_source(library)}"
            )
        elif library == DRIVER and not driver_stub.exports_driver(found):
            lines.append(
                f"{found} defines no driver symbol ({driver_stub.PROBE}): the modules would not list "
                f"libcuda.so.1 (ci/aot_linkage.py); python -m tools.driver_stub writes a stub that does"
            )
    return lines
