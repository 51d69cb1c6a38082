"""Several results folders read as one: the shards of one run (``pytest --shard K/N``, each on its own machine), merged.

A folder given here is a run folder (fixtures.plugin.run_folder), a results folder holding run folders, or a folder of
ci.nightly's (its phases' run folders, its JUnit files, env.json). Merging copies each into ``OUT/inputs/<i>-<name>``
and writes there what ci.report and ci.compare_runs read at the top: ``env.json`` (the first input's, its phases
named after their input), ``api.json`` and ``latency.json`` (the first input's that has one) and
``merged-summary.json``: the run folders' summary.json files added up (counts added, matrices merged cell by cell,
each test's outcome, the exit status the worst, the times the earliest start and the latest end).

The rule that makes a merge an input error: a test that two shards of one run both ran (shard K and shard J != K of
the same N: the split is a partition, so such a pair of folders is not one run's shards), shards of unequal N, or one
run folder given twice. Runs without a shard (ci.nightly's phases, two plain sessions) may share tests: a reader
keeps each test's worst outcome.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from xml.etree import ElementTree

from ci import cli
from fixtures.core import results
from fixtures.core.results import CASE_REQUIRED
from fixtures.plugin import run_folder

MERGED_SUMMARY = "merged-summary.json"
_WORST = ("skipped", "xfailed", "passed", "xpassed", "failed", "error")
_SKIP_COPY = ("latest.txt", "report.md", "report.html", "plots", MERGED_SUMMARY)  # outputs, not results


RESULT_SUFFIXES = (".jsonl", ".xml", ".json")  # what the suite writes into a results folder, plain or .gz


def unreadable(folder: Path) -> str | None:
    """The first results file under ``folder`` that its reader could not read, in words, or None: a path named like a
    results file that is no readable file (a folder, a dangling link, no permission), text that is not UTF-8, a JSON
    line that is no object (a per-case record without its fields), a JUnit file that is no XML, a JSON file that is
    no JSON."""
    for path in sorted(folder.rglob("*")):
        name = path.name.removesuffix(".gz")
        if not name.endswith(RESULT_SUFFIXES):
            continue
        if not path.is_file():
            return f"{path} is {'a folder' if path.is_dir() else 'no readable file'}, named like a results file"
        try:
            text = results.text(path)
            if name.endswith(".xml"):
                ElementTree.fromstring(text)
            elif name.endswith(".json"):
                json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError, ElementTree.ParseError) as err:  # json's: ValueError
            return f"{path} is malformed ({' '.join(str(err).split())})"
        if name.endswith(".jsonl"):
            for number, line in enumerate(text.splitlines(), 1):
                problem = _record_problem(line, name) if line.strip() else None
                if problem:
                    return f"{path} line {number} {problem}"
    return None


def _record_problem(line: str, name: str) -> str | None:
    try:
        record = json.loads(line)
    except ValueError as err:
        return f"is malformed (not JSON: {err})"
    if not isinstance(record, dict):
        return "is malformed (not a JSON object)"
    missing = [field for field in CASE_REQUIRED if field not in record] if name.startswith("cases-") else []
    return f"is malformed (it lacks a per-case record's {', '.join(missing)})" if missing else None


def summaries(folders: list[Path]) -> list[tuple[Path, dict]]:
    """Every run's summary.json under ``folders``, checked (schema, disjoint shards): an InputError otherwise."""
    found: list[tuple[Path, dict]] = []
    for folder in folders:
        try:
            found += run_folder.summaries(folder)
        except run_folder.SummaryError as err:
            raise cli.InputError(f"{err}; a summary.json follows fixtures/plugin/summary.schema.json") from None
    check(found)
    return found


