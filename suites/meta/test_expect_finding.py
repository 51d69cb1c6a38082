"""The finding mechanism must itself be able to fail: a declared finding that no longer reproduces
fails the run, an undeclared misbehaviour fails it, a declared one still seen is an expected failure."""

from __future__ import annotations

import pytest

from fixtures.core.findings import expect_finding

pytestmark = [pytest.mark.meta, pytest.mark.cpu]


def test_declared_and_still_seen_is_an_expected_failure():
    with pytest.raises(pytest.xfail.Exception, match="FINDING F0: text .* observed: row 3 wrong"):
        expect_finding("kernel", "FINDING F0: text", "F0", ok=False, observed="row 3 wrong")


def test_declared_but_gone_fails_so_the_finding_is_retired():
    with pytest.raises(pytest.fail.Exception, match="F0 no longer reproduces"):
        expect_finding("kernel", "FINDING F0: text", "F0", ok=True, observed="all rows right")


def test_undeclared_and_seen_fails():
    with pytest.raises(AssertionError, match="kernel: row 3 wrong"):
        expect_finding("kernel", None, "F0", ok=False, observed="row 3 wrong")


def test_undeclared_and_fine_passes():
    expect_finding("kernel", None, "F0", ok=True, observed="all rows right")
