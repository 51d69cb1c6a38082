"""fixtures/backends/flashinfer/deepgemm_cache.py on CPU: DeepGEMM names a cubin by its GEMM parameters alone, so the suite
gives each FlashInfer version, DeepGEMM source tree and compiler a cache folder of its own, and leaves a folder
the user chose alone."""

from __future__ import annotations

import pytest

from fixtures.backends.flashinfer import deepgemm_cache

pytestmark = [pytest.mark.api, pytest.mark.cpu]


@pytest.fixture
def sources(tmp_path):
    root = tmp_path / "deep_gemm"
    root.mkdir()
    (root / "compiler.cuh").write_text("// kernel generator\n")
    return root


def test_another_version_source_or_compiler_gets_another_folder(sources):
    base = deepgemm_cache.key("0.7.4", sources, "Cuda compilation tools, release 13.0, V13.0.88")
    assert base == deepgemm_cache.key("0.7.4", sources, "Cuda compilation tools, release 13.0, V13.0.88")
    assert base != deepgemm_cache.key("0.7.2.post1", sources, "Cuda compilation tools, release 13.0, V13.0.88")
    assert base != deepgemm_cache.key("0.7.4", sources, "Cuda compilation tools, release 13.1, V13.1.20")
    (sources / "compiler.cuh").write_text("// kernel generator, patched\n")
    assert base != deepgemm_cache.key("0.7.4", sources, "Cuda compilation tools, release 13.0, V13.0.88")


def test_the_installed_flashinfer_gets_a_folder_of_its_version(monkeypatch):
    from fixtures.backends.flashinfer.descriptors import installed_version

    monkeypatch.delenv(deepgemm_cache.ENV, raising=False)
    chosen = deepgemm_cache.isolate()
    assert f"/moe-conformance/deepgemm/{installed_version()}-" in chosen, chosen


def test_a_folder_the_user_set_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv(deepgemm_cache.ENV, str(tmp_path / "mine"))
    assert deepgemm_cache.isolate() == str(tmp_path / "mine")


def test_deepgemm_still_names_its_cubins_without_a_hash():
    """The reason for the folders: if FlashInfer starts hashing the kernel source into the cubin's name, this
    fails and the isolation can go."""
    import flashinfer
    from pathlib import Path

    compiler = Path(flashinfer.__file__).parent / "data/csrc/nv_internal/tensorrt_llm/deep_gemm/compiler.cuh"
    text = compiler.read_text()
    assert "no MD5 calculation" in text and 'std::string(swapAB ? "gemm_swapAB_" : "gemm_")' in text
