"""The restore scripts on CPU. ci/restore_jit_cache.sh, with a real ninja: a packed cache restored after its inputs were
reinstalled is not rebuilt, touching the outputs instead is, and a real change after the restore still is (a module is a
rule whose depfile names a header, as nvcc's). ci/restore_aot_modules.sh: a tarball of AOT modules lands where
FlashInfer looks for it (<name>/<name>.so), only for its FlashInfer version and only the modules that would load."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from suites.harness.shared_objects import CC, DRIVER_CALLER, NO_DRIVER, compile_so

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
NEEDS_CC = pytest.mark.skipif(CC is None, reason="no C compiler (cc/gcc) to build the stand-in modules")
ROOT = Path(__file__).resolve().parents[2]
BUILD = """rule cc
  command = cat $in $hdr > $out && echo "$out: $hdr" > $out.d
  deps = gcc
  depfile = $out.d
build {mod}/mod.o: cc {mod}/mod.cu
  hdr = {hdr}
"""


def _dry_run(mod: Path) -> str:
    return subprocess.run(["ninja", "-C", str(mod), "-n", "-d", "explain"], capture_output=True, text=True).stdout


def _set_mtime(path: Path, offset_s: float) -> None:
    t = time.time() + offset_s
    os.utime(path, (t, t))


@pytest.fixture
def packed(tmp_path):
    """A cache built once and packed, then a 'fresh host' whose wheel files were installed later."""
    if not shutil.which("ninja"):
        pytest.skip("ninja is not on PATH (it comes with flashinfer-python's dependencies)")
    site, cache = tmp_path / "site", tmp_path / "cache"
    hdr = site / "include" / "kernel.h"
    hdr.parent.mkdir(parents=True)
    hdr.write_text("// header\n")
    _set_mtime(hdr, -7200)
    mod = cache / "flashinfer" / "0.7.2.post1" / "90a" / "cached_ops" / "mod"
    mod.mkdir(parents=True)
    (mod / "mod.cu").write_text("// source\n")
    _set_mtime(mod / "mod.cu", -7200)
    (mod / "build.ninja").write_text(BUILD.format(mod=mod, hdr=hdr))
    subprocess.run(["ninja", "-C", str(mod)], check=True, capture_output=True)
    assert "no work to do" in _dry_run(mod)
    tarball = tmp_path / "fi-jit.tgz"
    subprocess.run(["tar", "czf", str(tarball), "-C", str(cache), "flashinfer"], check=True)
    shutil.rmtree(cache)
    _set_mtime(hdr, 3600)  # reinstalled after the cache was packed (and after its build)
    return tarball, cache, site, mod, hdr


def test_restored_cache_is_not_rebuilt_and_a_later_change_is(packed):
    tarball, cache, site, mod, hdr = packed
    argv = ["bash", str(ROOT / "ci/restore_jit_cache.sh"), str(tarball), str(cache), str(site)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ninja dry run mod: ninja: no work to do.", out
    _set_mtime(hdr, 7200)  # a header really changed after the restore
    assert "no work to do" not in _dry_run(mod)


def test_touching_the_outputs_instead_rebuilds(packed):
    tarball, cache, site, mod, _ = packed
    cache.mkdir()
    subprocess.run(["tar", "xzf", str(tarball), "-C", str(cache)], check=True)
    for f in mod.iterdir():
        _set_mtime(f, 5400)  # the previous fix: every restored file dated after the install
    assert "no work to do" not in _dry_run(mod)


def test_setup_restores_a_packed_cache_once_on_a_prepared_gpu_host(tmp_path):
    """ci/setup.sh, as every command runs it: on a host with ~/gpu-env.sh, the packed cache is unpacked
    into ~/.cache before the first test, and only once."""
    home, packed = tmp_path / "home", tmp_path / "packed"
    (home / "gpu-site").mkdir(parents=True)
    bundle = tmp_path / "bundle-bin"  # the bundle's python3: this environment's, which has torch and pytest
    bundle.mkdir()
    (bundle / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bundle / "python3").chmod(0o755)
    (home / "gpu-env.sh").write_text(f"export PATH={bundle}:$PATH\n")
    (packed / "flashinfer" / "0.7.2.post1" / "90a").mkdir(parents=True)
    (packed / "flashinfer" / "0.7.2.post1" / "90a" / "module.so").write_text("compiled")
    tarball = tmp_path / "fi-jit.tgz"
    subprocess.run(["tar", "czf", str(tarball), "-C", str(packed), "flashinfer"], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MOE_PYTHON", "MOE_USE_VENV")}
    env.update(HOME=str(home), MOE_JIT_CACHE=str(tarball))
    first = subprocess.run(["bash", "ci/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and first.stdout.strip() == str(ROOT / "ci" / "bundle_python.sh"), first.stderr
    assert "restoring the FlashInfer JIT cache" in first.stderr
    assert (home / ".cache" / "flashinfer" / "0.7.2.post1" / "90a" / "module.so").read_text() == "compiled"
    again = subprocess.run(["bash", "ci/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "restoring" not in again.stderr


# ---------------------------------------------------------------- ci/restore_aot_modules.sh
def _tarball(tmp_path: Path, version: str, unfit: bool = False) -> Path:
    """mod_abc (no driver calls), and with ``unfit`` mod_bad: a driver call linked against an empty libcuda stub."""
    src = tmp_path / "src" / "flashinfer-aot"
    compile_so(src / "mod_abc", "mod_abc.so", NO_DRIVER)
    if unfit:
        empty = compile_so(tmp_path / "empty-stub", "libcuda.so", "", soname="libcuda.so.1")
        compile_so(src / "mod_bad", "mod_bad.so", DRIVER_CALLER, f"-L{empty.parent}", "-lcuda")
    (src / "BUILD_INFO").write_text(f"flashinfer-python {version}\narch 9.0a\nnvcc V13.0.88\n")
    out = tmp_path / "fi-aot.tgz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname="flashinfer-aot")
    return out


def _restore(tarball: Path, aot: Path, installed: str, **env) -> str:
    argv = ["bash", str(ROOT / "ci" / "restore_aot_modules.sh"), str(tarball), str(aot), installed]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


CALLS = "calls the CUDA driver (cuLibraryLoadData)"


@NEEDS_CC
@pytest.mark.parametrize(
    "built_for, unfit, no_python3, said",
    [
        ("0.7.4", False, False, ["installed 1 of 1 FlashInfer AOT modules"]),
        # a module calling the driver without libcuda.so.1 among its NEEDED libraries (the H200's crash,
        # reference.evidence.AOT_CRASH_AND_CUT_SHORT) is left out by name and symbol, for FlashInfer to compile
        ("0.7.4", True, False, [f"not installed: mod_bad.so {CALLS}", "installed 1 of 2 FlashInfer AOT modules"]),
        # a check that did not run (no working python3 here) is no pass: nothing is installed unchecked
        ("0.7.4", False, True, ["exited 3 and named none: no AOT module installed"]),
        ("0.7.2.post1", False, False, ["are for flashinfer-python 0.7.2.post1, this host has 0.7.4"]),
    ],
    ids=["fit", "unfit-module-left-out", "check-cannot-run", "another-version"],
)
def test_the_checked_modules_of_this_version_land_where_flashinfer_looks(tmp_path, built_for, unfit, no_python3, said):
    aot, fake = tmp_path / "site" / "flashinfer" / "data" / "aot", tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    path = f"{fake.parent}:{os.environ['PATH']}" if no_python3 else os.environ["PATH"]
    out = _restore(_tarball(tmp_path, built_for, unfit), aot, "0.7.4", PATH=path)
    assert all(s in out for s in said), out
    if built_for != "0.7.4" or no_python3:
        assert not aot.exists(), out
    else:
        built = tmp_path / "src/flashinfer-aot/mod_abc/mod_abc.so"
        assert (aot / "mod_abc" / "mod_abc.so").read_bytes() == built.read_bytes(), out
        assert not (aot / "BUILD_INFO").exists() and not (aot / "mod_bad").exists(), out
