"""Build, once per host, the FlashInfer JIT modules that registered kernels need besides their own kernel
(descriptor ``jit_prerequisites``; finding F13), so their tests run instead of skipping.

    python -m tools.prebuild_jit [--arch sm90] [--list]

Ninja runs with MAX_JOBS parallel compiles (default: the CPU count). fused_moe_90 is 242 nvcc objects: tens of
minutes on 16 cores. Afterwards ``bash evidence/gpu_host/gpu_validate.sh jit`` packs the cache for the next host.
"""

from __future__ import annotations

import os
import time

from ci import cli
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.backends.flashinfer.prerequisites import is_built, jit_spec


@cli.command("tools.prebuild_jit")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.prebuild_jit",
        description=__doc__.splitlines()[0],
        codes={
            cli.INPUT: "an unknown --arch",
            cli.INCOMPLETE: "FlashInfer cannot locate its modules on this machine (no GPU or toolkit)",
        },
    )
    p.add_argument("--arch", default="sm90", choices=sorted({d.arch for d in DESCRIPTORS}))
    p.add_argument("--list", action="store_true", help="say what is needed and whether it is built; build nothing")
    a = p.parse_args(argv)
    needed = {}
    for d in DESCRIPTORS:
        if d.arch == a.arch:
            for name in d.jit_prerequisites:
                needed.setdefault(name, []).append(d.impl_name)
    for name, users in needed.items():
        try:
            built = is_built(name)
        except Exception as err:  # noqa: BLE001 (no GPU here, say)
            print(f"{name}: FlashInfer cannot locate it on this machine ({type(err).__name__}: {err})")
            return cli.INCOMPLETE
        print(f"{name}: {'built' if built else 'not built'} (needed by {', '.join(users)})", flush=True)
        if built or a.list:
            continue
        os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
        started = time.monotonic()
        jit_spec(name).build_and_load()
        print(f"{name}: built in {time.monotonic() - started:.0f} s with MAX_JOBS={os.environ['MAX_JOBS']}", flush=True)
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
