"""The user-facing docs stay true: the generated ones match the code, the README gives its two commands up front and
its plugin example works as printed (and a broken copy fails), and every relative link resolves inside the repository
(test_self_contained.py: nothing points outside it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from fixtures.checks import ConformanceFailure, check_oracle
from fixtures.implementation import load
from fixtures.problem import BatchCase, LayerCase, Scenario
from fixtures.runner import Subject
from fixtures.scheduler import isolated
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
    import os
    import subprocess

    readme = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(# my_kernels/plugin.py\n.*?)```", readme, re.S)[0]
    lines = re.findall(r"```bash\n(PYTHONPATH=\. bash <checkout>/ci/test\.sh [^\n]*)\n```", readme)
    assert len(lines) == 1, "README.md prints the plugin's command once, to run from the user's repository"
    repo = tmp_path / "their-repo"
    (repo / "my_kernels").mkdir(parents=True)
    (repo / "my_kernels" / "__init__.py").write_text("")
    (repo / "my_kernels" / "plugin.py").write_text(code)
    command = lines[0].replace("<checkout>", str(ROOT)) + " -k test_matches_reference -p no:cacheprovider"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MOE_CONFORMANCE_"))}
    env.pop("PYTHONPATH", None)
    env["MOE_WORKERS"] = "0"
    done = subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "test_matches_reference[my_kernels.plugin:factory-EP1] PASSED" in done.stdout or " passed" in done.stdout
    assert "my_kernels.plugin:factory" in done.stdout, done.stdout[-2000:]
