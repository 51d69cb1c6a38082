"""Every Python file of the project passes pyflakes (no undefined names, unused imports or redefinitions) and is
at most 300 lines long.

Much of the suite runs only on a GPU (the SM90 behaviour, fault and routing-op tests), never in the CPU CI: a
name left undefined by a refactor there reaches the first GPU run instead of CI (on the H200,
test_routing_ops.py called a helper that had moved to another module, a NameError in two tests)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reference", "fixtures", "suites", "ci", "gates", "tools", "evidence")


def _sources() -> list[Path]:
    return sorted([ROOT / "conftest.py"] + [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")])


def test_pyflakes_finds_nothing():
    from pyflakes import api, reporter

    class Collect(reporter.Reporter):
        def __init__(self):
            self.lines = []

        def unexpectedError(self, filename, message):
            self.lines.append(f"{filename}: {message}")

        def syntaxError(self, filename, msg, lineno, offset, text):
            self.lines.append(f"{filename}:{lineno}: syntax error: {msg}")

        def flake(self, message):
            self.lines.append(str(message))

    found = Collect()
    for path in _sources():
        api.checkPath(str(path), found)
    assert not found.lines, "pyflakes:\n" + "\n".join(found.lines)


MAX_LINES = 300  # small files with one job (evidence/raw holds raw results, not the product's code)


def test_no_python_file_is_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources() if p.relative_to(ROOT).parts[:2] != ("evidence", "raw")
            and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split by job): {long}"


def test_the_check_sees_an_undefined_name(tmp_path):
    """The check itself can fail: a module calling a name nobody defines."""
    from pyflakes import api, reporter

    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return _held_to_finding(1)\n")
    lines = []
    rep = reporter.Reporter(None, None)
    rep.flake = lambda message: lines.append(str(message))
    api.checkPath(str(bad), rep)
    assert any("undefined name '_held_to_finding'" in line for line in lines), lines
