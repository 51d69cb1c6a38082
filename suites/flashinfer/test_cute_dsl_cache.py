"""fixtures/backends/flashinfer/cute_dsl_cache.py: ``cute.compile`` through CuTe DSL's own cache. On the CPU, with a host-only
CuTe DSL function: a second compile of the same traced function is the same compiled module, another constant or
another body compiles, and a second process reads the module from the folder. On an SM90 GPU: a pull kernel read
from memory and from the folder gives a fresh compile's output, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fixtures import arch, settings
from fixtures.core import results
from fixtures.backends.flashinfer import behaviour, cute_dsl_cache
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.backends.flashinfer.prerequisites import missing_jit_modules

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("cutlass.cute", reason="nvidia-cutlass-dsl is not installed (it comes with flashinfer-python)")

# A host-only CuTe DSL program: compiles ``add`` for the constants given, calls each, prints the counts.
_PROGRAM = """
import json, sys
from fixtures.backends.flashinfer import cute_dsl_cache
print(cute_dsl_cache.install(), flush=True)
import cutlass, cutlass.cute as cute

@cute.jit
def add(a: cutlass.Int32, b: cutlass.Int32, c: cutlass.Constexpr):
    cute.printf("sum {}", a + b + c + OFFSET)

objs, same = [], []  # same: whether each compile returned a module an earlier one had
for c in json.loads(sys.argv[1]):
    if c == "off":
        with cute_dsl_cache.disabled():
            f = cute.compile(add, 1, 2, 1)
    else:
        f = cute.compile(add, 1, 2, c)
    same.append(any(f is g for g in objs))
    objs.append(f)
    f(3, 4)
