"""ci/restore_aot_modules.sh on CPU: a tarball of AOT modules (as tools.build_jit_modules packs it) lands in the
AOT folder as FlashInfer looks for it (<name>/<name>.so), and only for the FlashInfer version it was built for."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from suites.harness.shared_objects import CC, DRIVER_CALLER, NO_DRIVER, compile_so

pytestmark = [
    pytest.mark.harness,
    pytest.mark.cpu,
    pytest.mark.skipif(CC is None, reason="no C compiler (cc/gcc) to build the stand-in modules"),
]
ROOT = Path(__file__).resolve().parents[2]


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


def _restore(tarball: Path, aot: Path, installed: str) -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "ci" / "restore_aot_modules.sh"), str(tarball), str(aot), installed],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_modules_land_where_flashinfer_looks(tmp_path):
    aot = tmp_path / "site" / "flashinfer" / "data" / "aot"
    said = _restore(_tarball(tmp_path, "0.7.4"), aot, "0.7.4")
    assert (aot / "mod_abc" / "mod_abc.so").read_bytes() == (
        tmp_path / "src/flashinfer-aot/mod_abc/mod_abc.so"
    ).read_bytes()
    assert not (aot / "BUILD_INFO").exists() and "installed 1 of 1 FlashInfer AOT modules" in said, said


def test_a_module_that_would_end_the_run_is_not_installed(tmp_path):
    """The H200's crash (reference.evidence.AOT_CRASH_AND_CUT_SHORT): a module calling the driver
    without libcuda.so.1 among its NEEDED libraries. It is left out, by name and with the symbol, so FlashInfer
    compiles it; the others are installed."""
    aot = tmp_path / "aot"
    said = _restore(_tarball(tmp_path, "0.7.4", unfit=True), aot, "0.7.4")
    assert (aot / "mod_abc" / "mod_abc.so").exists() and not (aot / "mod_bad").exists(), said
    assert "not installed: mod_bad.so calls the CUDA driver (cuLibraryLoadData)" in said, said
    assert "installed 1 of 2 FlashInfer AOT modules" in said, said


def test_no_module_is_installed_when_the_check_cannot_run(tmp_path):
    """A check that did not run (no working python3 here) is no pass: nothing is installed unchecked."""
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\nexit 3\n")
    (fake / "python3").chmod(0o755)
    aot = tmp_path / "aot"
    done = subprocess.run(
        ["bash", str(ROOT / "ci" / "restore_aot_modules.sh"), str(_tarball(tmp_path, "0.7.4")), str(aot), "0.7.4"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
    )
    assert done.returncode == 0 and not aot.exists(), done.stdout + done.stderr
    assert "exited 3 and named none: no AOT module installed" in done.stdout, done.stdout


def test_modules_of_another_version_are_not_installed(tmp_path):
    aot = tmp_path / "aot"
    said = _restore(_tarball(tmp_path, "0.7.2.post1"), aot, "0.7.4")
    assert not aot.exists() and "are for flashinfer-python 0.7.2.post1, this host has 0.7.4" in said, said
