"""Without --impl, `pytest -m sm90` fuzzes every Hopper backend, and a plain run what the machine has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import arch
from fixtures.flashinfer.descriptors import DESCRIPTORS, installed_version
from fixtures.selection import default_impls

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


class _Config:
    def __init__(self, markexpr: str):
        self.markexpr = markexpr

    def getoption(self, name, default=None):
        return self.markexpr if name == "markexpr" else default


def _of(tag: str) -> set[str]:
    """The moe_ep descriptors of the arch, and flashinfer.megamoe's paths for sm90 where it ships (issue 26)."""
    from fixtures.flashinfer.megamoe_paths import PATHS, VERSIONS

    megamoe = {p.name for p in PATHS} if tag == "sm90" and installed_version() in (None, *VERSIONS) else set()
    return {d.impl_name for d in DESCRIPTORS if d.arch == tag} | megamoe


@pytest.mark.parametrize("markexpr", ["sm90", "sm90 and ep", "not slow and sm90"])
def test_an_arch_marker_selects_every_backend_of_that_arch(monkeypatch, markexpr):
    monkeypatch.setattr(arch, "gpu_count", lambda tag: 0)  # a CPU machine: the -m expression alone decides
    chosen = default_impls(_Config(markexpr))
    assert chosen[0] == "reference-ep" and set(chosen[1:]) == _of("sm90")


def test_without_a_marker_the_gpus_here_decide(monkeypatch):
    monkeypatch.setattr(arch, "gpu_count", lambda tag: 0)
    assert default_impls(_Config("")) == ["reference-ep"]
    monkeypatch.setattr(arch, "gpu_count", lambda tag: 8 if tag == "sm100" else 0)  # an 8-GPU Blackwell host
    assert set(default_impls(_Config("cpu"))) == {"reference-ep"} | _of("sm100")


def test_pytest_m_sm90_collects_the_hopper_backends_and_skips_them_here_with_the_reason():
    argv = "-m pytest suites/conformance/test_generic.py -m sm90 -k test_matches_reference -p no:cacheprovider -v -rs"
    done = subprocess.run([sys.executable, *argv.split()], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = done.stdout
    for name in _of("sm90"):
        assert f"test_matches_reference[{name}-EP1]" in out, f"{name} not collected: {out[-2000:]}"
    if not arch.gpu_count("sm90"):  # every test skips: nothing was tested, exit 5 (fixtures.nothing_tested)
        assert done.returncode == 5 and "passed" not in out.splitlines()[-1], out[-2000:]
        assert "needs an SM90 GPU" in out and "moe-conformance: exit 5: -m sm90" in out, out[-2000:]
