"""What the exit code of every ``python -m ci.*`` command means, and how its input errors read.

One meaning per code, in every command: 0 ok; 1 the verdict is bad ("regression", "gate failed", "reproduced",
a phase failed); 2 incomparable or unusable input (a missing folder, a malformed file, a bad argument); 3 the run
could not reach a verdict (a server or GPU it needs was not there: fix that and rerun); 5 nothing was tested
(pytest's own 5 is "nothing collected"). A command documents the codes it returns in its ``--help``.
An input error is one line on stderr, what was wrong and what is accepted, with no traceback.
"""
from __future__ import annotations

import argparse
import functools
import sys

OK, VERDICT, INPUT, INCOMPLETE, NOTHING_TESTED = 0, 1, 2, 3, 5


class InputError(Exception):
    """Unusable input; the message is one line: what was wrong, and what is accepted."""


class Incomplete(Exception):
    """The run could not reach a verdict (a server or GPU it needs); the message is one line."""


def epilog(codes: dict[int, str], more: str = "") -> str:
    """A ``--help`` epilog: ``more`` (if any), then each exit code the command returns and what it means."""
    rows = "\n".join(f"  {code}  {meaning}" for code, meaning in sorted({OK: "ok", **codes}.items()))
    return (more.rstrip() + "\n\n" if more else "") + "exit codes:\n" + rows


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (exit INPUT) and whose ``--help`` lists the exit codes."""

    def __init__(self, name: str, *, codes: dict[int, str], more: str = "", **kw):
        super().__init__(prog=f"python -m {name}", epilog=epilog(codes, more),
                         formatter_class=argparse.RawDescriptionHelpFormatter, **kw)

    def error(self, message):
        self.exit(INPUT, f"{self.prog}: {message} (see --help)\n")


def command(name: str):
    """Decorate a command's ``main(argv) -> int`` (``name``: its module, e.g. ``ci.compare_runs``): an InputError or
    Incomplete becomes its one line on stderr and its exit code, for callers of ``main`` (tests, other commands)
    as for the shell."""
    def decorate(main):
        @functools.wraps(main)
        def wrapped(argv=None) -> int:
            try:
                return main(argv)
            except (InputError, Incomplete) as err:
                print(f"python -m {name}: " + " ".join(str(err).split()), file=sys.stderr)  # one line, always
                return INPUT if isinstance(err, InputError) else INCOMPLETE
        return wrapped
    return decorate
