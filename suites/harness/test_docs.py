"""The user-facing docs stay true: the generated ones match the code, the README gives its two commands up front and
its plugin example works as printed (a broken copy fails), every relative link resolves inside the repository. And the
project stands on its own (issue 25): nothing outside evidence/ refers to ../shared (bar .ci/run's GSM8K copy), every
``kernels §N`` citation names a section of docs/flashinfer-kernels.md, dates in Python files sit inside evidence links
(reference/evidence.py), and every hardware bound, finding and descriptor links a log that exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.core.checks import ConformanceFailure, check_oracle
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.runner import Subject
from fixtures.scheduling.scheduler import isolated
from tools import gen_docs

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("bash ci/conformance.sh", "bash ci/test.sh")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
MD_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where brackets are code, not links."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


def _anchors(page: Path) -> set[str]:
    return {
        gen_docs._slug(h) for h in MD_HEADING.findall(re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M))
    }


def dead_links(page: Path) -> list[str]:
    """The relative links of ``page`` that name no file (or no heading) inside the repository."""
    dead = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not a path
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            dead.append(f"{target} (no such file in the repository)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            dead.append(f"{target} (no heading '{anchor}' in {resolved.relative_to(ROOT)})")
    return dead


def test_generated_docs_are_current():
    stale = gen_docs.stale(ROOT)
    assert not stale, f"stale: {', '.join(stale)}: run python -m tools.gen_docs"


def test_readme_gives_both_commands_in_its_first_30_lines():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:30])
    assert [c for c in COMMANDS if c not in head] == [], "README.md's first 30 lines must give both commands"


def test_the_main_job_tests_only_the_implementations_impl_names(tmp_path):
    """``bash ci/conformance.sh --impl X`` tests X alone: every registered implementation is the main job's default,
    not an addition to what ``--impl`` names."""
    argv = ["bash", "ci/conformance.sh", "--impl", "reference-ep", "--ep", "1", "--results-dir", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "MOE_CONFORMANCE_IMPL"}
    done = subprocess.run([*argv, "--co", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    subjects = [line for line in done.stdout.splitlines() if line.startswith("suites/conformance/")]
    others = [line for line in subjects if "[reference-ep-EP1" not in line]
    assert subjects and not others, f"{len(others)} conformance tests of other implementations, such as {others[:3]}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page):
    assert dead_links(page) == []


# ---------------------------------------------------------------- the README's plugin example works as printed
@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(# my_kernels/plugin.py\n.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) == 1, "README.md must hold exactly one plugin example"
    code = blocks[0]
    assert "g, u = " in code
    package = tmp_path / "my_kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(code)
    (package / "swapped.py").write_text(code.replace("g, u = ", "u, g = "))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    with isolated():  # fresh pools inherit the PYTHONPATH that holds the plugin
        yield "my_kernels"
    for name in ("my_kernels.plugin", "my_kernels.swapped", "my_kernels"):
        sys.modules.pop(name, None)


def test_readme_plugin_passes_and_a_broken_copy_fails(plugin_package):
    layer = LayerCase(num_experts=4, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=5)
    batches = (
        BatchCase(tokens=(6,), seed=2),
        BatchCase(tokens=(3,), seed=3, pattern="masked"),
        BatchCase(tokens=(5,), seed=4, method="DeepSeekV3", routed_scaling_factor=2.5, bias_scale=1.0),
    )
    scenario = Scenario(layer, batches, 1)
    good = f"{plugin_package}.plugin:factory"
    check_oracle(Subject(good, load(good), 1), scenario)
    bad = f"{plugin_package}.swapped:factory"
    with pytest.raises(ConformanceFailure, match=r"\[oracle\].*swapped"):
        check_oracle(Subject(bad, load(bad), 1), scenario)


def test_readme_plugin_command_runs_as_printed_from_another_repository(tmp_path):
    """The README's command, typed in the user's own repository (outside the checkout): its relative PYTHONPATH names
    that repository, and the plugin's conformance run passes (one test of it, to keep the CPU tier short)."""
    readme = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(# my_kernels/plugin.py\n.*?)```", readme, re.S)[0]
    lines = re.findall(r"```bash\n(PYTHONPATH=\. bash <checkout>/ci/test\.sh [^\n]*)\n```", readme)
    assert len(lines) == 1, "README.md prints the plugin's command once, to run from the user's repository"
    repo = tmp_path / "their-repo"
    (repo / "my_kernels").mkdir(parents=True)
    (repo / "my_kernels" / "__init__.py").write_text("")
    (repo / "my_kernels" / "plugin.py").write_text(code)
    command = lines[0].replace("<checkout>", str(ROOT)) + " -k test_matches_reference -p no:cacheprovider"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MOE_CONFORMANCE_", "PYTHONPATH"))}
    env["MOE_WORKERS"] = "0"
    done = subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "test_matches_reference[my_kernels.plugin:factory-EP1] PASSED" in done.stdout or " passed" in done.stdout
    assert "my_kernels.plugin:factory" in done.stdout, done.stdout[-2000:]
    # the main job takes the same relative PYTHONPATH (collected only: the run above is the check)
    main_job = f"PYTHONPATH=. bash {ROOT}/ci/conformance.sh --impl my_kernels.plugin:factory --ep 1 --collect-only -q"
    done = subprocess.run(["bash", "-c", main_job], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "my_kernels.plugin:factory-EP1" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-2000:]
    )


