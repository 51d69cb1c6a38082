"""The registered implementations of one arch, a line each, from their descriptors (for shell scripts).

    python -m ci.backends sm90
"""
from __future__ import annotations

import sys

from fixtures.selection import implementations_of

if __name__ == "__main__":
    print("\n".join(implementations_of([sys.argv[1] if len(sys.argv) > 1 else "sm90"])))
