"""ci/upgrade_check.py on CPU, between the two FlashInfer versions ci/setup.sh installs (.venv-fi-0.7.2.post1
and .venv): the API comparison of two published versions, with no GPU cases."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ci import upgrade_check

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def _both():
    old, new = ROOT / ".venv-fi-0.7.2.post1", ROOT / ".venv"
    if not (old / "bin" / "python").exists() or not (new / "bin" / "python").exists():
        pytest.skip("needs both environments of ci/setup.sh (.venv and .venv-fi-0.7.2.post1)")
    return old, new


def test_upgrade_check_between_two_installed_versions(capsys, tmp_path):
    old, new = _both()
    code = upgrade_check.main([str(old), str(new), "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    # 87 in moe_ep, and flashinfer.megamoe's 26 (exports, signatures, plan fields, its constant), new in 0.7.4
    assert "API: flashinfer-python 0.7.2.post1 -> 0.7.4: 113 difference(s)" in out, out[:500]
    assert "kernel added: sm90_fp8_nvfp4_bf16_pull_cutedsl" in out and "no GPU" in out
    assert "megamoe export added: mxfp4_mega_moe" in out
    assert code == 1  # the API changed: for review


def test_a_site_folder_side_runs_its_flashinfer_in_front(tmp_path):
    """The GPU bundle's overlays are `pip --target` folders (~/gpu-site-fi072): such a folder is a side of its own,
    run by this python with the folder first on the import path."""
    old, _ = _both()
    site = next((old / "lib").glob("python3*/site-packages"))
    side = upgrade_check.environment(str(site), tmp_path)
    assert side.site == str(site) and side.env()["PYTHONPATH"].split(":")[0] == str(site)
    assert upgrade_check.snapshot(side)["flashinfer_version"] == "0.7.2.post1"


def test_the_sides_share_no_deepgemm_cubin_folder(tmp_path, monkeypatch):
    """A TRTLLM_DG_CACHE_DIR of the caller's would give both versions one cubin folder whose names carry no
    version (fixtures/flashinfer/deepgemm_cache.py): each side's environment drops it."""
    monkeypatch.setenv("TRTLLM_DG_CACHE_DIR", str(tmp_path / "shared"))
    side = upgrade_check.Side(Path(sys.executable), str(tmp_path))
    assert "TRTLLM_DG_CACHE_DIR" not in side.env() and side.env()["MOE_HYPOTHESIS_PROFILE"] == "ci"


def test_the_cases_run_on_the_specs_both_versions_register(tmp_path, monkeypatch):
    old, new = _both()
    sides = [upgrade_check.environment(str(v), tmp_path) for v in (old, new)]
    specs = upgrade_check.common_specs(sides, "sm90")
    assert len(specs) == 4 and not any("fp4" in s or "bf16_bf16_bf16_pull" in s for s in specs), specs
    seen = {}

    class Done:
        returncode = 0

    monkeypatch.setattr(upgrade_check.subprocess, "run", lambda argv, **kw: seen.update(argv=argv) or Done())
    stale = tmp_path / "r" / "cases-main.jsonl"  # an earlier check's records must not join this one's
    stale.parent.mkdir()
    stale.write_text("{}\n")
    upgrade_check.run_cases(sides[0], "sm90", specs, tmp_path / "r", ["suites/conformance", "-k", "matches"])
    assert not stale.exists()
    argv = seen["argv"]
    assert argv[argv.index("--impl") + 1] == ",".join(specs) and argv[-3:] == ["suites/conformance", "-k", "matches"]
    assert "--junitxml" in argv and argv[argv.index("-m", 3) + 1] == "sm90"