print("COUNTS " + json.dumps({**cute_dsl_cache.COUNTS, "same": same}), flush=True)
"""


# The lock test's first rank: its first real compile, after it has missed the folder, touches COMPILING and then
# waits (at most 30 s) for the second process to say it is waiting for the lock.
_SLOW_FIRST_COMPILE = """
import os, time
from cutlass.base_dsl.compile_backend import CompilerBackend
_miss = CompilerBackend._record_cache_miss
def _slow_miss(self, ctx):
    open(os.environ["COMPILING"], "w").close()
    deadline = time.monotonic() + 30
    while not os.path.exists(os.environ["WAITING"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _miss(self, ctx)
CompilerBackend._record_cache_miss = _slow_miss
"""
# The second: touches WAITING when it starts to wait for another process's compile.
_SAYS_IT_WAITS = """
import os
class _Counts(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == "waited":
            open(os.environ["WAITING"], "w").close()
cute_dsl_cache.COUNTS = _Counts(cute_dsl_cache.COUNTS)
"""


def _start(
    folder: Path, constants: list, offset: int = 0, cache: str = "1", signals: Path | None = None, first: bool = False
):
    """Starts the program (from a file: CuTe DSL reads a function's source) with the cache folder ``folder``; with
    ``signals`` (a folder), as the lock test's first (``first``) or second process."""
    program = folder.parent / f"cute_program_{offset}{'_first' if first else '_second' if signals else ''}.py"
    hook = (_SLOW_FIRST_COMPILE if first else _SAYS_IT_WAITS) if signals else ""
    text = _PROGRAM.replace("import cutlass, cutlass.cute as cute\n", "import cutlass, cutlass.cute as cute\n" + hook)
    program.write_text(f"OFFSET = {offset}\n" + text)
    env = {
        **os.environ,
        "CUTE_DSL_CACHE_DIR": str(folder),
        settings.CUTE_DSL_CACHE.name: cache,
        "PYTHONPATH": str(ROOT),
        "COMPILING": str(signals / "compiling" if signals else ""),
        "WAITING": str(signals / "waiting" if signals else ""),
    }
    return subprocess.Popen(
        [sys.executable, str(program), json.dumps(constants)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(started) -> tuple[dict, list[str]]:
    out, err = started.communicate(timeout=240)
    assert started.returncode == 0, err[-3000:]
    lines = out.splitlines()
    counts = json.loads(next(line for line in lines if line.startswith("COUNTS "))[7:])
    return counts, [line for line in lines if line.startswith("sum ")]


def _run(folder: Path, constants: list, offset: int = 0, cache: str = "1") -> tuple[dict, list[str]]:
    return _finish(_start(folder, constants, offset, cache))


def test_one_compile_per_traced_function_and_a_second_process_reads_the_folder(tmp_path):
    tmp_path = tmp_path / "cache"
    counts, sums = _run(tmp_path, ["off", 1, 1, 2])
    assert sums == ["sum 8", "sum 8", "sum 8", "sum 9"]
    # the disabled compile and the first of each constant compile; the repeat is the same module
    assert counts["requests"] == 4 and counts["compiled"] == 3 and counts["from_file"] == 0, counts
    assert counts["same"] == [False, False, True, False], counts
    assert len(list(tmp_path.glob("*.mlir"))) == 2, sorted(p.name for p in tmp_path.iterdir())

    counts, sums = _run(tmp_path, [1, 2])  # a new process: both modules from the folder, nothing compiled
    assert sums == ["sum 8", "sum 9"] and counts["compiled"] == 0 and counts["from_file"] == 2, counts

    counts, sums = _run(tmp_path, [1, 2], offset=100)  # same name, another body: another hash, compiled anew
    assert sums == ["sum 108", "sum 109"] and counts["compiled"] == 2 and counts["from_file"] == 0, counts


def test_two_processes_compiling_one_kernel_at_once_compile_it_once(tmp_path):
    """As the ranks of a pool do: the second waits on the hash's lock while the first compiles, then reads the
    module from the folder. The first holds its compile until the second says it waits (at most 30 s): without the
    lock the second never waits, misses the still-empty folder and compiles too."""
    folder, signals = tmp_path / "cache", tmp_path
    first = _start(folder, [1], signals=signals, first=True)
    deadline = time.monotonic() + 120
    while not (signals / "compiling").exists():
        assert first.poll() is None and time.monotonic() < deadline, "the first process never began its compile"
        time.sleep(0.05)
    second_counts, second_sums = _finish(_start(folder, [1], signals=signals))
    first_counts, first_sums = _finish(first)
    assert first_sums == second_sums == ["sum 8"]
    assert first_counts["compiled"] == 1 and first_counts["waited"] == 0, first_counts
    assert second_counts["compiled"] == 0 and second_counts["from_file"] == 1, second_counts
    assert second_counts["waited"] == 1 and second_counts["lock_timeouts"] == 0, second_counts


def test_a_lock_held_too_long_or_a_folder_without_locks_compiles_without_one(tmp_path, monkeypatch, capsys):
    """The wait is bounded (a third of MOE_JIT_TIMEOUT) and names the holder; a folder that takes no lock
    (here a file where the folder should be) does not stop the compile. Each says so on stderr and in COUNTS."""
    import filelock

    monkeypatch.setenv(cute_dsl_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(settings.JIT_TIMEOUT.name, "0.3")
    held = filelock.FileLock(str(cute_dsl_cache._lock_path("abc")))
    cute_dsl_cache._lock_path("abc").parent.mkdir(parents=True)
    cute_dsl_cache._lock_path("abc").with_suffix(".holder").write_text("4242")
    before = dict(cute_dsl_cache.COUNTS)
    with held, cute_dsl_cache._only_compiler_of("abc"):
        pass
    assert cute_dsl_cache.COUNTS["lock_timeouts"] == before["lock_timeouts"] + 1
    assert "pid 4242 held its lock for 0 s; compiling without it" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cute_dsl_cache.ENV_DIR, str(tmp_path / "file"))
    with cute_dsl_cache._only_compiler_of("abc"):
        pass
    assert cute_dsl_cache.COUNTS["lock_unavailable"] == before["lock_unavailable"] + 1
    assert "compile lock unavailable" in capsys.readouterr().err


def test_off_compiles_every_time_and_the_header_says_so(tmp_path, monkeypatch):
    counts, sums = _run(tmp_path / "cache", [1, 1], cache="0")
    # not installed: two compiles, two modules, nothing in the folder
    assert sums == ["sum 8", "sum 8"] and counts["same"] == [False, False] and counts["requests"] == 0, counts
    assert not list(tmp_path.glob("cache/*.mlir"))
    monkeypatch.setenv(settings.CUTE_DSL_CACHE.name, "0")
    assert "off (MOE_CUTE_DSL_CACHE=0)" in cute_dsl_cache.describe()
    monkeypatch.setenv(settings.CUTE_DSL_CACHE.name, "1")
    monkeypatch.setenv(cute_dsl_cache.ENV_DIR, str(tmp_path))
    assert cute_dsl_cache.describe().startswith(f"CuTe DSL compile cache: on, in memory and in {tmp_path}")


def _forward(descriptor, case, inputs):
    from fixtures.backends.flashinfer.adapter import FlashInferMegaLayer
    from fixtures.core.implementation import RankContext
    from fixtures.core.problem import make_weights

    w13, w2 = make_weights(case)
    layer = FlashInferMegaLayer(descriptor, {}, RankContext(0, 1, torch.device("cuda", 0)), case, w13, w2)
    try:
        return layer.forward(*inputs).clone()
    finally:
        layer.close()


@pytest.mark.sm90
def test_a_kernel_from_the_cache_gives_a_fresh_compiles_output_bit_for_bit(tmp_path, monkeypatch):
    """The first SM90 kernel here that compiles with ``cute.compile``: fresh, then compiled into an empty folder,
    then from memory, then from the folder; the four outputs are equal bit for bit. A kernel whose traced IR
    differs from one layer to the next (its hash with it) compiles at each build; at least one must come from
    memory and from the folder, and the summary names those that do not."""
    why = arch.skip_reason("sm90")
    if why:
        pytest.skip(why)
    monkeypatch.setenv(cute_dsl_cache.ENV_DIR, str(tmp_path))
    for d in (d for d in DESCRIPTORS if d.arch == "sm90" and not missing_jit_modules(d)):
        case = behaviour.layer_case(d)
        inputs = behaviour.inputs(case, 48)
        asked = cute_dsl_cache.COUNTS["requests"]
        with cute_dsl_cache.disabled():
            fresh = _forward(d, case, inputs)
        if cute_dsl_cache.COUNTS["requests"] > asked:
            break
    else:
        pytest.skip("no SM90 kernel built here compiles with CuTe DSL's cute.compile")
    outs, deltas, again = [], [], {}
    for step in ("compiled into the folder", "from memory", "from the folder"):
        before, names = dict(cute_dsl_cache.COUNTS), dict(cute_dsl_cache.COMPILED)
        if step == "from the folder":
            with cute_dsl_cache.memory_forgotten():
                outs.append(_forward(d, case, inputs))
        else:
            outs.append(_forward(d, case, inputs))
        deltas.append({k: cute_dsl_cache.COUNTS[k] - before[k] for k in before})
        if step != "compiled into the folder":  # a kernel whose traced IR differs per layer compiles each build
            again.update({n: c - names.get(n, 0) for n, c in cute_dsl_cache.COMPILED.items() if c > names.get(n, 0)})
    line = (
        f"{d.impl_name}: CuTe DSL compiles per step {deltas}; compiled again at each build: {sorted(again) or 'none'}"
    )
    results.summary(line)
    print(line)
    hits = [x["requests"] - x["compiled"] for x in deltas]
    assert deltas[0]["compiled"] > 0 and list(tmp_path.glob("*.mlir")), f"{d.impl_name}: nothing cached {deltas}"
    assert hits[1] > 0 and deltas[1]["from_file"] == 0, f"{d.impl_name}: no kernel came from memory {deltas}"
    assert deltas[2]["from_file"] > 0, f"{d.impl_name}: no kernel came from the folder {deltas}"
    for step, out in zip(("compiled into the folder", "from memory", "from the folder"), outs):
        assert torch.equal(out, fresh), (
            f"{d.impl_name}: the kernel {step} differs from a fresh compile in "
            f"{int((out != fresh).sum())} of {out.numel()} elements"
        )
