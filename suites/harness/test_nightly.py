"""ci.nightly end to end on CPU (``--arch cpu``, a few drawn cases of reference-ep): one results folder with both
JUnit files, per-case records, env.json, api.json, and a report with plots; the progress lines on the console.
And its pieces: the phase commands for 1, 2 and 8 GPUs, a worker pinned to its GPU, the progress groups."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ci import nightly, time_budget
from fixtures import options, progress

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def test_a_cpu_nightly_writes_the_whole_folder(tmp_path):
    # one file to collect, at EP1 and EP8 only (the sizes asserted below), with the results folder outside the checkout
    out, env = tmp_path / "night", {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}  # not CI's
    argv = [sys.executable, *"-m ci.nightly --arch cpu --examples 2 --out".split(), str(out), "--"]
    argv += ["suites/conformance/test_generic.py", "-k", "test_matches_reference and (EP1 or EP8)"]
    done = subprocess.run(
        [*argv, "--impl", "reference-ep"], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[progress] reference-ep EP1" in done.stdout and "[progress] reference-ep EP8" in done.stdout, done.stdout
    for name in ("junit.xml", "env.json", "report.md", "report.html", "plots/rel_l2.png"):
        assert (out / name).exists(), f"{name} missing: {sorted(p.name for p in out.rglob('*'))}"
    assert list(out.glob("*/cases-*.jsonl")), "no per-case records in the run folder"
    # the time budget (ci.time_budget) at the end of the run, from real pools, builds, cases and checks: it adds up
    budget, log = time_budget.budget(out), (out / "nightly.log").read_text()
    assert "time budget of this session" in log and re.search(r"^reference-ep +8 ", log, re.M), log[-3000:]
    assert budget.startup > 0
    assert all(sum(row[p] for p in time_budget.PARTS) == pytest.approx(row["total"]) for row in budget.rows.values())
    assert all(budget.rows[("reference-ep", ep)][p] > 0 for ep in (1, 8) for p in ("pool start", "cases", "checks"))
    env = json.loads((out / "env.json").read_text())
    assert env["arch"] == "cpu" and set(env["phases"]) == {"all"} and env["commit"]
    assert " passed" in env["phases"]["all"]["last_line"], env["phases"]  # pytest's summary line, kept for the report
    text = (out / "report.md").read_text()
    assert "reference-ep | 8 |" in text and "cpu" in text  # per EP size, and where the ranks were placed


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
    assert "fixtures.options" in ep1 and str(ROOT) in env1["PYTHONPATH"]  # for a replacement worker's command line
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
    assert lines[0].startswith("[progress] sm90_x EP1: 1 failed, 1 passed") and lines[1].startswith(
        "[progress] sm90_x EP2"
    )
