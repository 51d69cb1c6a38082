"""How many pytest-xdist workers ``bash ci/test.sh`` spreads a run over; prints the number (0: one pytest process).

    python -m ci.workers      # MOE_WORKERS (default 0: one process); ci/test.sh asks it when that is set

``MOE_WORKERS=auto`` sizes it by the host: no GPU or no pytest-xdist, one process; on a GPU host, one worker per
``CORES_PER_WORKER`` cores and per ``GIB_PER_WORKER`` free on the emptiest GPU, at most ``MOST``, and one process
where that makes fewer than two. Each worker takes whole implementations (conftest.py). It is not the default:
three workers on one H200 filled its memory, saved no time, and failed cases that one process passes
(reference.evidence.SESSION14).
"""
from __future__ import annotations

import importlib.util
import os
import sys

from ci import cli

CORES_PER_WORKER = 4  # a worker's compile (one core), its checks' threads and its pool's idle ranks
# A worker's EP8 pool (8 ranks at about 3.5 GiB each) and its oracle cache (MOE_ORACLE_CACHE_GB, 8), with room
# for a pool started ahead: reference.evidence.RUN1 measured the ranks.
GIB_PER_WORKER = 40
MOST = 4


def sized(cores: int, free_gib: float) -> int:
    """Workers for a GPU host with ``cores`` cores and ``free_gib`` free on its emptiest GPU."""
    n = min(MOST, cores // CORES_PER_WORKER, int(free_gib // GIB_PER_WORKER))
    return n if n >= 2 else 0


def host() -> tuple[int, float] | None:
    """(cores, GiB free on the emptiest visible GPU), or None without a GPU or pytest-xdist."""
    if importlib.util.find_spec("xdist") is None:
        return None
    import torch

    if not torch.cuda.is_available() or not torch.cuda.device_count():
        return None
    free = min(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
    return os.cpu_count() or 1, free / 2**30


@cli.command("ci.workers")
def main(argv=None) -> int:
    from fixtures import settings

    p = cli.Parser("ci.workers", description=__doc__.split("\n\n")[0], more=__doc__.split("\n\n", 2)[2],
                   codes={2: f"{settings.WORKERS.name} is invalid (the message says what it accepts)"})
    p.parse_args(argv)
    try:
        asked = settings.WORKERS.get()
    except settings.SettingError as err:
        raise cli.InputError(str(err)) from None
    if asked == "auto":
        found = host()
        asked = sized(*found) if found else 0
    print(asked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
