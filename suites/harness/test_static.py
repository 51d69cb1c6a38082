"""The project's static checks, run by the CPU tier: ruff's lint and formatter over every Python file (a name left
undefined in a GPU-only test is seen here, not on the first GPU run), and the import layers' contracts (.importlinter)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    exe = BIN / name
    if not exe.exists():
        pytest.fail(f"no {name} next to {sys.executable}: install the test extra (pip install -e '.[test]')")
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "PYTHONPATH": str(cwd)}
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_ruff_lint_finds_nothing():
    done = _tool("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-1000:]


def test_ruff_format_leaves_every_file_as_it_is():
    done = _tool("ruff", "format", "--no-cache", "--check", ".")
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout[-4000:] + done.stderr[-1000:]


def test_the_import_layers_hold():
    done = _tool("lint-imports", "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-1000:]


def test_the_checks_see_an_undefined_name_and_a_forbidden_import(tmp_path):
    """Each check can fail: a module calling a name nobody defines; the harness importing a command."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return _held_to_finding(1)\n")
    done = _tool("ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad))
    assert done.returncode == 1 and "F821" in done.stdout, done.stdout
    tree = tmp_path / "tree"
    config = (ROOT / ".importlinter").read_text()
    named = {m for m in re.findall(r"^\s+([a-z_][\w.]*)\s*$", config, re.M)}  # every module the contracts name
    for module in sorted(named):  # each name a module, inside packages for its parents ("a.b": a/__init__.py, a/b.py)
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):
            package = tree.joinpath(*parts[:depth])
            if depth < len(parts) or len(parts) == 1:
                package.mkdir(parents=True, exist_ok=True)
                (package / "__init__.py").touch()
            else:
                package.with_suffix(".py").touch()
    (tree / "fixtures" / "compare.py").write_text("def f():\n    from ci import cli\n")
    (tree / ".importlinter").write_text(config)
    done = _tool("lint-imports", "--no-cache", cwd=tree)
    assert done.returncode == 1 and "the harness imports none of the commands built on it BROKEN" in done.stdout, (
        done.stdout
    )