def check(found: list[tuple[Path, dict]]) -> None:
    """Raise an InputError where the runs cannot be one run's shards (the module's rule)."""
    seen_runs: dict[str, Path] = {}
    owner: dict[str, tuple[tuple[int, int], Path]] = {}
    sizes = {s["shard"]["n"] for _, s in found if s["shard"]}
    if len(sizes) > 1:
        raise cli.InputError(
            f"shards of {' and '.join(map(str, sorted(sizes)))} parts: give the shards of one run, each K of the same N"
        )
    for path, summary in found:
        if summary["run"] in seen_runs:
            raise cli.InputError(
                f"run {summary['run']} given twice ({seen_runs[summary['run']].parent} and "
                f"{path.parent}): give each shard's folder once"
            )
        seen_runs[summary["run"]] = path
        if not summary["shard"]:
            continue
        shard = (summary["shard"]["k"], summary["shard"]["n"])
        for test in summary["tests"]:
            other = owner.setdefault(test, (shard, path))
            if other[0] != shard:
                raise cli.InputError(
                    f"{test} ran in shard {other[0][0]}/{other[0][1]} ({other[1].parent}) and in shard "
                    f"{shard[0]}/{shard[1]} ({path.parent}): a test belongs to one shard; give the "
                    "folders of one run's shards"
                )


def merged_summary(found: list[tuple[Path, dict]]) -> dict | None:
    """The summaries added up (the module's rule); None without any."""
    if not found:
        return None
    parts = [s for _, s in found]
    counts = {o: sum(s["counts"].get(o, 0) for s in parts) for o in run_folder.OUTCOMES}
    matrix: dict = {}
    tests: dict[str, str] = {}
    for s in parts:
        for impl, row in s["matrix"].items():
            for ep, cell in row.items():
                into = matrix.setdefault(impl, {}).setdefault(ep, {})
                for outcome, n in cell.items():
                    into[outcome] = into.get(outcome, 0) + n
        for test, outcome in s["tests"].items():
            if test not in tests or _WORST.index(outcome) >= _WORST.index(tests[test]):
                tests[test] = outcome
    shards = sorted({(s["shard"]["k"], s["shard"]["n"]) for s in parts if s["shard"]})
    return {
        "runs": [s["run"] for s in parts],
        "counts": counts,
        "matrix": matrix,
        "tests": dict(sorted(tests.items())),
        "versions": parts[0]["versions"],
        "shards": [{"k": k, "n": n} for k, n in shards],
        "implementations": sorted({i for s in parts for i in s["implementations"]}),
        "ep_sizes": sorted({e for s in parts for e in s["ep_sizes"]}),
        "exit_status": max((s["exit_status"] for s in parts), key=lambda code: (code != 0, code)),
        "started": min(s["started"] for s in parts),
        "ended": max(s["ended"] for s in parts),
    }


def merge(folders: list[Path], out: Path) -> Path:
    """Copy ``folders`` into ``out`` as one results folder (the module's rule); returns ``out``."""
    found = summaries(folders)
    out = out.resolve()
    for folder in folders:
        if out == folder.resolve() or folder.resolve() in out.parents:
            raise cli.InputError(f"--out {out} is inside {folder}: give a folder outside the inputs")
    inputs = out / "inputs"
    if inputs.exists():
        shutil.rmtree(inputs)
    env: dict = {}
    for i, folder in enumerate(folders, 1):
        name = f"{i}-{folder.resolve().name}"
        shutil.copytree(folder, inputs / name, ignore=lambda d, names: [n for n in names if n in _SKIP_COPY])
        own = folder / "env.json"
        if own.is_file():
            data = json.loads(own.read_text())
            phases = {f"{name}/{k}": v for k, v in data.pop("phases", {}).items()}
            env = env or data
            env.setdefault("phases", {}).update(phases)
        for extra in ("api.json", "latency.json"):
            if (folder / extra).is_file() and not (out / extra).exists():
                shutil.copyfile(folder / extra, out / extra)
    if env:
        (out / "env.json").write_text(json.dumps(env, indent=1))
    total = merged_summary(found)
    if total:
        (out / MERGED_SUMMARY).write_text(json.dumps(total, indent=1) + "\n")
    return out
