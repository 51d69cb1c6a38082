"""What the exit code of every command of the project means, and how its input errors read.

One meaning per code across every command: pytest (``python -m pytest``, ``bash ci/test.sh``, ``bash
ci/conformance.sh``), which keeps pytest's own codes, and every ``python -m ci.*`` or ``tools.*`` command
(``EXIT_CODES``, shown in docs/running.md and in each command's ``--help``). An input error is one line on stderr,
what was wrong and what is accepted, with no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import math
import os
import re
import sys
from pathlib import Path
from typing import Callable

OK, VERDICT, INTERRUPTED, INTERNAL, INPUT, NOTHING_TESTED, INCOMPLETE = 0, 1, 2, 3, 4, 5, 6
# code -> its one meaning, for every command (pytest's 0-5 are pytest's own; the suite adds what they leave open)
EXIT_CODES = {
    OK: "ok: every check that ran passed, and something was tested",
    VERDICT: "the verdict is bad: a test failed, a regression, a gate failed, a fault reproduced, a check or a "
    "build the command makes failed",
    INTERRUPTED: "interrupted (pytest: Ctrl-C, or a collection error stopped the run)",
    INTERNAL: "internal error (pytest's own, or a plugin's)",
    INPUT: "unusable input: a bad argument, setting, file or folder (one line says what is accepted)",
    NOTHING_TESTED: "nothing was tested: no test collected, every test skipped (-m sm90 with no SM90 GPU visible; "
    "--impl whose backends all skip), or a summary with no records (ci.time_budget, tools.summarise_cases); "
    "--allow-nothing-tested accepts it",
    INCOMPLETE: "no verdict: a server, GPU, toolkit or package index the command needs was not there or went away, "
    "or set-up could not install (fix that and rerun)",
}


def listed_codes(help_text: str) -> dict[int, str]:
    """The codes under "exit codes:" in a command's ``--help``, with what each means there."""
    block = help_text.split("exit codes:\n", 1)[1]
    return {int(m[1]): m[2] for m in re.finditer(r"^  (\d+)  (.*)$", block, re.M)}


def command_codes(module: str) -> dict[int, str]:
    """The exit codes ``python -m module --help`` lists (asked in this process), with their meanings."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        importlib.import_module(module).main(["--help"])
    return listed_codes(out.getvalue())


class InputError(Exception):
    """Unusable input; the message is one line: what was wrong, and what is accepted."""


class Incomplete(Exception):
    """The run could not reach a verdict (a server or GPU it needs); the message is one line."""


def epilog(codes: dict[int, str], more: str = "") -> str:
    """A ``--help`` epilog: ``more`` (if any), then each exit code the command returns and what it means (OK, and
    INPUT for a usage error, whether or not ``codes`` names them)."""
    usage = {OK: "ok", INPUT: "unusable input: a bad argument (one line says which)"}
    rows = "\n".join(f"  {code}  {meaning}" for code, meaning in sorted({**usage, **codes}.items()))
    return (more.rstrip() + "\n\n" if more else "") + "exit codes:\n" + rows


def positive(kind: type) -> Callable[[str], float]:
    """An argparse type: a finite number of ``kind`` above 0 (a bad one is the parser's one-line error, exit 4)."""

    def parse(text: str):
        value = kind(text)
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0")
        return value

    parse.__name__ = f"positive {kind.__name__}"
    return parse


def make_folder(path, option: str):
    """``path`` made (with its parents) and writable, else an InputError naming ``option``: a file there, a folder
    that cannot be made or written."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise InputError(
            f"{option} {path}: cannot make or write a folder there ({err.strerror or err}); give a folder this user can write"
        ) from None
    return path


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit INPUT) and whose ``--help`` lists the exit codes."""

    def __init__(self, name: str, *, codes: dict[int, str], more: str = "", **kw):
        super().__init__(
            prog=f"python -m {name}",
            epilog=epilog(codes, more),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kw,
        )

    def error(self, message):
        self.exit(INPUT, f"{self.prog}: {message} (see --help)\n")


def command(name: str):
    """Decorate a command's ``main(argv) -> int`` (``name``: its module, e.g. ``ci.compare_runs``): an InputError,
    an invalid ``MOE_*`` setting (fixtures.settings.SettingError) or an Incomplete becomes its one line on stderr and
    its exit code, for callers of ``main`` (tests, other commands) as for the shell."""
    from fixtures.settings import SettingError

    def decorate(main):
        @functools.wraps(main)
        def wrapped(argv=None) -> int:
            try:
                return main(argv)
            except (InputError, SettingError, Incomplete) as err:
                print(f"python -m {name}: " + " ".join(str(err).split()), file=sys.stderr)  # one line, always
                return INCOMPLETE if isinstance(err, Incomplete) else INPUT

        return wrapped

    return decorate


def script_help(script: str) -> str:
    """What ``bash ci/test.sh --help`` and ``bash ci/conformance.sh --help`` print before set-up: the script's codes
    (set-up's 4 and 6, then pytest's 0 to 5, this table's meanings); pytest's own help follows."""
    return epilog(
        EXIT_CODES,
        f"{script}: set-up (ci/setup.sh), then pytest with these arguments; pytest's help, the suite's options "
        "among them, follows after set-up. A set-up that fails stops with 4 or 6 before pytest; after it the code is "
        "pytest's.",
    )


if __name__ == "__main__":  # python3 ci/cli.py SCRIPT: the scripts' help header, standard library only
    print(script_help(sys.argv[1] if len(sys.argv) > 1 else "ci/test.sh"))
