"""ci.report opens with the outcome matrix (rows backends, columns EP sizes), each cell linked to its details; the
skip reasons grouped; every failed test with its reproduction. On the real H200 nightly
(reference.evidence.RAW_NIGHTLY_GREEN) the push kernels' EP2/4/8 cells were missing from every table: they must say
why they skipped."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from ci import outcomes, report, report_outcomes
from ci.report_html import to_html
from reference.evidence import RAW_NIGHTLY_GREEN

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
NIGHT = Path(__file__).resolve().parents[2] / RAW_NIGHTLY_GREEN / "night"
PUSHES = ("sm90_bf16_bf16_bf16_push_cake", "sm90_fp8_fp8_bf16_push_cuda")


@pytest.fixture(scope="module")
def text():
    return report.markdown(NIGHT, [])


def test_the_report_opens_with_the_matrix_and_the_push_cells_say_why(text):
    first = next(line for line in text.splitlines() if line.startswith("## "))
    assert first == "## Outcome per backend and EP size", first
    header = next(line for line in text.splitlines() if line.startswith("| backend |"))
    assert header == "| backend | EP1 | EP2 | EP4 | EP8 | no EP size |", header
    for push in PUSHES:
        row = next(line for line in text.splitlines() if line.startswith(f"| {push} |"))
        for ep in ("EP2", "EP4", "EP8"):
            link = f"[skipped (26): needs one GPU per rank](#{push}-{ep.lower()})"
            assert link in row, row
            assert f"### {push}, {ep}" in text  # the link's target
    page = to_html(text)  # the HTML report's links reach their cells' details too
    assert (
        '<a href="#sm90_fp8_fp8_bf16_push_cuda-ep2">skipped (26): needs one GPU per rank</a>' in page
        and '<h3 id="sm90_fp8_fp8_bf16_push_cuda-ep2">' in page
    )


def test_the_cells_hold_every_test_once():
    found = report_outcomes.tests(NIGHT)
    cells = {key: outcomes.Counter(t.outcome for t in group) for key, group in report_outcomes.cells(found).items()}
    assert cells == outcomes.matrix(NIGHT / "junit.xml.gz")  # ci.outcomes' own counts, cell by cell
    assert sum(map(len, report_outcomes.cells(found).values())) == 850


def test_skip_reasons_are_grouped_with_their_backends(text):
    groups = report_outcomes.skip_groups(report_outcomes.tests(NIGHT))
    gpu = groups["needs one GPU per rank"]
    assert gpu["count"] == 6 * 26 and dict(gpu["where"]) == {p: {"EP2", "EP4", "EP8"} for p in PUSHES}
    assert sum(g["count"] for g in groups.values()) == 313  # every skip, in one group each
    row = next(line for line in text.split("## Skip reasons", 1)[1].splitlines() if "needs one GPU" in line)
    assert row.startswith("| needs one GPU per rank | 156 | sm90_bf16_bf16_bf16_push_cake (EP2, EP4, EP8); "), row


@pytest.mark.parametrize(
    "message, impl, short",
    [
        (
            "sm90_x needs one GPU per rank: EP2 needs 2 SM90 GPUs, this machine has 1",
            "sm90_x",
            "needs one GPU per rank",
        ),
        ("sm90_x: pattern 'remote' needs EP > 1 (no token routes to it)", "sm90_x", "pattern 'remote' needs EP > 1"),
        ("op supports sm90: nothing to refuse on this GPU", "op", "supports sm90: nothing to refuse on this GPU"),
        ("", "-", "no reason given"),
    ],
)
def test_a_skip_reason_is_shortened_to_what_it_says(message, impl, short):
    assert report_outcomes.short_reason(message, impl) == short


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="suites.conformance.test_generic" name="test_matches_reference[sm90_fp8_fp8_bf16_push_cuda-EP2]">
<failure message="AssertionError: [oracle] push_cuda at EP2">def test(...):
E   AssertionError: [oracle] push_cuda at EP2: relative L2 0.5 &gt; 0.02
E     reproduce: python -m ci.repro '{"from": "junit"}'</failure></testcase>
<testcase classname="suites.conformance.test_generic" name="test_check[sm90_fp8_fp8_bf16_push_cuda-EP2-repeat]">
<failure message="AssertionError">E   AssertionError</failure></testcase>
<testcase classname="suites.conformance.test_generic" name="test_matches_reference[sm90_fp8_fp8_bf16_push_cuda-EP1]" />
</testsuite></testsuites>"""
RECORD = (
    '{"test": "suites/conformance/test_generic.py::test_check[sm90_fp8_fp8_bf16_push_cuda-EP2-repeat]", '
    '"check": "repeat", "impl": "sm90_fp8_fp8_bf16_push_cuda", "ep": 2, '
    '"message": "[repeat] push_cuda at EP2: the second call differs\\n'
    '  reproduce: python -m ci.repro \'{\\"from\\": \\"record\\"}\'"}\n'
)


def test_a_failed_test_is_listed_with_its_reproduction(tmp_path):
    (tmp_path / "junit.xml.gz").write_bytes(gzip.compress(JUNIT.encode()))
    (tmp_path / "failures-main.jsonl").write_text(RECORD)
    found = report_outcomes.tests(tmp_path)
    assert [(t.impl, t.ep) for t in found if t.outcome == "failed"] == [(PUSHES[1], "EP2")] * 2
    assert report_outcomes.cell_text(report_outcomes.cells(found)[(PUSHES[1], "EP2")]) == "**failed (2)**"
    text = report.markdown(tmp_path, [])
    failures = text.split("## Failures (2 failed tests)", 1)[1].split("\n## ", 1)[0]
    assert "relative L2 0.5 > 0.02" in failures
    assert '`reproduce: python -m ci.repro \'{"from": "junit"}\'`' in failures
    assert "the second call differs" in failures  # the record's first line, not pytest's bare AssertionError
    assert '`reproduce: python -m ci.repro \'{"from": "record"}\'`' in failures
    details = text.split(f"### {PUSHES[1]}, EP2", 1)[1]
    assert 'ci.repro \'{"from": "junit"}\'' in details and 'ci.repro \'{"from": "record"}\'' in details
