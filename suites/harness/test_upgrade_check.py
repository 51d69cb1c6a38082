"""ci/upgrade_check.py on CPU, between the two FlashInfer versions ci/setup.sh installs (.venv-fi-0.7.2.post1
and .venv): the API comparison of two published versions, with no GPU cases."""
from __future__ import annotations

from pathlib import Path

import pytest

from ci import upgrade_check

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def test_upgrade_check_between_two_installed_versions(capsys, tmp_path):
    old, new = ROOT / ".venv-fi-0.7.2.post1", ROOT / ".venv"
    if not (old / "bin" / "python").exists() or not (new / "bin" / "python").exists():
        pytest.skip("needs both environments of ci/setup.sh (.venv and .venv-fi-0.7.2.post1)")
    code = upgrade_check.main([str(old), str(new), "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "API: flashinfer-python 0.7.2.post1 -> 0.7.4: 87 difference(s)" in out, out[:500]
    assert "kernel added: sm90_fp8_nvfp4_bf16_pull_cutedsl" in out and "no GPU" in out
    assert code == 1  # the API changed: for review
