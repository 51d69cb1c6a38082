"""A CUDA toolkit folder of the builder's own, for ``tools.build_jit_modules`` on a machine whose nvcc has no full
toolkit around it (only nvcc's own tree: no cuBLAS, NVRTC or cuRAND, no driver stub).

The folder (``<cache>/toolkit-cu13/cuda``) is nvcc's own tree, with the headers and libraries of the NVIDIA wheels
of the same CUDA major merged into its ``include`` and ``lib64`` (symbolic links; the wheels are installed with pip
into ``<cache>/toolkit-cu13/wheels``), the unversioned names the linker looks for (``libnvrtc.so`` for
``-lnvrtc``: the wheels ship only ``libnvrtc.so.13``) and a driver stub written by ``tools.driver_stub``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools import driver_stub

# CUDA 13.0's releases of the four libraries, as the 13.0.88 nvcc of the CPU machine's toolkit came with: the
# cuBLAS, NVRTC and cuRAND ones are those the modules were first built with (reference.evidence.AOT_BUILT_ON_CPU)
PINS = {
    13: (
        "nvidia-cublas==13.0.2.14",
        "nvidia-cuda-nvrtc==13.0.88",
        "nvidia-curand==10.4.0.35",
        "nvidia-cuda-runtime==13.0.96",
    ),
}
INSTALLED = "INSTALLED"  # in the wheels folder: the pins pip installed there, one a line
VERSIONED = re.compile(r"^(lib.+?\.so)\.\d+(\.\d+)*$")


class AssemblyError(RuntimeError):
    """One line: what could not be assembled and why."""


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moe-conformance"


def release(nvcc: Path) -> str:
    """nvcc's CUDA release ("13.0")."""
    try:
        said = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError as err:
        raise AssemblyError(f"{nvcc} does not run: {err}") from err
    if not (found := re.search(r"release (\d+\.\d+)", said)):
        raise AssemblyError(f"{nvcc} --version names no CUDA release")
    return found.group(1)


def top(nvcc: Path) -> Path:
    """The folder of nvcc's own tree: what nvcc calls TOP (a wrapper script on the PATH, such as /usr/local/bin/nvcc
    exec'ing the real one, has no tree of its own), else the real file's grandparent."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [str(nvcc), "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True, text=True, timeout=60, cwd=tmp
        )
    if found := re.search(r"^#\$ TOP=(.+)$", done.stderr + done.stdout, re.M):
        return Path(found.group(1).strip()).resolve()
    return nvcc.resolve().parent.parent


def install_wheels(target: Path, pins: tuple[str, ...], python: str = sys.executable) -> None:
    """The wheels of ``pins`` in ``target`` (pip --target), unless the pins installed there are these."""
    marker = target / INSTALLED
    if marker.exists() and marker.read_text().split() == list(pins):
        return
    shutil.rmtree(target, ignore_errors=True)
    done = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "--target",
            str(target),
            *pins,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise AssemblyError(f"pip could not install {' '.join(pins)} into {target}: {said}")
    marker.write_text("\n".join(pins) + "\n")


def merge(dst: Path, sources: list[Path], real: frozenset[str] = frozenset(), at: str = "") -> None:
    """``dst`` as the union of the ``sources`` folders, the first holding a name winning: a name in one source only
    (or a file) is a symbolic link to it; a folder in several, or one whose relative path is in ``real``, is a
    folder of ``dst``'s own, merged the same way (so files can be added there without touching a source)."""
    dst.mkdir(parents=True, exist_ok=True)
    names = dict.fromkeys(n for s in sources for n in sorted(os.listdir(s)))
    for name in names:
        here = [s / name for s in sources if (s / name).exists()]
        rel = f"{at}/{name}".lstrip("/")
        folders = [h for h in here if h.is_dir()]
        if here[0].is_dir() and (len(folders) > 1 or rel in real):
            merge(dst / name, folders, real, rel)
        elif here:
            (dst / name).symlink_to(here[0])


def link_unversioned(libdir: Path) -> list[str]:
    """``libX.so`` beside each ``libX.so.N`` that lacks one (what ``-lX`` finds); the names added."""
    added = []
    for path in sorted(libdir.iterdir()):
        if (found := VERSIONED.match(path.name)) and not (libdir / found.group(1)).exists():
            (libdir / found.group(1)).symlink_to(path.name)
            added.append(found.group(1))
    return added


def assemble(nvcc: Path, folder: Path, cc: str | None = None) -> Path:
    """``folder/cuda``: nvcc's tree, the wheels of its CUDA major and a driver stub (see the module's docstring)."""
    version = release(nvcc)
    major = int(version.split(".")[0])
    if major not in PINS:
        raise AssemblyError(
            f"{nvcc} is CUDA {version}: a toolkit can be assembled for CUDA "
            f"{', '.join(map(str, PINS))} only (tools/toolkit_assembly.py PINS)"
        )
    install_wheels(folder / "wheels", PINS[major])
    wheels = folder / "wheels" / "nvidia" / f"cu{major}"
    overlay = folder / "overlay"  # the wheels' folders under the names a toolkit gives them
    shutil.rmtree(overlay, ignore_errors=True)
    overlay.mkdir(parents=True)
    (overlay / "include").symlink_to(wheels / "include")
    (overlay / "lib64").symlink_to(wheels / "lib")
    cuda = folder / "cuda"
    shutil.rmtree(cuda, ignore_errors=True)  # links only: rmtree unlinks them, it does not follow them
    merge(cuda, [top(nvcc), overlay], real=frozenset({"include", "lib64", "lib64/stubs"}))
    link_unversioned(cuda / "lib64")
    stub = cuda / "lib64" / "stubs" / "libcuda.so"
    if not (stub.exists() and driver_stub.exports_driver(stub)):
        if not (cuda / "include" / "cuda.h").exists():
            raise AssemblyError(f"{cuda}/include/cuda.h missing (nvidia-cuda-runtime wheel): no driver stub written")
        stub.unlink(missing_ok=True)
        cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise AssemblyError("no C compiler (cc, gcc or $CC) to write the driver stub with")
        driver_stub.write(cuda, stub, cc)
    return cuda
