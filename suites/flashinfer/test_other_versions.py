"""The FlashInfer API tests (registry, API pin, validators, routing-op limits and the API findings) run
against every other supported FlashInfer version too, each in its own small environment that
ci/setup.sh makes (``.venv-fi-<version>``): an upgrade must not silently drop the older version."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fixtures.backends.flashinfer.schema import ALL_VERSIONS
from fixtures.backends.flashinfer.descriptors import installed_version

pytestmark = [pytest.mark.api, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
API_TESTS = [
    "suites/flashinfer/test_registry.py",
    "suites/flashinfer/test_api_surface.py",
    "suites/flashinfer/test_routing_ops.py",
    "suites/flashinfer/test_routing_findings.py",
    "suites/flashinfer/test_jit_modules.py",
    "suites/flashinfer/test_deepgemm_cache.py",
]


@pytest.mark.parametrize("version", [v for v in ALL_VERSIONS if v != installed_version()])
def test_api_tests_pass_against_the_other_version(version):
    python = ROOT / f".venv-fi-{version}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no environment with flashinfer-python {version}: `bash ci/setup.sh` makes {python.parent.parent}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    child = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "api or cpu", *API_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = "\n".join(child.stdout.strip().splitlines()[-15:])
    assert child.returncode == 0, f"the API tests fail against flashinfer-python {version}:\n{tail}"
    assert (
        " passed" in tail
        and version
        in subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('flashinfer-python'))"],
            capture_output=True,
            text=True,
        ).stdout
    )
    print(f"flashinfer-python {version}: {tail.splitlines()[-1]}")
