"""ci.report against a previous run (``--baseline DIR``, the real H200 nightly; a copy with one planted failing test is
the regression): ci.compare_runs' verdict heads the report, its table follows the matrix; ci.nightly passes --baseline
on; the report is appended to a job summary; ``--help`` lists the exit codes (bad input: test_bad_inputs.py's table)."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ci import cli, nightly, outcomes, report
from reference.evidence import RAW_NIGHTLY_GREEN

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
NIGHT = ROOT / RAW_NIGHTLY_GREEN / "night"
PLANTED = "test_matches_reference[sm90_fp8_fp8_bf16_push_cuda-EP1]"


_DRAWN: dict = {}  # the case records' repr -> (the folder first drawn into, its PNGs)


@pytest.fixture(autouse=True)
def _plots_drawn_once(monkeypatch):
    """The nightly's plots (~5 s a report) drawn once, then copied: this file checks the text (test_report.py: plots)."""
    draw = report.plots

    def plots(cases: list, out: Path) -> list[Path]:
        key = repr(cases)
        if key not in _DRAWN:
            _DRAWN[key] = (out, draw(cases, out))
        first, pngs = _DRAWN[key]
        if out != first:
            shutil.copytree(first, out, dirs_exist_ok=True)
        return [out / png.relative_to(first) for png in pngs]

    monkeypatch.setattr(report, "plots", plots)


def _head(md: Path) -> list[str]:
    """The lines before the matrix."""
    return md.read_text().split("## Outcome per backend and EP size", 1)[0].splitlines()


@pytest.fixture(scope="module")
def regressed(tmp_path_factory) -> Path:
    """The nightly with one of its passing tests failed (its records kept, its report left out)."""
    out = tmp_path_factory.mktemp("regressed")
    for f in NIGHT.iterdir():
        if f.is_file() and not f.name.startswith("report"):
            shutil.copy(f, out / f.name)
    root = outcomes.read(NIGHT / "junit.xml.gz")
    case = next(c for c in root.iter("testcase") if c.get("name") == PLANTED)
    ET.SubElement(case, "failure", message="planted")
    with gzip.open(out / "junit.xml.gz", "wb") as f:
        ET.ElementTree(root).write(f)
    return out


def test_the_verdict_heads_the_report(tmp_path, regressed, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert report.main([str(NIGHT), "--baseline", str(NIGHT), "--out", str(tmp_path / "same")]) == 0
    assert any("verdict no regression" in line for line in _head(tmp_path / "same" / "report.md"))
    assert report.main([str(regressed), "--baseline", str(NIGHT)]) == 1
    head = [line for line in _head(regressed / "report.md") if line.strip()]
    assert head[1].startswith(f"**Against the baseline `{NIGHT}` (ci.compare_runs): verdict REGRESSION**"), head
    text = (regressed / "report.md").read_text()
    changed = text.split("## What changed since the baseline", 1)[1].split("\n## ", 1)[0]
    assert f"- **REGRESSION new failing test**: suites/conformance/test_generic.py::{PLANTED}" in changed
    assert "| implementation | EP | checks | rel-L2 median |" in changed  # compare_runs' side-by-side table
    assert text.index("## Outcome per backend") < text.index("## What changed since the baseline")


def test_a_missing_baseline_is_incomparable_and_the_report_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert report.main([str(NIGHT), "--baseline", str(tmp_path / "gone"), "--out", str(tmp_path / "o")]) == cli.INPUT
    head = " ".join(_head(tmp_path / "o" / "report.md"))
    assert "verdict incomparable**: incomparable: the baseline folder" in head and "does not exist" in head, head


def test_the_report_is_appended_to_the_job_summary(tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    summary.write_text("an earlier step's summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert report.main([str(NIGHT), "--out", str(tmp_path / "o")]) == 0
    text = summary.read_text()
    assert text.startswith("an earlier step's summary\n# moe-conformance report: night\n")
    assert "[skipped (26): needs one GPU per rank](#sm90_fp8_fp8_bf16_push_cuda-ep2)" in text
    assert "![" not in text and "plots: `plots/` and `report.html` in the job's artifact" in text  # no broken images


def test_the_nightly_passes_its_baseline_on_and_writes_the_summary(tmp_path, regressed):
    out = tmp_path / "night"
    shutil.copytree(regressed, out)
    summary = tmp_path / "summary.md"
    nightly.write_report(out, NIGHT, environ={"GITHUB_STEP_SUMMARY": str(summary)})
    assert any("verdict REGRESSION" in line for line in _head(out / "report.md"))
    assert summary.read_text().startswith("# moe-conformance report: night\n")


def test_the_nightly_refuses_a_baseline_that_is_no_folder_before_running_anything(tmp_path, capsys, monkeypatch):
    def ran(*args, **kw):
        raise AssertionError(f"ran {args[0]} before refusing the baseline")

    monkeypatch.setattr(nightly.subprocess, "run", ran)
    with pytest.raises(SystemExit) as stop:
        nightly.main(["--arch", "cpu", "--baseline", str(tmp_path / "gone")])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == cli.INPUT and len(err.splitlines()) == 1 and "--baseline" in err, err


def _run(*args) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "ci.report", *map(str, args)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_help_lists_the_exit_codes():
    done = _run("--help")
    assert done.returncode == 0 and "exit codes:" in done.stdout, done.stdout
    for code in (cli.OK, cli.VERDICT, cli.INPUT):
        assert f"\n  {code}  " in done.stdout, done.stdout
