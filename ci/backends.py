"""The names --impl takes: the registered implementations of the arches named, a line each, from their
descriptors (for people and for shell scripts).

    python -m ci.backends            # every registered name
    python -m ci.backends sm90       # those of one arch (several may be named)
"""

from __future__ import annotations

import sys

from ci import cli

MORE = """--impl also takes:
  all                  every name listed here (the meta-suite's faulty:* copies aside)
  reference-ep         the pure-PyTorch reference, on the CPU
  reference-ep[RECIPE] the reference computing a backend's recipe, e.g. reference-ep[sm90_push_fp8]
  pkg.module:factory   your own implementation (README: testing your own kernel)
  several, comma-separated (--impl a,b)"""


@cli.command("ci.backends")
def main(argv=None) -> int:
    from fixtures.arch import ARCH_MARKERS
    from fixtures.core.selection import product_names, implementations_of

    known = sorted(ARCH_MARKERS, key=lambda tag: int(tag[2:]))
    p = cli.Parser(
        "ci.backends",
        description=__doc__.split("\n\n")[0],
        more=MORE,
        codes={cli.INPUT: "unknown arch (the message lists the known ones)"},
    )
    p.add_argument("arch", nargs="*", help=f"one of {', '.join(known)}, or all (the default)")
    a = p.parse_args(argv)
    unknown = [tag for tag in a.arch if tag not in (*known, "all")]
    if unknown:
        raise cli.InputError(f"unknown arch {', '.join(unknown)}; known arches: {', '.join(known)}, or all")
    names = product_names() if not a.arch or "all" in a.arch else implementations_of(a.arch)
    print("\n".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
