"""Compile the FlashInfer JIT modules of the SM90 kernels on a machine with nvcc and no GPU, into a tarball of
FlashInfer AOT modules that ``ci/setup.sh`` installs on a GPU host (so a fresh host does not spend minutes in nvcc).

    python -m tools.build_jit_modules [--out .gpu/jit/fi-aot.tgz] [--toolkit DIR] [--list]

The modules are those of ``fixtures/backends/flashinfer/jit_modules.py`` for the installed FlashInfer. Each is built by
FlashInfer's own JitSpec (its sources, flags and module name; the name is a hash of the sources and flags, so a
module built here is the one the GPU host would build) for ``FLASHINFER_CUDA_ARCH_LIST`` (default 9.0a).

The toolkit: ``CUDA_HOME`` where it is given and holds everything the modules include and link
(``tools/toolkit_check.py`` reads what they link from their ninja files), else nvcc's own tree where that does; else
the builder assembles one of its own in ``--toolkit`` (default ``~/.cache/moe-conformance/toolkit-cu<major>``)
from that nvcc, the NVIDIA wheels of its CUDA major (pip) and a driver stub (``tools/toolkit_assembly.py``). nvcc
must be of the GPU host's CUDA major. Whatever is still missing is named, one line each, before anything compiles.

The tarball holds ``flashinfer-aot/<name>/<name>.so`` and ``flashinfer-aot/BUILD_INFO`` (FlashInfer version,
nvcc version, arch list); ``ci/restore_aot_modules.sh`` installs it only into the same FlashInfer version. Each
module is checked before it is packed, and again before it is installed, for the one fault that a build without
a GPU can make and that FlashInfer cannot recover from: calls into the CUDA driver without libcuda.so.1 among its
NEEDED libraries (``ci/aot_linkage.py``; the dynamic loader ends the process at the module's first driver call:
reference.evidence.AOT_CRASH_AND_CUT_SHORT).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from ci import ROOT, aot_linkage, cli
from tools import toolkit_assembly, toolkit_check


def _use(cuda_home: Path) -> None:
    """Point FlashInfer at ``cuda_home`` (it caches the toolkit it found on first use)."""
    from flashinfer.jit import cpp_ext

    os.environ["CUDA_HOME"] = str(cuda_home)
    cpp_ext.get_cuda_path.cache_clear()
    cpp_ext.get_cuda_version.cache_clear()


def _toolkit(specs, given: str | None, nvcc: Path, folder: Path | None) -> Path:
    """The toolkit to build with (see the module's docstring): ``given`` (CUDA_HOME) or ``nvcc``'s tree where it is
    complete, else one assembled from ``nvcc``; raises AssemblyError with the lines of what still lacks."""
    ninjas = {}
    for spec in specs:  # the ninja file FlashInfer's build would write (and rewrites as it builds)
        spec.write_ninja()
        ninjas[spec.name] = spec.ninja_path.read_text()
    needs = toolkit_check.links(ninjas)
    after = toolkit_check.compiler_folders(os.environ.get("CXX", "c++"))
    candidate = Path(given) if given else toolkit_assembly.top(nvcc)
    if not (lacks := toolkit_check.missing(candidate, needs, after)):
        return candidate
    if given:
        print(f"CUDA_HOME={given} lacks:\n  " + "\n  ".join(lacks))
    major = toolkit_assembly.release(nvcc).split(".")[0]
    folder = folder or toolkit_assembly.cache_root() / f"toolkit-cu{major}"
    print(
        f"assembling a CUDA toolkit in {folder} from {nvcc} ({len(lacks)} pieces missing from {candidate}) "
        f"and the wheels {' '.join(toolkit_assembly.PINS.get(int(major), ()))}",
        flush=True,
    )
    cuda = toolkit_assembly.assemble(nvcc, folder)
    if lacks := toolkit_check.missing(cuda, needs, after):
        raise toolkit_assembly.AssemblyError(f"the assembled toolkit {cuda} lacks:\n  " + "\n  ".join(lacks))
    return cuda


def _build(spec) -> tuple[Path | None, str]:
    """Build one module: its library, or None and why not."""
    library = Path(spec.jit_library_path)
    try:
        spec.build(need_lock=True)
        if why := aot_linkage.unfit(library):  # linked before the stub was mended? ninja does not track -lcuda
            library.unlink()
            spec.build(need_lock=True)
            why = aot_linkage.unfit(library)
    except Exception as err:  # noqa: BLE001 (the next module may still build; the summary says which not)
        return None, f"FAILED: {type(err).__name__}: {str(err)[-600:]}"
    return (None, f"built, NOT PACKED: {why}") if why else (library, "built")


def _pack(built: dict[str, Path], out: Path, version: str) -> None:
    from flashinfer.jit.cpp_ext import get_cuda_path

    nvcc = (
        subprocess.run([os.path.join(get_cuda_path(), "bin", "nvcc"), "--version"], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "flashinfer-aot"
        for name, library in built.items():
            (root / name).mkdir(parents=True)
            shutil.copy2(library, root / name / f"{name}.so")
        root.mkdir(exist_ok=True)
        (root / "BUILD_INFO").write_text(
            f"flashinfer-python {version}\n"
            f"arch {os.environ['FLASHINFER_CUDA_ARCH_LIST']}\n"
            f"nvcc {nvcc[-1] if nvcc else 'unknown'}\n"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz") as tar:
            tar.add(root, arcname="flashinfer-aot")


@cli.command("tools.build_jit_modules")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.build_jit_modules",
        description=__doc__.splitlines()[0],
        codes={
            cli.VERDICT: "a module failed to build (the others are packed)",
            cli.INPUT: "a bad argument; CUDA_HOME without bin/nvcc; or a flashinfer-python version "
            "with no JIT module table",
            cli.INCOMPLETE: "no flashinfer-python, no nvcc, or a toolkit that lacks what the modules "
            "need (the output says what)",
        },
    )
    p.add_argument("--out", type=Path, default=ROOT / ".gpu" / "jit" / "fi-aot.tgz")
    p.add_argument(
        "--toolkit",
        type=Path,
        default=None,
        help="where to assemble a toolkit when there is none (default ~/.cache/moe-conformance/toolkit-cuN)",
    )
    p.add_argument("--list", action="store_true", help="list the modules and build nothing")
    a = p.parse_args(argv)
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    from fixtures.backends.flashinfer import jit_modules

    try:
        version = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        raise cli.Incomplete("flashinfer-python is not installed here: nothing to build the modules of") from None
    table = jit_modules.calls(version)
    if not table:
        print(f"flashinfer-python {version}: no JIT module table (fixtures/backends/flashinfer/jit_modules.py)")
        return cli.INPUT
    given = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = Path(given) / "bin" / "nvcc" if given else Path(shutil.which("nvcc") or "/nonexistent/nvcc")
    if not nvcc.exists():
        print(
            f"no nvcc: {'CUDA_HOME has no bin/nvcc' if given else 'none on the PATH and CUDA_HOME unset'}; "
            f"nvcc of the GPU host's CUDA major is needed (a toolkit's, or the nvidia-cuda-nvcc wheel's)"
        )
        return cli.INPUT if given else cli.INCOMPLETE
    try:
        _use(Path(given) if given else toolkit_assembly.top(nvcc))  # the generators ask nvcc its version
        modules = [(kernel, jit_modules.spec(call), call) for kernel, calls in table.items() for call in calls]
        if a.list:
            for kernel, spec, call in modules:
                print(f"{kernel}: {spec.name} <- {call}")
            return cli.OK
        cuda = _toolkit([spec for _, spec, _ in modules], given, nvcc, a.toolkit)
    except toolkit_assembly.AssemblyError as err:
        print(err)
        return cli.INCOMPLETE
    _use(cuda)
    print(f"toolkit {cuda}; building {len(modules)} modules with MAX_JOBS={os.environ['MAX_JOBS']}", flush=True)
    built, failed = {}, []
    for kernel, spec, _ in modules:
        started = time.monotonic()
        library, said = _build(spec)
        print(
            f"{kernel}: {spec.name} {said}" + (f" in {time.monotonic() - started:.0f} s" if library else ""), flush=True
        )
        if library:
            built[spec.name] = library
        else:
            failed.append(spec.name)
    _pack(built, a.out, version)
    print(f"{len(built)} modules into {a.out}" + (f"; {len(failed)} failed: {', '.join(failed)}" if failed else ""))
    return cli.VERDICT if failed else cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
