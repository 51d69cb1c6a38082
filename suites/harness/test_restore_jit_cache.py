"""ci/restore_jit_cache.sh on CPU with a real ninja: a packed cache restored after the inputs were
reinstalled is not rebuilt, the previous way (touching the outputs) is, and a real change after the
restore still is. Modules are mimicked by a rule whose depfile names a header, as nvcc's does."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
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
    out = subprocess.run(
        ["bash", str(ROOT / "ci/restore_jit_cache.sh"), str(tarball), str(cache), str(site)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
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
    (home / "gpu-env.sh").write_text("true\n")
    (packed / "flashinfer" / "0.7.2.post1" / "90a").mkdir(parents=True)
    (packed / "flashinfer" / "0.7.2.post1" / "90a" / "module.so").write_text("compiled")
    tarball = tmp_path / "fi-jit.tgz"
    subprocess.run(["tar", "czf", str(tarball), "-C", str(packed), "flashinfer"], check=True)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("MOE_PYTHON", "MOE_USE_VENV")},
        "HOME": str(home),
        "MOE_JIT_CACHE": str(tarball),
    }
    first = subprocess.run(["bash", "ci/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and first.stdout.strip() == "python3", first.stderr
    assert "restoring the FlashInfer JIT cache" in first.stderr
    assert (home / ".cache" / "flashinfer" / "0.7.2.post1" / "90a" / "module.so").read_text() == "compiled"
    again = subprocess.run(["bash", "ci/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "restoring" not in again.stderr
