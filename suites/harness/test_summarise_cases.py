"""tools/summarise_cases.py on records shaped like those the conformance suites write (cases-*.jsonl)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tools.summarise_cases import main, summarise
from fixtures.results import CaseRecord

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


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
