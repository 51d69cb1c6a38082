"""Write (or diff) a snapshot of FlashInfer's public MegaMoE surface.

    python -m tools.snapshot_flashinfer_api            # print the JSON for the installed flashinfer-python
    python -m tools.snapshot_flashinfer_api --write    # update fixtures/backends/flashinfer/api-<version>.json

The snapshot is what suites/flashinfer/test_api_surface.py pins: registry names and deprecated aliases,
each kernel config's fields (name, default, init, frozen), exported names, error class hierarchy and
selected signatures. Run it after a FlashInfer upgrade and review the diff.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import inspect
import json
from pathlib import Path

from ci import cli

SNAPSHOT_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "backends" / "flashinfer"
SIGNATURES = (
    "MoEEpLayer",
    "BootstrapConfig",
    "FleetParams",
    "MegaConfig",
    "MoEEpTensors",
    "validate_mega_fleet_params",
    "validate_mega_forward_inputs",
    "dummy_moe_weights",
)


def _default(field) -> object:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = f"<factory {getattr(field.default_factory, '__name__', field.default_factory)}>"
    else:
        return "<required>"
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def snapshot() -> dict:
    import flashinfer.moe_ep as fi
    from flashinfer.moe_ep.core.kernel import registry

    configs = {}
    for name in sorted(n for n in dir(fi) if n.endswith("_MegaMoeConfig")):
        cls = getattr(fi, name)
        if cls.__name__ != name:
            continue
        params = getattr(cls, "__dataclass_params__", None)
        configs[name] = {
            "kernel_name": next((f.default for f in dataclasses.fields(cls) if f.name == "kernel_name"), None),
            "frozen": bool(params and params.frozen),
            "fields": [[f.name, _default(f), f.init] for f in dataclasses.fields(cls)],
        }
    deprecated_configs = {
        n: getattr(fi, n).__name__
        for n in sorted(dir(fi))
        if n.endswith("MegaMoeConfig") and isinstance(getattr(fi, n), type) and getattr(fi, n).__name__ != n
    }
    return {
        "flashinfer_version": md.version("flashinfer-python"),
        "mega_kernels": sorted(registry._available_mega_kernels()),
        "deprecated_kernel_aliases": dict(sorted(registry._MEGA_KERNEL_DEPRECATED_ALIASES.items())),
        "kernel_configs": configs,
        "deprecated_config_classes": deprecated_configs,
        "exports": sorted(fi.__all__),
        "errors": {
            n: [c.__name__ for c in getattr(fi, n).__mro__[1:3]] for n in ("MoEEpConfigError", "MoEEpArchError")
        },
        "signatures": {n: str(inspect.signature(getattr(fi, n))) for n in SIGNATURES},
        "megamoe": megamoe_surface(),
    }


def megamoe_surface() -> dict:
    """flashinfer.megamoe's public surface (the package apart from moe_ep, 0.7.4 on): exports, the signatures of its
    functions and of MegaMoESymmBuffer's methods, the plan records' fields, its constants; {} where it is absent."""
    try:
        import flashinfer.megamoe as mm
    except ImportError:
        return {}
    exported = {n: getattr(mm, n) for n in mm.__all__}
    signatures = {n: str(inspect.signature(f)) for n, f in exported.items() if callable(f) and not isinstance(f, type)}
    buffer = mm.MegaMoESymmBuffer
    signatures.update(
        {
            f"MegaMoESymmBuffer.{m}": str(inspect.signature(getattr(buffer, m)))
            for m in ("__init__", "stage", "commit_staged", "prewarm", "destroy")
        }
    )
    return {
        "exports": sorted(mm.__all__),
        "signatures": dict(sorted(signatures.items())),
        "plan_fields": {
            n: [f.name for f in dataclasses.fields(c)]
            for n, c in sorted(exported.items())
            if dataclasses.is_dataclass(c)
        },
        "constants": {n: v for n, v in sorted(exported.items()) if isinstance(v, (bool, int, float, str))},
    }


def snapshot_path(version: str) -> Path:
    return SNAPSHOT_DIR / f"api-{version}.json"


@cli.command("tools.snapshot_flashinfer_api")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.snapshot_flashinfer_api",
        description="snapshot FlashInfer's MegaMoE API",
        codes={cli.INCOMPLETE: "no importable FlashInfer with flashinfer.moe_ep here to snapshot"},
    )
    p.add_argument("--write", action="store_true")
    a = p.parse_args(argv)
    try:
        snap = snapshot()
    except ImportError as err:
        raise cli.Incomplete(
            f"cannot import FlashInfer's MegaMoE API here ({err}); run it where flashinfer-python is installed"
        ) from None
    text = json.dumps(snap, indent=1, sort_keys=True) + "\n"
    if a.write:
        snapshot_path(snap["flashinfer_version"]).write_text(text)
        print(f"wrote {snapshot_path(snap['flashinfer_version'])}")
    else:
        print(text)
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
