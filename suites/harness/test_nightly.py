"""ci.nightly end to end on CPU (``--arch cpu``, a few drawn cases of reference-ep): one results folder with both JUnit
files, per-case records, env.json, api.json, and a report with plots; the progress lines on the console. Its pieces: the
phase commands for 1, 2 and 8 GPUs, a worker pinned to its GPU, the progress groups. And ci.report against a previous
run (``--baseline DIR``, the real H200 nightly; a copy with one planted failing test is the regression): the verdict
heads the report, its table follows the matrix; ci.nightly passes --baseline on; the report is appended to a job
summary; ``--help`` lists the exit codes (bad input: test_bad_inputs.py's table)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ci import cli, nightly, outcomes, report, time_budget
from fixtures.plugin import options, progress
from reference.evidence import RAW_NIGHTLY_GREEN

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def test_a_cpu_nightly_writes_the_whole_folder(tmp_path):
    # one file to collect, at EP1 and EP2 only (the sizes asserted below; a larger EP size adds rank starts, not
    # behaviour), with the results folder outside the checkout
    out, env = tmp_path / "night", {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}  # not CI's
    argv = [sys.executable, *"-m ci.nightly --arch cpu --examples 2 --out".split(), str(out), "--"]
    argv += ["suites/conformance/test_generic.py", "-k", "test_matches_reference and (EP1 or EP2)"]
    done = subprocess.run(
        [*argv, "--impl", "reference-ep"], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[progress] reference-ep EP1" in done.stdout and "[progress] reference-ep EP2" in done.stdout, done.stdout
    for name in ("junit.xml", "env.json", "report.md", "report.html", "plots/rel_l2.png"):
        assert (out / name).exists(), f"{name} missing: {sorted(p.name for p in out.rglob('*'))}"
    assert list(out.glob("*/cases-*.jsonl")), "no per-case records in the run folder"
    # the time budget (ci.time_budget) at the end of the run, from real pools, builds, cases and checks: it adds up
    budget, log = time_budget.budget(out), (out / "nightly.log").read_text()
    assert "time budget of this session" in log and re.search(r"^reference-ep +2 ", log, re.M), log[-3000:]
    assert budget.startup > 0
    assert all(sum(row[p] for p in time_budget.PARTS) == pytest.approx(row["total"]) for row in budget.rows.values())
    assert all(budget.rows[("reference-ep", ep)][p] > 0 for ep in (1, 2) for p in ("pool start", "cases", "checks"))
    env = json.loads((out / "env.json").read_text())
    assert env["arch"] == "cpu" and set(env["phases"]) == {"all"} and env["commit"]
    assert " passed" in env["phases"]["all"]["last_line"], env["phases"]  # pytest's summary line, kept for the report
    text = (out / "report.md").read_text()
    assert "reference-ep | 2 |" in text and "cpu" in text  # per EP size, and where the ranks were placed


def test_one_gpu_runs_every_ep_size_in_one_process(tmp_path):
    """One process at every EP size: the EP-invariance checks find EP1's output of the same problem."""
    [(name, cmd, env)] = nightly.phase_commands("sm90", [0], tmp_path, ["-x"])
    assert cmd[:2] == ["bash", str(ROOT / "ci" / "test.sh")]  # the README's test command, nothing of its own
    assert cmd[cmd.index("--ep") + 1] == "1,2,4,8" and cmd[cmd.index("-m") + 1] == "sm90"
    assert "-n" not in cmd and not env and cmd[-1] == "-x" and name == "all"


@pytest.mark.parametrize("count", [2, 8])
def test_ep1_spreads_over_one_worker_per_gpu(count, tmp_path):
    (name1, ep1, env1), (name2, rest, env2) = nightly.phase_commands("sm90", list(range(count)), tmp_path, [])
    assert ep1[ep1.index("--ep") + 1] == "1" and rest[rest.index("--ep") + 1] == "2,4,8" and not env2
    assert ep1[ep1.index("-n") + 1] == str(count) and "loadgroup" in ep1
    assert env1["MOE_PIN_WORKER_GPU"] == "1" and env1["MOE_GPU_LIST"] == ",".join(map(str, range(count)))
    assert "fixtures.plugin.options" in ep1 and str(ROOT) in env1["PYTHONPATH"]  # a replacement worker's command line
    # the second phase runs only the EP > 1 cases: the tests that take no EP size ran in the first
    assert rest[rest.index("-m") + 1] == "sm90 and ep"


def test_a_worker_sees_only_its_gpu():
    env = {"PYTEST_XDIST_WORKER": "gw5", "MOE_PIN_WORKER_GPU": "1", "MOE_GPU_LIST": "0,1,2,3"}
    assert options.pin_worker_gpu(env) == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert options.pin_worker_gpu({"PYTEST_XDIST_WORKER": "gw0", "MOE_GPU_LIST": "0,1"}) is None  # not asked to


def test_progress_groups_by_pool():
    lines = []
    p = progress.Progress(lines.append)
    for test, outcome in [("a[sm90_x-EP1]", "passed"), ("b[sm90_x-EP1-p]", "failed"), ("a[sm90_x-EP2]", "passed")]:
        p.report(f"suites/x.py::test_{test}", outcome)
    p.flush()
    assert lines[0].startswith("[progress] sm90_x EP1: 1 failed, 1 passed"), lines
    assert lines[1].startswith("[progress] sm90_x EP2"), lines


# ---------------------------------------------------------------- ci.report against a previous run (--baseline DIR)
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


def test_help_lists_the_exit_codes():
    """ci.report returns 1 through a variable, which test_bad_inputs.py's reading of main's returns does not see."""
    done = subprocess.run([sys.executable, "-m", "ci.report", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and "exit codes:" in done.stdout, done.stdout
    assert all(f"\n  {code}  " in done.stdout for code in (cli.OK, cli.VERDICT, cli.INPUT)), done.stdout
