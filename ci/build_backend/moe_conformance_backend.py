"""The build backend of moe-conformance (pyproject.toml's ``build-backend``): setuptools', editable installs only.

The suite runs from its checkout: gates/, configs/ and the FlashInfer API pins (fixtures/backends/flashinfer/api-*.json)
are read from there, and its top-level packages (ci, fixtures, reference, gates, tools) have names too generic to
put in a user's site-packages. So ``pip install -e CHECKOUT`` works as setuptools makes it, and a wheel or sdist
(``pip install .``, ``pip wheel .``, ``python -m build``) is refused with one line that says what to run instead.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import build_meta as _setuptools

CHECKOUT = Path(__file__).resolve().parents[2]

get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
build_editable = _setuptools.build_editable


def refusal(checkout: Path = CHECKOUT) -> str:
    return (
        f"moe-conformance installs from its checkout only: pip install -e {checkout} (or run bash "
        f"{checkout}/ci/test.sh). A wheel or sdist would leave out gates/, configs/ and the FlashInfer API pins "
        f"that the suite reads there."
    )


def _refuse(*_args, **_kwargs):
    raise SystemExit(refusal())  # the frontend shows this one line, no traceback


get_requires_for_build_wheel = prepare_metadata_for_build_wheel = build_wheel = _refuse
get_requires_for_build_sdist = build_sdist = _refuse
