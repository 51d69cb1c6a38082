"""The committed raw folders keep their records gzipped (evidence/raw): the readers take .gz and plain files alike,
so ``ci.compare_runs`` and ``ci.report`` work on a committed folder as it is."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from fixtures.core import results
from reference.evidence import RAW_NIGHTLY_GREEN

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
NIGHT = Path(__file__).resolve().parents[2] / RAW_NIGHTLY_GREEN / "night"


def _plain_copy(tmp_path: Path) -> Path:
    for f in NIGHT.glob("*.gz"):
        with gzip.open(f, "rb") as src, open(tmp_path / f.name[:-3], "wb") as dst:
            shutil.copyfileobj(src, dst)
    return tmp_path


def test_gzipped_and_plain_records_read_the_same(tmp_path):
    plain = _plain_copy(tmp_path)
    zipped = list(results.case_records(NIGHT))
    assert zipped and zipped == list(results.case_records(plain))
    for kind in ("failures", "findings"):
        assert results.records(NIGHT, kind) == results.records(plain, kind) != []
    outcomes = results.junit_outcomes(NIGHT)
    assert outcomes and outcomes == results.junit_outcomes(plain)
