"""A readable diff of two FlashInfer MegaMoE API snapshots (tools/snapshot_flashinfer_api.py), and the pinned
snapshot nearest to an unpinned version.

    python -m ci.api_diff OLD.json NEW.json     # exit 0: same surface, 1: changed, 4: not two snapshots

Reports, section by section: kernels, aliases, exports and error classes added or removed; per config
class, fields added, removed, and changed (default, init); signatures changed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ci import cli

SNAPSHOT_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "backends" / "flashinfer"


def _version_key(version: str) -> tuple:
    """0.7.2.post1 < 0.7.4 < 0.8.0rc1 < 0.8.0, well enough for picking the nearest pin."""
    nums = [int(n) for n in re.findall(r"\d+", version.split("rc")[0].split(".post")[0])[:3]]
    post = int(version.split(".post")[1]) if ".post" in version else 0
    rc = -1 if "rc" in version else 0
    return (*nums, rc, post)


def pinned_versions(directory: Path = SNAPSHOT_DIR) -> list[str]:
    return sorted((p.stem[len("api-") :] for p in directory.glob("api-*.json")), key=_version_key)


def nearest_pinned(version: str, directory: Path = SNAPSHOT_DIR) -> str | None:
    """The newest pinned version not newer than ``version``, else the oldest pinned one."""
    pins = pinned_versions(directory)
    older = [v for v in pins if _version_key(v) <= _version_key(version)]
    return older[-1] if older else (pins[0] if pins else None)


def _set_diff(label: str, old, new) -> list[str]:
    old, new = set(old), set(new)
    lines = [f"{label} added: {name}" for name in sorted(new - old)]
    return lines + [f"{label} removed: {name}" for name in sorted(old - new)]


def _dict_diff(label: str, old: dict, new: dict) -> list[str]:
    lines = _set_diff(label, old, new)
    return lines + [
        f"{label} changed: {k}: {old[k]!r} -> {new[k]!r}" for k in sorted(set(old) & set(new)) if old[k] != new[k]
    ]


def _config_diff(name: str, old: dict, new: dict) -> list[str]:
    lines = []
    fields_old = {f[0]: f[1:] for f in old["fields"]}
    fields_new = {f[0]: f[1:] for f in new["fields"]}
    lines += [f"{name}: field added: {f} (default {fields_new[f][0]!r})" for f in fields_new if f not in fields_old]
    lines += [f"{name}: field removed: {f}" for f in fields_old if f not in fields_new]
    for f in sorted(fields_old.keys() & fields_new.keys()):
        (d0, i0), (d1, i1) = fields_old[f], fields_new[f]
        if d0 != d1:
            lines.append(f"{name}: default changed: {f}: {d0!r} -> {d1!r}")
        if i0 != i1:
            lines.append(f"{name}: init changed: {f}: {i0} -> {i1}")
    for key in ("kernel_name", "frozen"):
        if old.get(key) != new.get(key):
            lines.append(f"{name}: {key} changed: {old.get(key)!r} -> {new.get(key)!r}")
    return lines


def diff(old: dict, new: dict) -> list[str]:
    """One line per difference, grouped by section; empty when the surfaces agree."""
    lines = _set_diff("kernel", old["mega_kernels"], new["mega_kernels"])
    lines += _dict_diff("deprecated alias", old["deprecated_kernel_aliases"], new["deprecated_kernel_aliases"])
    lines += _set_diff("export", old["exports"], new["exports"])
    lines += _dict_diff("error class", old["errors"], new["errors"])
    lines += _dict_diff("deprecated config class", old["deprecated_config_classes"], new["deprecated_config_classes"])
    configs_old, configs_new = old["kernel_configs"], new["kernel_configs"]
    lines += _set_diff("config class", configs_old, configs_new)
    for name in sorted(configs_old.keys() & configs_new.keys()):
        lines += _config_diff(name, configs_old[name], configs_new[name])
    lines += _dict_diff("signature", old["signatures"], new["signatures"])
    # flashinfer.megamoe (a package of its own since 0.7.4; absent from older pins)
    mm_old, mm_new = old.get("megamoe") or {}, new.get("megamoe") or {}
    lines += _set_diff("megamoe export", mm_old.get("exports", ()), mm_new.get("exports", ()))
    lines += _dict_diff("megamoe signature", mm_old.get("signatures", {}), mm_new.get("signatures", {}))
    lines += _dict_diff("megamoe plan fields", mm_old.get("plan_fields", {}), mm_new.get("plan_fields", {}))
    lines += _dict_diff("megamoe constant", mm_old.get("constants", {}), mm_new.get("constants", {}))
    return lines


SECTIONS = (
    "flashinfer_version",
    "mega_kernels",
    "deprecated_kernel_aliases",
    "exports",
    "errors",
    "deprecated_config_classes",
    "kernel_configs",
    "signatures",
)


def read_snapshot(path: str) -> dict:
    """A snapshot file, or an InputError saying why it is not one."""
    accepted = "give two JSON files written by python -m tools.snapshot_flashinfer_api (fixtures/backends/flashinfer/api-*.json)"
    try:
        snap = json.loads(Path(path).read_text())
    except OSError as err:
        raise cli.InputError(f"cannot read {path} ({err.strerror}); {accepted}") from None
    except ValueError as err:
        raise cli.InputError(f"{path} is not JSON ({err}); {accepted}") from None
    missing = [k for k in SECTIONS if k not in snap] if isinstance(snap, dict) else list(SECTIONS)
    if missing:
        raise cli.InputError(f"{path} is not an API snapshot (no {', '.join(missing)}); {accepted}")
    shapeless = [k for k in SECTIONS[1:] if not isinstance(snap[k], (list, dict))]
    if shapeless:
        raise cli.InputError(
            f"{path} is not an API snapshot ({', '.join(shapeless)}: not a list or mapping); {accepted}"
        )
    return snap


@cli.command("ci.api_diff")
def main(argv=None) -> int:
    p = cli.Parser(
        "ci.api_diff",
        description="diff two FlashInfer API snapshots",
        codes={
            0: "the same API surface",
            1: "the API changed",
            cli.INPUT: "unusable input: a file missing, not JSON, or not a snapshot",
        },
    )
    p.add_argument("old")
    p.add_argument("new")
    a = p.parse_args(argv)
    old, new = read_snapshot(a.old), read_snapshot(a.new)
    lines = diff(old, new)
    print(f"{old['flashinfer_version']} -> {new['flashinfer_version']}: {len(lines)} difference(s)")
    print("\n".join(lines))
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
