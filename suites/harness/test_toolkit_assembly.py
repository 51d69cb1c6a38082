"""The AOT-module toolkit on fake toolkit trees, wheels and modules compiled here (no network, no nvcc):
tools/toolkit_check.py names each piece a toolkit lacks (libnvrtc.so too, reference.evidence.AOT_BUILT_ON_CPU) and
tools/toolkit_assembly.py assembles one from a bare nvcc's tree and the wheels; ci/aot_linkage.py's rule for a module's
"undefined symbol: cuLibraryLoadData" (an H200 run ended so, exit 127) agrees with the loader's (dlopen RTLD_NOW), and
tools/driver_stub.py writes a stub that defines the driver's symbols."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci import aot_linkage, cli
from fixtures.backends.flashinfer import jit_modules
from fixtures.backends.flashinfer.descriptors import installed_version
from suites.harness.shared_objects import CC, DRIVER_CALLER, FAKE_CUDA_H, NO_DRIVER, compile_so
from tools import driver_stub, toolkit_assembly, toolkit_check

pytestmark = [
    pytest.mark.harness,
    pytest.mark.cpu,
    pytest.mark.skipif(CC is None, reason="no C compiler (cc/gcc) to build the stand-in libraries"),
]
ROOT = Path(__file__).resolve().parents[2]
MODULES = sum(len(calls) for calls in jit_modules.calls(installed_version()).values())
# a FlashInfer ninja file's link variable, as its JitSpec writes it for push_cuda's GEMM (extra ldflags -lnvrtc -lcuda)
NINJA = """cuda_home = /elsewhere
ldflags = -shared $
    -L$cuda_home/lib64 $
    -L$cuda_home/lib64/stubs $
    -lcudart $
    -lcuda $
    -lnvrtc $
    -lcuda