# ---------------------------------------------------------------- the project stands on its own and keeps its evidence out of the code (issue 25)
KERNELS_DOC = ROOT / "docs" / "flashinfer-kernels.md"
OUTSIDE = re.compile(r"\.\./shared|/work/shared|\bshared/(?:docs|gpu|datasets)\b")
ALLOWED_OUTSIDE = {".ci/run": re.compile(r"shared/datasets/gsm8k")}  # CI's dataset, through MOE_GSM8K_DIR only
CHECKED = re.compile(r"""(["'])[^"']*shared[^"']*\1 in\b""")  # a check naming what it forbids: `"../shared" in line`
DATE = re.compile(r"20\d\d-[01]\d-[0-3]\d")
DATED_LINK = re.compile(r"evidence/(?:raw/)?20\d\d-[01]\d-[0-3]\d")
_SEC = r"§D?\d+(?:\.\d+)?"
CITATION = re.compile(rf"(?:kernels|flashinfer-kernels\.md) ({_SEC}(?: item \d+|(?:, |-){_SEC})*)")
SECTION = re.compile(r"§(D?\d+(?:\.\d+)?)(?: item (\d+))?")
HEADING = re.compile(r"^#{2,3} (D?\d+(?:\.\d+)?)\.? ", re.M)
STALE = re.compile(r"catalogue §|delta §|peer-test-practices")  # citations of documents a user cannot open
SKIP_DIRS = {".git", ".venv", ".hypothesis", ".pytest_cache", "__pycache__", "results", ".gpu", ".whl", "evidence"}


def _project_files() -> list[Path]:
    """The checkout's files (tracked, or new and not ignored), evidence/ left out."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split("\n")
        paths = [ROOT / p for p in out if p]
    except (OSError, subprocess.CalledProcessError):  # no git: walk the tree
        paths = [p for p in ROOT.rglob("*") if not SKIP_DIRS & set(p.relative_to(ROOT).parts[:-1])]
    here = Path(__file__).resolve()  # its examples of what the checks refuse are not project text
    paths = [p for p in paths if p.relative_to(ROOT).parts[0] not in SKIP_DIRS and not p.name.startswith(".venv")]
    return sorted(p for p in paths if p.is_file() and p.resolve() != here)


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (UnicodeDecodeError, OSError):
        return None


def outside_references(files: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line: text`` for each line that refers outside the repository (bar the allowed ones)."""
    found = []
    for path in files:
        rel, allowed = path.relative_to(root).as_posix(), ALLOWED_OUTSIDE.get(path.relative_to(root).as_posix())
        for n, line in enumerate((_text(path) or "").splitlines(), 1):
            if OUTSIDE.search(CHECKED.sub("", line)) and not (allowed and allowed.search(line)):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found


