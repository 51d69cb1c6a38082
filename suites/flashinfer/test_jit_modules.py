"""The JIT module table (fixtures/backends/flashinfer/jit_modules.py) against the installed FlashInfer, on CPU: every
generator call resolves and names a module (nothing is compiled), every kernel it lists is registered, and
FlashInfer looks for an AOT module where ci/restore_aot_modules.sh puts it. Run against every supported version
(suites/flashinfer/test_other_versions.py): an upgrade that renames a generator fails here."""

from __future__ import annotations

import pytest

from fixtures.backends.flashinfer import jit_modules
from fixtures.backends.flashinfer.descriptors import KERNEL_NAMES, installed_version
from fixtures.backends.flashinfer.megamoe_paths import PATHS

MEGAMOE = tuple(p.name for p in PATHS)  # flashinfer.megamoe's paths: a package apart from the moe_ep registry

pytestmark = [pytest.mark.api, pytest.mark.cpu]


@pytest.fixture
def hopper_target(monkeypatch):
    """FlashInfer names a module only for a target arch; on CPU there is none: 9.0a, as tools.build_jit_modules
    says, for this test only (FlashInfer keeps the arch set in a process-wide context)."""
    from flashinfer.jit import core

    saved = set(core.current_compilation_context.TARGET_CUDA_ARCHS)
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    core.current_compilation_context.TARGET_CUDA_ARCHS.clear()
    yield
    core.current_compilation_context.TARGET_CUDA_ARCHS.clear()
    core.current_compilation_context.TARGET_CUDA_ARCHS.update(saved)


def test_the_installed_version_has_a_table():
    assert jit_modules.calls(installed_version()), f"no JIT module table for flashinfer-python {installed_version()}"


@pytest.mark.parametrize(
    "kernel, call", [(k, c) for k, cs in jit_modules.calls(installed_version()).items() for c in cs]
)
def test_each_generator_call_names_a_module(kernel, call, hopper_target):
    assert kernel in KERNEL_NAMES or kernel in ("fused_topk_deepseek", *MEGAMOE), f"{kernel} is not registered"
    spec = jit_modules.spec(call)
    assert spec.name and str(spec.jit_library_path).endswith(f"{spec.name}.so"), (call, spec.name)


def test_flashinfer_looks_for_an_aot_module_where_the_restore_puts_it():
    from flashinfer.jit import env

    assert env.get_aot_path("mod_abc") == env.FLASHINFER_AOT_DIR / "mod_abc" / "mod_abc.so"
