"""One exit-code table for every command (ci.cli.EXIT_CODES): each ``python -m`` command of ci/, tools/ and gates/ (found
by its ``main`` and ``__main__`` block, called in this process) lists in its ``--help`` every code it returns, with the
table's meaning, and a bad argument is exit 4 with one line on stderr and no traceback."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
from pathlib import Path

import pytest

from ci import cli

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
# a bad argument of its own where the generic one would be taken for another program's (tools.bench_cases and
# ci.nightly hand the arguments they do not know to pytest)
BAD = {"tools.bench_cases": ["--from", "/nonexistent/results"], "ci.nightly": ["--phase-timeout", "soon"]}
GENERIC_BAD = ["--no-such-option"]
# words that name another class of code than the one listed beside them (a code meaning two things)
WRONG_CLASS = {
    cli.VERDICT: ("unusable", "malformed", "not there", "incomparable"),
    cli.INPUT: ("no gpu", "server did not", "regression", "reproduced", "could not complete"),
    cli.NOTHING_TESTED: ("malformed", "regression", "no gpu"),
    cli.INCOMPLETE: ("malformed", "not json", "unknown", "regression", "reproduced"),
}


def commands() -> list[str]:
    found = []
    for path in sorted([*(ROOT / "ci").glob("*.py"), *(ROOT / "tools").glob("*.py"), *(ROOT / "gates").rglob("*.py")]):
        text = path.read_text()
        if re.search(r"^def main\(", text, re.M) and re.search(r"^if __name__ == .__main__.:", text, re.M):
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def call(module: str, argv: list[str]) -> tuple[int, str, str]:
    """``python -m module *argv`` in this process: (exit code, stdout, stderr); an exception other than SystemExit
    is left to fail the test with its traceback, as the shell would show it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = importlib.import_module(module).main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else cli.INTERNAL)
    return code, out.getvalue(), err.getvalue()


def listed(help_text: str) -> dict[int, str]:
    """The codes under "exit codes:" in a --help, with what each means there."""
    block = help_text.split("exit codes:\n", 1)[1]
    return {int(m[1]): m[2] for m in re.finditer(r"^  (\d+)  (.*)$", block, re.M)}


def returned(module: str) -> set[int]:
    """The codes a command's source can return: main's returns (cli constants, literals), its InputError and
    Incomplete, and what the ``__main__`` block hands to the shell must be main's own code."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    names = {
        name: getattr(cli, name) for name in "OK VERDICT INTERRUPTED INTERNAL INPUT NOTHING_TESTED INCOMPLETE".split()
    }
    raised = [ast.unparse(node.exc) for node in ast.walk(tree) if isinstance(node, ast.Raise) and node.exc is not None]
    codes = {cli.INPUT for r in raised if "cli.InputError" in r} | {
        cli.INCOMPLETE for r in raised if "cli.Incomplete" in r
    }
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    for node in ast.walk(main):
        if isinstance(node, ast.Return) and node.value is not None:
            for part in ast.walk(node.value):
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "cli":
                    codes.add(names[part.attr])
                elif isinstance(part, ast.Constant) and type(part.value) is int:
                    codes.add(part.value)
    guard = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    shell = ast.unparse(guard.body[-1])
    assert re.fullmatch(r"(sys\.exit|raise SystemExit)\(main\((sys\.argv\[1:\])?\)\)", shell), (
        f"{module}: its __main__ block ends `{shell}`, not handing main's exit code to the shell"
    )
    return codes


COMMANDS = commands()


def test_the_commands_are_found():
    assert {"ci.compare_runs", "ci.nightly", "ci.active_python", "tools.calibrate", "tools.gen_docs"} <= set(COMMANDS)


@pytest.mark.parametrize("module", COMMANDS)
def test_help_lists_each_code_it_returns_with_the_tables_meaning(module):
    code, out, err = call(module, ["--help"])
    assert code == cli.OK and out.startswith("usage: python -m ") and "exit codes:\n" in out, out + err
    codes = listed(out)
    assert set(codes) <= set(cli.EXIT_CODES), f"{module} lists codes outside ci.cli.EXIT_CODES: {sorted(codes)}"
    assert cli.OK in codes and cli.INPUT in codes, f"{module} does not list 0 and 4 (a usage error): {sorted(codes)}"
    wrong = [
        f"{c}: {meaning!r} reads as another code's ({word!r})"
        for c, meaning in codes.items()
        for word in WRONG_CLASS.get(c, ())
        if word in meaning.lower()
    ]
    assert not wrong, f"{module}: " + "; ".join(wrong)
    unlisted = returned(module) - set(codes)
    assert not unlisted, f"{module} can return {sorted(unlisted)}, which its --help does not list: {sorted(codes)}"
    if module == "ci.backends":  # the names --impl takes beyond the listed ones
        assert "all " in out and "pkg.module:factory" in out, out


@pytest.mark.parametrize("module", COMMANDS)
def test_a_bad_argument_is_exit_4_and_one_line(module):
    code, out, err = call(module, BAD.get(module, GENERIC_BAD))
    said = [line for line in err.splitlines() if line.strip()]
    assert code == cli.INPUT, f"{module}: exit {code}, not {cli.INPUT}\n{err[-2000:]}"
    assert len(said) == 1 and "Traceback" not in out + err, f"{module}: stderr is not one line:\n{err[-2000:]}"