def dated_lines(files: list[Path], root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(every line of a Python file holding a date, those of them whose date is not inside an evidence link)."""
    dated, bare = [], []
    for path in files:
        if path.suffix != ".py" or (text := _text(path)) is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if DATE.search(line):
                where = f"{path.relative_to(root).as_posix()}:{n}: {line.strip()}"
                dated.append(where)
                if len(DATE.findall(line)) != len(DATED_LINK.findall(line)):
                    bare.append(where)
    return dated, bare


def doc_sections(doc: str) -> dict[str, set[int]]:
    """Section number -> the numbered items that open its lines, from a markdown page's headings."""
    sections, current = {}, None
    for line in doc.splitlines():
        if m := HEADING.match(line + " "):
            current = m.group(1)
            sections[current] = set()
        elif current and (m := re.match(r"^(\d+)\. ", line)):
            sections[current].add(int(m.group(1)))
    return sections


def unresolved_citations(files: list[Path], doc: str, root: Path = ROOT) -> list[str]:
    """Each ``kernels §N [item M]`` cited in a Python file that names no section (or item) of ``doc``; and each
    citation of the team's documents the code cited before (``catalogue §``, ``delta §``, peer-test-practices)."""
    sections, bad = doc_sections(doc), []
    for path in files:
        if path.suffix != ".py" or (text := _text(path)) is None:
            continue
        # join implicitly concatenated strings and continued comments, so a citation split over lines reads whole
        flat = re.sub(r"\s+", " ", re.sub(r"\n\s*#", " ", re.sub(r"[\"']\s*\n\s*f?[\"']", "", text)))
        rel = path.relative_to(root).as_posix()
        for cited in CITATION.findall(flat):
            for number, item in SECTION.findall(cited):
                if number not in sections or (item and int(item) not in sections[number]):
                    bad.append(f"{rel}: kernels §{number}{' item ' + item if item else ''}")
        bad += [f"{rel}: {m.group(0)}" for m in STALE.finditer(text)]
    return bad


def test_nothing_outside_evidence_refers_outside_the_repository():
    found = outside_references(_project_files())
    assert not found, "refers outside the repository (carry the fact into docs/ instead):\n" + "\n".join(found)


RUN_LOG = re.compile(r"SESSION[0-9]|RUN[0-9]|session[0-9]")  # a run or log sequence number


def run_log_lines(files: list[Path], root: Path = ROOT) -> list[str]:
    """Lines outside evidence/ that name a run or log by its sequence number, or a date outside an evidence link."""
    _, bare = dated_lines(files, root)
    numbered = [
        f"{path.relative_to(root).as_posix()}:{n}: {line.strip()}"
        for path in files
        if (text := _text(path)) is not None
        for n, line in enumerate(text.splitlines(), 1)
        if RUN_LOG.search(line)
    ]
    return bare + numbered


def test_no_run_log_in_the_code():
    """Code, comments and docs state the rule and today's number; the story is in evidence/, named by what it shows."""
    found = run_log_lines(_project_files())
    assert not found, "a run's number or a bare date (cite the log through reference/evidence.py):\n" + "\n".join(found)


def test_every_kernel_citation_names_a_section_of_the_kernel_doc():
    bad = unresolved_citations(_project_files(), KERNELS_DOC.read_text())
    assert not bad, "citations docs/flashinfer-kernels.md does not hold:\n" + "\n".join(bad)


def test_evidence_links_name_logs_that_exist():
    from reference import evidence

    if not (ROOT / "evidence").is_dir():
        pytest.skip("no evidence/ folder beside the code (an installed copy, not a checkout)")
    missing = [p for p in (*evidence.LOGS, *evidence.RAW) if not (ROOT / p).exists()]
    assert not missing, f"reference/evidence.py names what evidence/ does not hold: {missing}"


def test_every_hardware_bound_finding_and_descriptor_links_its_log():
    from fixtures.core import findings
    from fixtures.backends.flashinfer.descriptors import ALL_DESCRIPTORS
    from reference import evidence
    from reference.recipes import KERNEL_RECIPES

    def linked(text: str) -> bool:
        return any(log in text for log in evidence.LOGS)

    bad = [f"finding {k}" for k in findings.FINDINGS if findings.EVIDENCE.get(k) not in evidence.LOGS]
    bad += [f"{d.impl_name}: evidence {d.evidence!r}" for d in ALL_DESCRIPTORS if d.evidence and not linked(d.evidence)]
    for recipe in KERNEL_RECIPES.values():
        bounds = {"tolerance": recipe.tolerance, "regroup": recipe.regroup_tolerance}
        for what, bound in {**bounds, "systematic": recipe.tolerance.systematic}.items():
            if bound is not None and not (linked(bound.reason) or re.search(r"unverified|provisional", bound.reason)):
                bad.append(f"{recipe.name} {what}: {bound.reason!r}")
    assert not bad, "a hardware claim without a link to its log (reference/evidence.py):\n" + "\n".join(bad)


# --- each check can fail -----------------------------------------------------------------------------------


def test_the_checks_see_a_reference_outside_and_a_bare_date(tmp_path):
    (tmp_path / ".ci").mkdir()
    code, run = tmp_path / "mod.py", tmp_path / ".ci" / "run"
    code.write_text(
        '"""From ../shared/docs/x.md (H200, 2026-12-01)."""\nLOG = "evidence/2026-12-01-run.md"\n'
        'BAD = [line for line in LINES if "../shared" in line]  # a check, not a reference\n'
    )
    run.write_text('export MOE_GSM8K_DIR="$(dirname "$PWD")/shared/datasets/gsm8k"\ncp ../shared/gpu/x .\n')
    first = "mod.py:1: " + code.read_text().splitlines()[0]
    assert outside_references([code, run], tmp_path) == [first, ".ci/run:2: cp ../shared/gpu/x ."]
    dated, bare = dated_lines([code, run], tmp_path)
    assert len(dated) == 2 and bare == [first]
    planted = "LOG = evidence." + "SESSION" + "19  # the log"  # spelled apart: the repository's own grep stays empty
    code.write_text(planted + "\n")
    assert run_log_lines([code], tmp_path) == ["mod.py:1: " + planted]


def test_the_check_sees_a_citation_the_doc_does_not_hold(tmp_path):
    doc = "## 3. Kernels\n### 3.1 pull\n1. identity\n2. formats\n## D2. New\n### D2.2 mxfp4\n4. weights\n"
    code = tmp_path / "mod.py"
    code.write_text('SRC = "kernels §3.1 item 2, and kernels §D2.2 item 4"\nOK = "kernels §3, §3.1-§D2.2"\n')
    assert unresolved_citations([code], doc, tmp_path) == []
    code.write_text('A = "kernels §3.2"\nB = "kernels §3.1 item 9"\n# kernels\n# §D7\nC = "catalogue §1.8"\n')
    want = ["kernels §3.2", "kernels §3.1 item 9", "kernels §D7", "catalogue §"]
    assert unresolved_citations([code], doc, tmp_path) == [f"mod.py: {w}" for w in want]