rule compile
"""
# answers --version as CUDA 13.0's nvcc does, compiles nothing
FAKE_NVCC = """#!/bin/sh
case "$1" in --version) echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0;; esac
echo "fake nvcc: compiles nothing" >&2; exit 1
"""


def _tree(root: Path, headers=(), libraries=(), nvcc=True, cuda_h=True) -> Path:
    """A toolkit-shaped folder: bin/nvcc, include/<headers> (cuda.h a real declaration list), lib64/<libraries>."""
    (root / "include").mkdir(parents=True)
    (root / "lib64").mkdir()
    if nvcc:
        (root / "bin").mkdir()
        (root / "bin" / "nvcc").write_text(FAKE_NVCC)
        (root / "bin" / "nvcc").chmod(0o755)
    if cuda_h:
        (root / "include" / "cuda.h").write_text(FAKE_CUDA_H)
    for header in headers:
        (root / "include" / header).write_text("")
    for library in libraries:
        (root / "lib64" / library).write_text("")
    return root


def _complete(root: Path) -> Path:
    tree = _tree(root, ("cuda_runtime.h", "cublasLt.h", "nvrtc.h", "curand_kernel.h"), ("libcudart.so", "libnvrtc.so"))
    driver_stub.write(tree, tree / "lib64" / "stubs" / "libcuda.so", CC)
    return tree


def _wheels(folder: Path, nvrtc: bool = True) -> Path:
    """``folder/wheels`` as pip --target leaves the four cu13 wheels (versioned sonames only), marked installed."""
    cu13 = folder / "wheels" / "nvidia" / "cu13"
    (cu13 / "include").mkdir(parents=True)
    (cu13 / "lib").mkdir()
    for header in ("cuda.h", "cuda_runtime.h", "cublasLt.h", "nvrtc.h", "curand_kernel.h"):
        (cu13 / "include" / header).write_text(FAKE_CUDA_H if header == "cuda.h" else "")
    for library in "libcudart.so.13 libcublas.so.13 libcurand.so.10 libnvrtc-builtins.so.13.0".split():
        (cu13 / "lib" / library).write_text("")
    if nvrtc:
        (cu13 / "lib" / "libnvrtc.so.13").write_text("")
    (folder / "wheels" / toolkit_assembly.INSTALLED).write_text("\n".join(toolkit_assembly.PINS[13]) + "\n")
    return folder


def test_the_links_are_read_from_the_ninja_file():
    needs = toolkit_check.links({"gemm": NINJA, "a2a": NINJA.replace("-lnvrtc $\n", "")})
    assert needs.folders == ["$cuda_home/lib64", "$cuda_home/lib64/stubs"]
    assert needs.libraries == {"cudart": ["gemm", "a2a"], "cuda": ["gemm", "a2a"], "nvrtc": ["gemm"]}


def test_the_check_names_a_missing_libnvrtc_and_passes_a_complete_tree(tmp_path):
    tree = _complete(tmp_path / "cuda")
    needs = toolkit_check.links({"sm90_push_fp8_moe_gemm_x": NINJA})
    assert toolkit_check.missing(tree, needs) == []
    (tree / "lib64" / "libnvrtc.so").unlink()
    lacks = toolkit_check.missing(tree, needs)
    assert len(lacks) == 1 and lacks[0].startswith("libnvrtc.so (-lnvrtc, linked by sm90_push_fp8_moe_gemm_x)"), lacks
    assert "nvidia-cuda-nvrtc wheel" in lacks[0] and f"{tree}/lib64/stubs" in lacks[0], lacks


def test_the_check_names_each_header_and_a_stub_that_defines_nothing(tmp_path):
    tree = _tree(tmp_path / "cuda", ("cuda_runtime.h", "nvrtc.h"), ("libcudart.so", "libnvrtc.so"))
    compile_so(tree / "lib64" / "stubs", "libcuda.so", "", soname="libcuda.so.1")
    lacks = toolkit_check.missing(tree, toolkit_check.links({"m": NINJA}))
    assert lacks[:2] == [
        f"{tree}/include/cublasLt.h: from the nvidia-cublas wheel's include folder",
        f"{tree}/include/curand_kernel.h: from the nvidia-curand wheel's include folder",
    ], lacks
    assert len(lacks) == 3 and "libcuda.so defines no driver symbol (cuGetErrorString)" in lacks[2], lacks


def test_a_library_found_after_the_toolkit_folders_counts(tmp_path):
    tree = _complete(tmp_path / "cuda")
    (tree / "lib64" / "libnvrtc.so").unlink()
    system = tmp_path / "system"
    system.mkdir()
    (system / "libnvrtc.a").write_text("")
    assert toolkit_check.missing(tree, toolkit_check.links({"m": NINJA}), [system]) == []


def _snapshot(root: Path, leave_out: tuple[Path, ...]) -> dict[str, str | bytes]:
    """Every path under ``root`` outside ``leave_out``: a link's target, else a file's bytes (a folder: "")."""
    return {
        str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else ""
        for p in root.rglob("*")
        if not any(p.is_relative_to(f) for f in leave_out)
    }


@pytest.mark.parametrize("shape", ["cudart", "bare", "empty-stub"])
def test_assembly_merges_the_wheels_into_a_tree_of_its_own(tmp_path, shape):
    """nvcc's tree with its own cudart, with no lib64 at all, and with a stub that defines nothing (which must be
    replaced in the assembled tree, not in nvcc's): nothing of nvcc's tree or the wheels is written to."""
    nvcc_tree = _tree(tmp_path / "nvcc", libraries=("libcudart.so", "libcudart.so.13"), cuda_h=False)
    if shape == "bare":
        shutil.rmtree(nvcc_tree / "lib64")
    elif shape == "empty-stub":
        compile_so(nvcc_tree / "lib64" / "stubs", "libcuda.so", "", soname="libcuda.so.1")
    folder = _wheels(tmp_path / "tk")
    made = (folder / "cuda", folder / "overlay")
    before = _snapshot(tmp_path, made)
    cuda = toolkit_assembly.assemble(nvcc_tree / "bin" / "nvcc", folder, CC)
    assert cuda == folder / "cuda" and (cuda / "bin" / "nvcc").resolve() == nvcc_tree / "bin" / "nvcc"
    cudart = (cuda / "lib64" / "libcudart.so.13").resolve()  # in both but the bare tree: nvcc's tree first
    expected = folder / "wheels/nvidia/cu13/lib" if shape == "bare" else nvcc_tree / "lib64"
    assert cudart == (expected / "libcudart.so.13").resolve(), cudart
    assert os.readlink(cuda / "lib64" / "libnvrtc.so") == "libnvrtc.so.13", "the unversioned name -lnvrtc finds"
    assert driver_stub.exports_driver(cuda / "lib64" / "stubs" / "libcuda.so")
    assert toolkit_check.missing(cuda, toolkit_check.links({"m": NINJA})) == []
    assert _snapshot(tmp_path, made) == before, "nothing written into nvcc's tree or the wheels"
    assert toolkit_assembly.assemble(nvcc_tree / "bin" / "nvcc", folder, CC) == cuda  # again: rebuilt in place


def test_the_wheels_are_installed_once_and_a_pip_failure_is_one_line(tmp_path):
    folder = _wheels(tmp_path / "tk")
    toolkit_assembly.install_wheels(folder / "wheels", toolkit_assembly.PINS[13], python="/nonexistent/python")
    pip = tmp_path / "python"
    pip.write_text("#!/bin/sh\necho 'ERROR: No matching distribution found for nvidia-cublas==0' >&2\nexit 1\n")
    pip.chmod(0o755)
    with pytest.raises(toolkit_assembly.AssemblyError) as err:
        toolkit_assembly.install_wheels(folder / "wheels", ("nvidia-cublas==0",), python=str(pip))
    assert str(err.value) == (
        f"pip could not install nvidia-cublas==0 into {folder / 'wheels'}: "
        "ERROR: No matching distribution found for nvidia-cublas==0"
    ), err.value


def test_assembly_refuses_an_nvcc_of_another_cuda_major(tmp_path):
    nvcc_tree = _tree(tmp_path / "nvcc")
    (nvcc_tree / "bin" / "nvcc").write_text(FAKE_NVCC.replace("release 13.0", "release 12.8"))
    with pytest.raises(toolkit_assembly.AssemblyError, match="is CUDA 12.8: a toolkit can be assembled for CUDA 13 "):
        toolkit_assembly.assemble(nvcc_tree / "bin" / "nvcc", tmp_path / "tk", CC)


def _builder(tmp_path: Path, cuda_home: Path, toolkit: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_HOME=str(cuda_home), PYTHONPATH=str(ROOT), CXX="false", MAX_JOBS="1")
    env["FLASHINFER_WORKSPACE_BASE"] = str(tmp_path / "ws")
    argv = [sys.executable, "-m", "tools.build_jit_modules", "--out", str(tmp_path / "x.tgz")]
    argv += ["--toolkit", str(toolkit)]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_builder_assembles_from_a_bare_nvcc_and_checks_what_the_modules_link(tmp_path):
    """The whole command, on FlashInfer's own ninja files for the installed version: a CUDA_HOME of nvcc's tree
    alone is named incomplete, a toolkit is assembled from it and the (fake, already installed) wheels, and a
    missing libnvrtc.so.13 in them stops it before anything compiles; with it, the build starts."""
    bare = _tree(tmp_path / "nvcc", libraries=("libcudart.so",))
    folder = _wheels(tmp_path / "tk", nvrtc=False)
    done = _builder(tmp_path, bare, folder)
    assert done.returncode == cli.INCOMPLETE and not (tmp_path / "x.tgz").exists(), done.stdout + done.stderr
    assert f"CUDA_HOME={bare} lacks:" in done.stdout and f"{bare}/include/nvrtc.h: from" in done.stdout, done.stdout
    said = done.stdout.split(f"the assembled toolkit {folder / 'cuda'} lacks:")[-1].strip().splitlines()
    assert len(said) == 1 and said[0].startswith("libnvrtc.so (-lnvrtc, linked by sm90_push_fp8_moe_gemm_"), said
    (folder / "wheels" / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13").write_text("")
    done = _builder(tmp_path, bare, folder)
    assert f"toolkit {folder / 'cuda'}; building {MODULES} modules" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 1 and "FAILED" in done.stdout and "lacks:\n" in done.stdout, done.stdout[-2000:]


def test_a_complete_cuda_home_wins(tmp_path):
    tree = _complete(tmp_path / "cuda")
    done = _builder(tmp_path, tree, tmp_path / "tk")
    assert f"toolkit {tree}; building {MODULES} modules" in done.stdout, done.stdout + done.stderr
    assert "assembling" not in done.stdout and not (tmp_path / "tk").exists(), done.stdout


# ---------------------------------------------------------------- AOT modules' linkage (ci/aot_linkage.py, tools/driver_stub.py)
@pytest.fixture
def stubs(tmp_path):
    """An empty stub (soname only, as this project's CPU machine had) and one tools.driver_stub writes from a cuda.h."""
    empty = compile_so(tmp_path / "empty", "libcuda.so", "", soname="libcuda.so.1")
    cuda = _tree(tmp_path / "cuda", nvcc=False)  # cuda.h alone
    made = cuda / "lib64" / "stubs" / "libcuda.so"
    assert driver_stub.write(cuda, made, CC) == 4  # the three declared, and cuCtxCreate's macro spelling
    return empty, made


def _loads_with_rtld_now(module: Path, library_path: Path) -> subprocess.CompletedProcess:
    code = f"import ctypes, os; ctypes.CDLL({str(module)!r}, mode=os.RTLD_NOW)"
    env = {**os.environ, "LD_LIBRARY_PATH": str(library_path)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


def test_the_written_stub_defines_every_spelling_and_carries_the_soname(stubs):
    empty, made = stubs
    defined = set(aot_linkage.dynamic_symbols(made, defined=True))
    assert {"cuGetErrorString", "cuLibraryLoadData", "cuCtxCreate", "cuCtxCreate_v4"} <= defined, defined
    assert driver_stub.exports_driver(made) and not driver_stub.exports_driver(empty)


@pytest.mark.parametrize("stub, fit", [(0, False), (1, True)], ids=["empty-stub", "written-stub"])
def test_a_module_is_fit_if_its_stub_defines_the_driver_and_the_loader_agrees(stubs, tmp_path, stub, fit):
    """Linked against the empty stub: unfit, libcuda.so.1 not NEEDED, and the loader, with a libcuda.so.1 that does
    define the symbol on its path, still cannot resolve it (on the GPU host the process has the driver open, not
    global: the same effect). Linked against the written stub: fit, NEEDED, it loads."""
    linked = stubs[stub]
    module = compile_so(tmp_path / "mod", "mod.so", DRIVER_CALLER, f"-L{linked.parent}", "-lcuda")
    why = aot_linkage.unfit(module)
    assert (why is None) == fit and ("libcuda.so.1" in aot_linkage.needed(module)) == fit, why
    assert fit or ("cuLibraryLoadData" in why and "libcuda.so.1" in why), why
    (linked.parent / "libcuda.so.1").symlink_to(stubs[1])
    done = _loads_with_rtld_now(module, linked.parent)
    assert (done.returncode == 0) == fit and (fit or "undefined symbol: cuLibraryLoadData" in done.stderr), done.stderr


def test_a_module_without_driver_calls_is_fit_and_a_non_elf_file_is_not(tmp_path):
    assert aot_linkage.unfit(compile_so(tmp_path, "plain.so", NO_DRIVER)) is None
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF stand-in")
    assert "not an ELF shared object" in (aot_linkage.unfit(junk) or "")


def test_without_readelf_every_module_is_unfit(tmp_path, monkeypatch):
    module = compile_so(tmp_path, "plain.so", NO_DRIVER)
    monkeypatch.setattr(aot_linkage.shutil, "which", lambda name: None)
    assert "readelf not found" in (aot_linkage.unfit(module) or "")


def test_the_command_names_each_unfit_module_and_exits_1(stubs, tmp_path):
    empty, made = stubs
    compile_so(tmp_path / "mods" / "bad", "bad.so", DRIVER_CALLER, f"-L{empty.parent}", "-lcuda")
    compile_so(tmp_path / "mods" / "good", "good.so", DRIVER_CALLER, f"-L{made.parent}", "-lcuda")
    argv = [sys.executable, "-m", "ci.aot_linkage", "--names", str(tmp_path / "mods")]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout.split() == [str(tmp_path / "mods" / "bad" / "bad.so")], done.stdout


def test_the_load_check_finds_what_the_driver_rule_cannot(stubs, tmp_path):
    """--load binds every symbol at load in a process like FlashInfer's: a symbol no library here defines is an
    error there, which the readelf rule does not see; a module whose libraries are all found loads."""
    _, made = stubs
    orphan = compile_so(tmp_path / "orphan", "orphan.so", "int nowhere(void);\nint entry(void) { return nowhere(); }\n")
    driver = compile_so(tmp_path / "driver", "driver.so", DRIVER_CALLER, f"-L{made.parent}", "-lcuda")
    plain = compile_so(tmp_path / "plain", "plain.so", NO_DRIVER)
    assert aot_linkage.unfit(orphan) is None and aot_linkage.unfit(driver) is None
    found = aot_linkage.load_failures([orphan, plain])
    assert set(found) == {orphan} and "undefined symbol: nowhere" in found[orphan], found
    (made.parent / "libcuda.so.1").symlink_to(made)
    env = {**os.environ, "LD_LIBRARY_PATH": str(made.parent)}
    argv = [sys.executable, "-m", "ci.aot_linkage", "--load", "--names", str(tmp_path / "driver")]
    argv.append(str(tmp_path / "plain"))
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr  # the driver found: it loads
