"""ci.report on committed H200 records (reference.evidence): it names the outcome, backends, findings and failures with
their reproductions (and a failure's reproduction line runs as printed, with a bare PATH), opens with the outcome matrix
(each cell linked to its details, skip reasons grouped), draws its plots, and tabulates the latency benchmark (whose
torch baseline runs here on CPU; tools.bench_latency takes the peaks of the GPU model it runs on, and says why none).
The tools that read the per-case records: tools/bench_cases.py (end to end on the CPU) and tools/summarise_cases.py."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ci import outcomes, report, report_outcomes
from ci.report_html import to_html
from fixtures.core.checks import ConformanceFailure, check_oracle
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.results import CaseRecord
from fixtures.core.runner import Subject
from reference.evidence import RAW_FLASHINFER_074_CALIBRATION, RAW_NIGHTLY_GREEN
from tools import bench_cases, bench_latency
from tools.summarise_cases import main, summarise

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / RAW_FLASHINFER_074_CALIBRATION
NIGHT = ROOT / RAW_NIGHTLY_GREEN / "night"
PUSHES = ("sm90_bf16_bf16_bf16_push_cake", "sm90_fp8_fp8_bf16_push_cuda")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("h200")
    for name, target in (("cases.jsonl.gz", "cases-main.jsonl"), ("failures.jsonl.gz", "failures-main.jsonl")):
        (out / target).write_bytes(gzip.decompress((RAW / name).read_bytes()))
    (out / "junit-ep1.xml").write_bytes(gzip.decompress((RAW / "junit.xml.gz").read_bytes()))
    shutil.copy(RAW / "findings.jsonl", out / "findings-main.jsonl")
    (out / "env.json").write_text(json.dumps({"flashinfer-python": "0.7.4", "gpus": ["NVIDIA H200"]}))
    report.write(out)
    return out


def test_the_report_says_what_ran_and_what_failed(folder):
    text = (folder / "report.md").read_text()
    assert "33 failed" in text and "NVIDIA H200" in text
    assert "| sm90_fp8_fp8_bf16_pull_cutedsl[blockwise] | 8 |" in text
    assert "| F14 | sm90_bf16_bf16_bf16_pull_cutedsl | reproduced |" in text
    assert "| F12 | sm90_fp8_fp8_bf16_pull_cutedsl[per_tensor] | gone |" in text
    assert "python -m ci.repro" in text  # failures come with their reproduction


def test_a_phase_that_ran_no_test_is_a_failure_on_the_first_lines(tmp_path):
    """A nightly whose pytest refused its arguments (exit 4; on an H200 the report read only 'no JUnit file')."""
    (tmp_path / "env.json").write_text(
        json.dumps({"phases": {"all": {"exit": 4, "seconds": 1.3}, "latency": {"exit": 0, "seconds": 91.4}}})
    )
    report.write(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "**FAILED: phase all exited 4** (pytest usage error: no test ran)" in text
    assert "phase latency" not in text


def test_each_phase_is_a_row_with_its_time_and_the_job_its_total(tmp_path):
    """The first complete H200 nightly put its phases in one cell, as a Python dict."""
    everything = {"exit": 0, "seconds": 1175.3, "last_line": "= 527 passed, 313 skipped in 1168.77s ="}
    latency = {"exit": 0, "seconds": 170.0, "last_line": '{"impl": "torch"}'}
    phases = {"gpus": ["NVIDIA H200"], "phases": {"all": everything, "latency": latency}}
    (tmp_path / "env.json").write_text(json.dumps(phases))
    report.write(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "| all | 0 | 1175.3 | = 527 passed, 313 skipped in 1168.77s = |" in text, text
    assert "| latency | 0 | 170.0 |" in text and "| phases summed | | 1345.3 | |" in text
    assert "{'all'" not in text and "| phases |" not in text


def test_a_phase_the_loader_ended_quotes_its_last_output(tmp_path):
    """An AOT module's missing driver symbol ended an H200 nightly's phases (exit 127) with no summary line."""
    died = "python3: symbol lookup error: /x/sm90_push_fp8_moe_gemm.so: undefined symbol: cuLibraryLoadData"
    (tmp_path / "env.json").write_text(
        json.dumps({"phases": {"all": {"exit": 127, "seconds": 48.6, "last_line": died}}})
    )
    report.write(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert (
        "**FAILED: phase all exited 127** (a command not found, or the dynamic loader ended the process); "
        f"its last output: `{died}`"
    ) in text, text


def test_the_report_draws_each_distribution_against_its_tolerance(folder):
    for name in ("rel_l2", "row_rel_max", "band_units_max", "gain", "cases_per_minute"):
        png = folder / "plots" / f"{name}.png"
        assert png.exists() and png.read_bytes()[:4] == b"\x89PNG", name
    html = (folder / "report.html").read_text()
    assert '<img src="plots/rel_l2.png"' in html and "<table>" in html


def test_the_torch_baseline_times_on_cpu_and_lands_in_the_table(tmp_path):
    out = tmp_path / "lat.json"
    assert bench_latency.main([*"--device cpu --geometry tiny --tokens 8,64 --repeats 3 --json".split(), str(out)]) == 0
    written = json.loads(out.read_text())
    rows = written["rows"]
    assert [r["tokens"] for r in rows] == [8, 64] and all(r["median_ms"] > 0 and r["impl"] == "torch" for r in rows)
    # a CPU has no GPU peaks: no fraction of one, and the JSON says why
    assert rows[1]["tflops"] >= 0 and rows[1]["hbm_frac_peak"] is None and "cpu" in written["peaks_missing"]
    (tmp_path / "latency.json").write_text(out.read_text())
    assert "## Latency" in report.markdown(tmp_path, [])


def test_the_rows_of_finished_backends_survive_a_later_one_dying(tmp_path, monkeypatch):
    """The JSON is written after each backend (an H200 bench died in its fourth and lost the three it had timed)."""
    out, real = tmp_path / "lat.json", bench_latency.measure

    def measure(spec, *args):
        if spec != "torch":
            raise RuntimeError("stands in for the process dying")
        return real(spec, *args)

    monkeypatch.setattr(bench_latency, "measure", measure)
    with pytest.raises(RuntimeError):
        bench_latency.main(
            [*"--device cpu --geometry tiny --tokens 8 --repeats 2 --impl torch --impl next --json".split(), str(out)]
        )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["impl"], r["tokens"]) for r in rows] == [("torch", 8)], rows


def test_a_refused_row_first_keeps_every_latency_column(tmp_path):
    """A kernel that refuses a geometry gives an error row, which may come first: the table still has the timing
    columns of the rows after it, and the error in its own column."""
    rows = [
        {"impl": "k", "geometry": "g", "error": "ValueError: capacity"},
        {"impl": "torch", "geometry": "g", "tokens": 8, "median_ms": 1.5, "iqr_ms": 0.1},
    ]
    (tmp_path / "latency.json").write_text(json.dumps({"rows": rows}))
    table = report.markdown(tmp_path, []).split("## Latency", 1)[1]
    header = next(line for line in table.splitlines() if line.startswith("| impl"))
    assert "median_ms" in header and "error" in header, header
    assert "| torch | g |  | 8 | 1.5 | 0.1 |" in table, table


# ---------------------------------------------------------------- the outcome matrix (the real H200 nightly)
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
    assert '<a href="#sm90_fp8_fp8_bf16_push_cuda-ep2">skipped (26): needs one GPU per rank</a>' in page
    assert '<h3 id="sm90_fp8_fp8_bf16_push_cuda-ep2">' in page


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


def test_a_plugin_or_faulty_wrappers_tests_are_filed_under_its_full_name(tmp_path):
    """The report's matrix files a test under the implementation its run selected (``summary.json``), not under "no
    backend" for a user's ``pkg.module:factory``, nor under a registered prefix of a faulty wrapper's name."""
    cases = [
        ("test_matches_reference[my_kernels.plugin:factory-EP2]", "<failure message='x'>x</failure>"),
        ("test_matches_reference[faulty:experts_off_by_one@reference-ep-EP1]", ""),
    ]
    body = "".join(
        f"<testcase classname='suites.conformance.test_generic' name=\"{n}\" time='1'>{d}</testcase>" for n, d in cases
    )
    (tmp_path / "junit.xml").write_text(f"<testsuites><testsuite name='pytest'>{body}</testsuite></testsuites>")
    implementations = ["my_kernels.plugin:factory", "faulty:experts_off_by_one@reference-ep"]
    (tmp_path / "summary.json").write_text(json.dumps({"implementations": implementations}))
    filed = {t.nodeid.split("[")[1]: (t.impl, t.ep, t.outcome) for t in report_outcomes.tests(tmp_path)}
    assert filed == {
        "my_kernels.plugin:factory-EP2]": ("my_kernels.plugin:factory", "EP2", "failed"),
        "faulty:experts_off_by_one@reference-ep-EP1]": ("faulty:experts_off_by_one@reference-ep", "EP1", "passed"),
    }, filed
    cells = outcomes.matrix(tmp_path / "junit.xml")  # python -m ci.outcomes on the run's JUnit file: the same cells
    assert {key: dict(count) for key, count in cells.items()} == {
        ("my_kernels.plugin:factory", "EP2"): {"failed": 1},
        ("faulty:experts_off_by_one@reference-ep", "EP1"): {"passed": 1},
    }, cells


