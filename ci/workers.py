"""How many pytest-xdist workers a run of the suite gets on this host; prints the number (0: one pytest process).

    python -m ci.workers      # MOE_WORKERS (default auto), decided as the suite's plugin decides it

The rules (the host's GPU and cores, MOE_WORKERS, a run that a test starts) are fixtures.scheduling.spread's: the plugin
applies them to ``python -m pytest`` and ``bash ci/test.sh`` alike; this command only shows the number.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from ci import cli
from fixtures.scheduling import spread


@cli.command("ci.workers")
def main(argv=None) -> int:
    from fixtures import settings

    p = cli.Parser(
        "ci.workers",
        description=__doc__.split("\n\n")[0],
        more=__doc__.split("\n\n", 2)[2],
        codes={cli.INPUT: f"{settings.WORKERS.name} is invalid (the message says what it accepts)"},
    )
    p.parse_args(argv)
    try:  # the plugin's decision for a command with no options of its own
        chosen = spread.layout(argparse.Namespace(), importlib.util.find_spec("xdist") is not None)
    except settings.SettingError as err:
        raise cli.InputError(str(err)) from None
    print(chosen.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
