"""How many pytest-xdist workers ``bash ci/test.sh`` spreads a run over; prints the number (0: one pytest process).

    python -m ci.workers      # MOE_WORKERS (default auto); ci/test.sh asks it unless that is 0

``MOE_WORKERS=auto``, the default, decides by the host:
- a host with a GPU and ``GPU_CORES`` cores: three workers. The tests on rank pools at EP1 run on one, those at the
  larger EP sizes on another, each in the order one process runs them with its pools started ahead and warmed
  (fixtures.pool_order.pool_group); the tests that need no pool (in-process GPU tests: 200 s of H200 run 22) run on
  the third meanwhile. One worker for every pool test took 651 s of that run's 723 (reference.evidence.SESSION19).
  Where the model layers run at an EP size above 1 (``MOE_MODEL_EP``, the nightly profile) every rank-pool test stays
  on one worker, and the third worker has nothing to run.
  Pools spread by implementation over three workers filled one H200's memory, hung two of them and failed cases
  that one process passes (reference.evidence.SESSION14): the EP1 pools, whose model-geometry ranks hold up to
  37 GB, stay in one process.
- a host without pytest-xdist, or a GPU host with fewer cores: one process.
- a host without a GPU: one worker per core it may use, at most ``CPU_MOST``. Its run is Python processes starting
  and computing, and one process keeps about one core busy: on 2 cores two workers took the CPU tier to about half
  one process's time (reference.evidence.SESSION16).
- a run that a test starts (a nightly, a faulty phase, a results-folder check): one process. It inherits the test's
  PYTEST_CURRENT_TEST (and a worker's PYTEST_XDIST_WORKER), and more workers would only compete with the run's own.
``MOE_WORKERS=N`` asks for N workers on any host, except inside a test.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

from ci import cli
from fixtures.pool_order import SPREAD_GROUPS

# Measured on 2 cores only (reference.evidence.SESSION16): more workers on a larger CPU machine are unmeasured, and
# each worker pays its own start-up and collection.
CPU_MOST = 2
GPU_CORES = 8  # a GPU host's pools start ahead with 8 cores (fixtures.dist.pool.PREFETCH_CORES); its workers need them
GPU_WORKERS = len(SPREAD_GROUPS) + 1  # EP1 pools, larger EP sizes' pools, tests without a pool (gpu_host_group)


def sized(cores: int, gpu: bool) -> int:
    """Workers for ``auto`` on a host with ``cores`` cores, with or without a GPU (0: one process)."""
    if gpu:
        return GPU_WORKERS if cores >= GPU_CORES else 0
    if cores < 2:
        return 0
    return min(CPU_MOST, cores)


def has_gpu() -> bool:
    """Whether the CUDA driver sees a GPU here, asked without importing torch (2 s a process). Where the driver
    library does not load, a GPU the kernel driver lists still counts: workers on a GPU host are the risk."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        listed = "/proc/driver/nvidia/gpus"
        return os.path.isdir(listed) and bool(os.listdir(listed))
    count = ctypes.c_int(0)
    return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container or taskset may allow fewer than the host has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def decide(asked, environ=os.environ) -> int:
    """The number of workers for the setting's value ``asked`` (``auto`` or an integer)."""
    if "PYTEST_CURRENT_TEST" in environ or "PYTEST_XDIST_WORKER" in environ:  # started by a test
        return 0
    if asked != "auto":
        return asked
    if importlib.util.find_spec("xdist") is None:
        return 0
    return sized(usable_cores(), has_gpu())


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
    print(decide(asked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
