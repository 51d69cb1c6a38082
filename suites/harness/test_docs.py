"""The user-facing docs stay true: the generated ones match the code, the README gives its two commands up front, and
every relative link resolves inside the repository (test_self_contained.py: nothing points outside it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import gen_docs

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ("bash ci/conformance.sh", "bash ci/test.sh")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where brackets are code, not links."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


def _anchors(page: Path) -> set[str]:
    return {gen_docs._slug(h) for h in HEADING.findall(re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M))}


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


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page):
    assert dead_links(page) == []
