"""The project's tools, each run as ``python -m ci.NAME``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_argv(python: str | Path) -> list[str]:
    """``python -m pytest`` with the suite's ini and rootdir named. pytest looks for its ini from its path
    arguments, so a results folder that already exists outside the checkout is taken for the root and the suite's
    options go unregistered ("unrecognized arguments: --results-dir", from ci.nightly); ci/test.sh
    names them the same way."""
    return [str(python), "-m", "pytest", "--rootdir", str(ROOT), "-c", str(ROOT / "pytest.ini")]