# ---------------------------------------------------------------- a failure's reproduction line runs as printed
def _fails_and_its_pasted_line_fails_again(spec: str) -> None:
    """``spec`` fails the oracle check on a small case; its printed reproduction, pasted at the checkout's root in a
    bare shell (no venv, no PYTHONPATH), fails the same check with exit 1. Fresh pools: they inherit the PYTHONPATH."""
    from fixtures.scheduling.scheduler import isolated

    layer = LayerCase(num_experts=4, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=1)
    scenario = Scenario(layer, (BatchCase(tokens=(6,), seed=2),), 1)
    with isolated(), pytest.raises(ConformanceFailure) as failure:
        check_oracle(Subject(spec, load(spec), 1), scenario)
    line = next(ln for ln in str(failure.value).splitlines() if ln.strip().startswith("reproduce: "))
    command = line.split("reproduce: ", 1)[1]
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and f"FAIL oracle: [oracle] {spec}" in out, f"{command}\n{out[-2000:]}"


def test_printed_reproduction_runs_with_a_bare_path_and_fails_again():
    _fails_and_its_pasted_line_fails_again("faulty:rank_zeroed")  # at EP1 its one rank is the last: every row zero


def test_a_plugin_kernels_printed_reproduction_loads_it_and_fails_again(tmp_path, monkeypatch):
    """A user's kernel (``pkg.module:factory``) comes from their PYTHONPATH: the printed line carries that path, so
    pasted at the checkout's root in a bare shell it loads the kernel and fails the same check."""
    (tmp_path / "their_kernels").mkdir()
    (tmp_path / "their_kernels" / "__init__.py").write_text("")
    (tmp_path / "their_kernels" / "wrong.py").write_text(
        "from fixtures.core.implementation import load\n\ndef factory():\n    return load('faulty:rank_zeroed')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT)]))
    _fails_and_its_pasted_line_fails_again("their_kernels.wrong:factory")


@pytest.mark.parametrize(
    "tbstyle, fulltrace, short", [("auto", False, True), ("long", False, False), ("auto", True, False)]
)
def test_a_traceback_asked_for_is_kept(tbstyle, fulltrace, short):
    """--tb=long (or short, native) and --full-trace keep pytest's traceback of a check's failure."""
    from fixtures.plugin import triage

    failure = ConformanceFailure("[oracle] k at EP1: the verdict\n  reproduce: python -m ci.repro ...", check="oracle")
    item = SimpleNamespace(config=SimpleNamespace(option=SimpleNamespace(tbstyle=tbstyle, fulltrace=fulltrace)))
    report = SimpleNamespace(failed=True, longrepr="the traceback")
    hook = triage.pytest_runtest_makereport(item, SimpleNamespace(excinfo=SimpleNamespace(value=failure)))
    next(hook)
    with pytest.raises(StopIteration) as done:
        hook.send(report)
    assert done.value.value.longrepr == (str(failure) if short else "the traceback")


# ---------------------------------------------------------------- the tools that read the per-case records, and the latency bench's GPU peaks
GPU = torch.device("cuda", 0)  # a device object only: nothing runs on it
TINY = bench_latency.GEOMETRIES["tiny"]


def test_cases_per_minute_and_phase_split_come_from_the_suites_records(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MOE_HYPOTHESIS_EXAMPLES", "2")
    monkeypatch.setenv("MOE_RESULTS_DIR", str(tmp_path))  # the run's own --results-dir wins; this is unused
    assert bench_cases.main(["--impl", "reference-ep", "--ep", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| reference-ep")]
    assert len(rows) == 1, rows
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "1" and cells[2] == "2", cells  # EP1, the two drawn cases
    assert float(cells[4]) > 0  # cases per minute
    split = [float(c) for c in cells[6:]]
    # the process's phases and "other" split the whole case time; each cell is rounded to a whole percent
    assert abs(sum(split[2:]) - 100) <= 0.5 * len(split[2:]), f"the process's split must cover the case: {cells}"


def test_only_the_drawn_reference_cases_count():
    ranks, process = (
        {"build": 0.5, "first-forward": 0.25, "forward": 0.25},
        {"run": 1.0, "oracle": 0.5, "textbook": 0.25},
    )
    drawn = CaseRecord(
        "x", 1, "r", "oracle+textbook", "{}", 2.0, layers_built=1, rank_seconds=ranks, process_seconds=process
    )
    records = [drawn, CaseRecord("x", 1, "r", "model:deepseek-v3", "{}", 100.0)]
    s = bench_cases.summarise(records)[("x", 1)]
    assert (s["cases"], s["case s"], s["rank forward"], s["textbook"]) == (1, 2.0, 0.5, 0.25)
    assert "| x | 1 | 1 | 2.0 | 30.0 | 1 | 25 | 25 | 50 | 25 | 0 | 0 | 12 | 12 |" in bench_cases.table({("x", 1): s})


@pytest.mark.parametrize("name", sorted(bench_latency.GPU_PEAKS))
def test_a_known_gpu_gets_its_own_peaks(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    gpu, peaks, why = bench_latency.device_peaks(GPU)
    assert (gpu, peaks, why) == (name, bench_latency.GPU_PEAKS[name], "")
    r = bench_latency.row("k", TINY, 64, [0.01], 1.0, peaks)
    assert r["tflops_frac_peak"] == pytest.approx(r["tflops"] / peaks["fp8_tflops"], abs=2e-4)  # of rounded fields
    assert r["hbm_frac_peak"] == pytest.approx(r["hbm_gbs"] / peaks["hbm_gbs"], abs=2e-4)


def test_an_unknown_gpu_has_no_fraction_of_peak_and_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B200")
    gpu, peaks, why = bench_latency.device_peaks(GPU)
    assert gpu == "NVIDIA B200" and peaks is None and "'NVIDIA B200'" in why and "GPU_PEAKS" in why
    r = bench_latency.row("k", TINY, 64, [0.01], 1.0, peaks)
    assert r["tflops_frac_peak"] is None and r["hbm_frac_peak"] is None and r["tflops"] > 0


# ---------------------------------------------------------------- tools/summarise_cases.py on records shaped like the suites'
def _record(impl, ep, metrics, textbook=(), seconds=1.0):
    times = dict(rank_seconds={"build": 0.5, "forward": 0.25}, process_seconds={"oracle": 0.125})
    return CaseRecord(impl, ep, "r", "oracle+textbook", "{}", seconds, metrics, textbook_rel_l2=list(textbook), **times)


def test_worst_errors_and_times_per_backend_and_ep_size():
    first = [{"rel_l2": 0.01, "cosine": 0.9999, "row_rel_max": 0.02, "band_units_max": 3.0}, {"batch": 1, "rank": 0}]
    second = [{"rel_l2": 0.03, "cosine": 0.999, "row_rel_max": 0.01, "band_units_max": 1.0}]
    records = [_record("a", 1, first, textbook=[0.05, 0.07]), _record("a", 1, second, seconds=2.0)]
    records.append(_record("a", 2, [{"rel_l2": 0.002}]))
    s = summarise(records)
    a1 = s[("a", 1)]
    assert (a1["cases"], a1["checks"]) == (2, 2)  # the empty batch is not a check
    assert (a1["rel-L2 max"], a1["cosine min"], a1["token max"], a1["band max"]) == (0.03, 0.999, 0.02, 3.0)
    assert a1["textbook max"] == 0.07 and a1["case s (sum)"] == 3.0 and a1["rank build s"] == 1.0
    assert s[("a", 2)]["checks"] == 1


def test_reads_the_suites_own_results(tmp_path, capsys):
    path = tmp_path / "cases-main.jsonl"
    line = json.dumps({"time": 1.0, **dataclasses.asdict(_record("impl-x", 4, [{"rel_l2": 0.5}]))})
    path.write_text("\n".join([line] * 3) + "\n")
    assert main([str(tmp_path)]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| impl-x")]
    assert row == ["| impl-x | 4 | 3 | 3 | 0.5 | 1 | 0 | 0 |  | 3 | 1.5 | 0.75 | 0.375 |"]
