"""ci/aot_linkage.py and tools/driver_stub.py on modules compiled here: the rule that predicts an AOT module's "undefined
symbol: cuLibraryLoadData" (an H200 run ended so, exit 127) agrees with the loader's own (dlopen with RTLD_NOW)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import aot_linkage
from tools import driver_stub
from suites.harness.shared_objects import CC, DRIVER_CALLER, FAKE_CUDA_H, NO_DRIVER, compile_so

pytestmark = [
    pytest.mark.harness,
    pytest.mark.cpu,
    pytest.mark.skipif(CC is None, reason="no C compiler (cc/gcc) to build the stand-in modules"),
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stubs(tmp_path):
    """An empty stub (soname only, as this project's CPU machine had) and one tools.driver_stub writes from a cuda.h."""
    empty = compile_so(tmp_path / "empty", "libcuda.so", "", soname="libcuda.so.1")
    cuda = tmp_path / "cuda"
    (cuda / "include").mkdir(parents=True)
    (cuda / "include" / "cuda.h").write_text(FAKE_CUDA_H)
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


def test_a_module_linked_against_an_empty_stub_is_unfit_and_the_loader_agrees(stubs, tmp_path):
    empty, _ = stubs
    module = compile_so(tmp_path / "bad", "mod.so", DRIVER_CALLER, f"-L{empty.parent}", "-lcuda")
    why = aot_linkage.unfit(module)
    assert why and "cuLibraryLoadData" in why and "libcuda.so.1" in why, why
    assert "libcuda.so.1" not in aot_linkage.needed(module)
    # the loader, with a libcuda.so.1 that does define the symbol on its path, still cannot resolve it: the module
    # does not ask for that library (on the GPU host the process has the driver open, not global: the same effect)
    (empty.parent / "libcuda.so.1").symlink_to(stubs[1])
    done = _loads_with_rtld_now(module, empty.parent)
    assert done.returncode != 0 and "undefined symbol: cuLibraryLoadData" in done.stderr, done.stderr


def test_a_module_linked_against_the_written_stub_is_fit_and_loads(stubs, tmp_path):
    _, made = stubs
    module = compile_so(tmp_path / "good", "mod.so", DRIVER_CALLER, f"-L{made.parent}", "-lcuda")
    assert aot_linkage.unfit(module) is None and "libcuda.so.1" in aot_linkage.needed(module)
    (made.parent / "libcuda.so.1").symlink_to(made)
    done = _loads_with_rtld_now(module, made.parent)
    assert done.returncode == 0, done.stderr


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
    argv = [
        sys.executable,
        "-m",
        "ci.aot_linkage",
        "--load",
        "--names",
        str(tmp_path / "driver"),
        str(tmp_path / "plain"),
    ]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and not done.stdout, done.stdout + done.stderr  # the driver found: it loads
