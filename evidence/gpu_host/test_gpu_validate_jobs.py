"""evidence/gpu_host/gpu_validate.sh's `parallel` phase, on CPU: job lines keep quoted words together and brackets
literal, every job gets its own log, and a failing job is reported with its exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path) -> Path:
    """A HOME for the script, which insists on a prepared GPU host; here the "host" is this interpreter."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "gpu-env.sh").write_text(f"export PATH={Path(sys.executable).parent}:$PATH\n")
    return home


def test_parallel_phase_runs_each_job_line(tmp_path, home):
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(
        "# a comment, then a blank line\n\n"
        "args|python3 -c \"import sys; print('argv', sys.argv[1:])\" 'sm90_x[blockwise]' 'two words'\n"
        "pytest-job|suites/reference/test_routing.py -k 'margin and not positive' -q\n"
        "broken|python3 -c 'raise SystemExit(7)'\n"
    )
    out = tmp_path / "out"
    env = {**os.environ, "HOME": str(home), "VAL_DIR": str(out), "PAR_JOBS": str(jobs), "PAR_TIMEOUT": "120"}
    done = subprocess.run(
        ["bash", "evidence/gpu_host/gpu_validate.sh", "parallel"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = (out / "parallel.log").read_text()
    assert "args exit 0" in summary and "pytest-job exit 0" in summary, summary
    assert "broken exit 7" in summary, summary
    assert "argv ['sm90_x[blockwise]', 'two words']" in (out / "args.log").read_text()
    assert "2 passed" in (out / "pytest-job.log").read_text()


def test_faulty_phase_flags_its_planted_regression(tmp_path, home):
    """The `faulty` phase on CPU, around reference-ep: a clean run's folder, then the phase's faulty run relabelled
    as the clean implementation; compare_runs must call it a regression (on the H200 the same phase runs against
    the nightly's folder)."""
    out, clean = tmp_path / "out", tmp_path / "clean"
    env = {
        **os.environ,
        "HOME": str(home),
        "VAL_DIR": str(out),
        "CLEAN_DIR": str(clean),
        "ARCH": "cpu",
        "FAULT_IMPL": "reference-ep",
        "MOE_HYPOTHESIS_EXAMPLES": "3",
        "MOE_USE_VENV": "1",
    }
    subprocess.run(
        [
            "bash",
            "ci/test.sh",
            "suites/conformance/test_generic.py",
            "-k",
            "test_matches_reference",
            "--impl",
            "reference-ep",
            "--ep",
            "1",
            "-p",
            "no:cacheprovider",
            "--results-dir",
            str(clean),
            "-q",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    done = subprocess.run(
        ["bash", "evidence/gpu_host/gpu_validate.sh", "faulty"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    log = (out / "faulty.log").read_text()
    assert "faulty:scale_1e-2@reference-ep, relabelled as reference-ep" in log, log
    assert "exit 1 (1 = the planted regression flagged)" in log, log[-2000:]
    compared = (out / "compare-faulty.txt").read_text()
    assert (
        "REGRESSION new failure: [systematic] reference-ep at EP1" in compared
        or "REGRESSION new failure: [oracle] reference-ep at EP1" in compared
    ), compared


def test_a_poll_waits_for_done_and_snapshots_what_a_lease_end_would_lose(tmp_path, home):
    """The eighth H200 run: the lease ended mid-run and the JIT caches compiled there were lost with the host. A
    later call's `wait snapshot` packs the log folder and the caches whatever phase is running; `done` ends the
    wait early."""
    import tarfile

    out, snap = tmp_path / "val", tmp_path / "snap"
    (out / "night").mkdir(parents=True)
    (out / "nightly.log").write_text("[progress] suites/x.py: 3 passed in 2 s\n")
    (out / "night" / "cases-main.jsonl").write_text("{}\n")
    (out / "night" / "stray.so").write_bytes(b"\x7fELF")
    (home / ".cache" / "flashinfer" / "0.7.4" / "90a" / "cached_ops" / "m").mkdir(parents=True)
    (home / ".cache" / "flashinfer" / "0.7.4" / "90a" / "cached_ops" / "m" / "m.so").write_bytes(b"so")
    env = {
        **os.environ,
        "HOME": str(home),
        "VAL_DIR": str(out),
        "SNAP_DIR": str(snap),
        "WAIT_S": "3",
        "CUTE_DSL_CACHE_DIR": str(tmp_path / "no-cute"),
    }
    done = subprocess.run(
        ["bash", "evidence/gpu_host/gpu_validate.sh", "wait", "snapshot"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "still running after 3 s" in done.stdout, done.stdout + done.stderr
    assert "[progress] suites/x.py: 3 passed in 2 s" in done.stdout, done.stdout
    with tarfile.open(snap / "val.tgz") as tar:
        names = tar.getnames()
    assert "./night/cases-main.jsonl" in names and "./nightly.log" in names and "./night/stray.so" not in names
    with tarfile.open(snap / "fi-jit.tgz") as tar:
        assert "flashinfer/0.7.4/90a/cached_ops/m/m.so" in tar.getnames()
    subprocess.run(
        ["bash", "evidence/gpu_host/gpu_validate.sh", "done"], cwd=ROOT, env=env, check=True, capture_output=True
    )
    done = subprocess.run(
        ["bash", "evidence/gpu_host/gpu_validate.sh", "wait"],
        cwd=ROOT,
        env={**env, "WAIT_S": "60"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.startswith("DONE"), done.stdout
