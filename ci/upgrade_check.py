"""Check a FlashInfer upgrade as a user would: OLD and NEW each in their own environment, the same cases
on both, one verdict.

    python -m ci.upgrade_check 0.7.2.post1 0.7.4             # versions (or wheel paths) to install
    python -m ci.upgrade_check .venv-fi-0.7.2.post1 .venv    # existing environments (a folder with bin/python)
    python -m ci.upgrade_check ~/gpu-site-fi072 ~/gpu-site -- suites/conformance -k matches_reference
        # `pip --target` folders holding FlashInfer (an offline GPU host's bundles), pytest arguments after --

For each side it makes (or reuses) an environment (torch 2.13.0 first, then the suite's test extras, then
the FlashInfer spec), snapshots FlashInfer's MegaMoE API, and, where a GPU is present, runs the same
derandomized cases (the ci profile) of `-m ARCH` on the implementations both versions register, with a results
folder and a JUnit file each. It prints the API diff
(ci/api_diff.py) and, for GPU runs, ci/compare_runs.py's verdict. Exit: compare_runs's code on a GPU, else
0 when the API is unchanged and 1 when it changed (a changed API is for review, not necessarily a fault); 2 for an
OLD or NEW that names no version, wheel or environment (one line says what each may be).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ci import ROOT, api_diff, cli, compare_runs, pytest_argv
from fixtures import settings

VERSION = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")
SPECS = (
    "a FlashInfer version (0.7.4), a wheel (.whl), an environment (a folder with bin/python) or a "
    "`pip --target` folder holding flashinfer/"
)
CODES = {
    0: "no regression (GPU), or the same API (no GPU)",
    1: "a regression (GPU), or the API changed (no GPU: for review)",
    cli.INPUT: "unusable input: OLD or NEW names nothing installable, or the runs are incomparable",
}


@dataclass(frozen=True)
class Side:
    """One FlashInfer version to check: the python that runs it and what goes in front of its import path."""

    python: Path
    site: str = ""  # a `pip --target` folder with FlashInfer (the GPU bundle's overlays), or ""

    def env(self) -> dict:
        """This side's environment: its FlashInfer first on the path, the derandomized profile, and no shared
        DeepGEMM cubin folder (a TRTLLM_DG_CACHE_DIR of the caller's would hand one version's GEMMs to the other:
        fixtures/backends/flashinfer/deepgemm_cache.py gives each version its own)."""
        path = [p for p in (self.site, str(ROOT), os.environ.get("PYTHONPATH", "")) if p]
        env = {k: v for k, v in os.environ.items() if k != "TRTLLM_DG_CACHE_DIR"}
        return {**env, "PYTHONPATH": os.pathsep.join(path), settings.HYPOTHESIS_PROFILE.name: "ci"}


def check_spec(spec: str, which: str) -> None:
    """An InputError unless ``spec`` is something :func:`environment` can make a side of."""
    given = Path(spec).expanduser()
    if (given / "bin" / "python").exists() or (given / "flashinfer" / "__init__.py").exists():
        return
    if given.suffix == ".whl" and given.is_file() or given.suffix != ".whl" and VERSION.fullmatch(spec):
        return
    what = (
        "a folder with neither bin/python nor flashinfer/"
        if given.is_dir()
        else "no wheel there"
        if given.suffix == ".whl"
        else "not a version, and no such folder"
    )
    raise cli.InputError(f"{which} {spec!r}: {what}; give {SPECS}")


def environment(spec: str, workdir: Path) -> Side:
    """The side for FlashInfer ``spec``: a version or a wheel (installed into a venv of its own), an existing venv
    (a folder with bin/python), or a `pip --target` folder holding FlashInfer (run by this python, in front)."""
    given = Path(spec).expanduser()
    if (given / "bin" / "python").exists():
        return Side(given / "bin" / "python")
    if (given / "flashinfer" / "__init__.py").exists():
        return Side(Path(sys.executable), str(given))
    name = given.name if given.suffix == ".whl" else spec
    venv = workdir / f"venv-{name}"
    python = venv / "bin" / "python"
    if not (venv / ".moe-installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pins = venv / "constraints.txt"  # CI's exact versions (ci/constraints.txt) but FlashInfer's, given here
        pins.write_text(
            "".join(
                line
                for line in (ROOT / "ci" / "constraints.txt").read_text().splitlines(True)
                if not line.startswith("flashinfer-python==")
            )
        )
        pip = [str(python), "-m", "pip", "install", "-q", "-c", str(pins)]
        subprocess.run(pip + ["torch"], check=True)
        package = str(given) if given.suffix == ".whl" else f"flashinfer-python=={spec}"
        subprocess.run(pip + ["-e", f"{ROOT}[test]", package], check=True)
        (venv / ".moe-installed").touch()
    return Side(python)


def _output(side: Side, *module_args: str) -> str:
    return subprocess.run(
        [str(side.python), "-m", *module_args], cwd=ROOT, env=side.env(), capture_output=True, text=True, check=True
    ).stdout


def snapshot(side: Side) -> dict:
    out = _output(side, "tools.snapshot_flashinfer_api")
    return json.loads(out[out.index("{") :])


def has_gpu(side: Side) -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([str(side.python), "-c", probe], env=side.env()).returncode == 0


def common_specs(sides: list[Side], arch: str) -> list[str]:
    """The implementations of ``arch`` that every side registers (an upgrade's new kernels have no OLD to compare
    with), in NEW's order."""
    listed = [_output(side, "ci.backends", arch).split() for side in sides]
    return [spec for spec in listed[-1] if all(spec in names for names in listed)]


def run_cases(side: Side, arch: str, specs: list[str], results: Path, pytest_args: list[str]) -> int:
    """The same derandomized cases on one side (the ci profile): `-m ARCH` on the specs both sides have. The
    results folder starts empty: records append, and an earlier check's would be compared as this one's."""
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir(parents=True)
    started = time.monotonic()
    code = subprocess.run(
        [
            *pytest_argv(side.python),
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            arch,
            "--impl",
            ",".join(specs),
            "--results-dir",
            str(results),
            "--junitxml",
            str(results / "junit.xml"),
            *pytest_args,
        ],
        cwd=ROOT,
        env=side.env(),
    ).returncode
    print(f"pytest exit {code} after {time.monotonic() - started:.0f} s", flush=True)
    return code


@cli.command("ci.upgrade_check")
def main(argv=None) -> int:
    from fixtures.arch import ARCH_MARKERS

    p = cli.Parser(
        "ci.upgrade_check",
        description=__doc__.splitlines()[0],
        codes=CODES,
        more="after --: pytest arguments for both sides' runs",
    )
    p.add_argument("old", help=SPECS)
    p.add_argument("new", help="as OLD")
    p.add_argument(
        "--arch", default="sm90", choices=sorted(ARCH_MARKERS), help="the arch marker whose cases run on a GPU"
    )
    p.add_argument("--workdir", type=Path, default=ROOT / "results" / "upgrade")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: pytest arguments for both sides' runs
    a, extra = p.parse_args(argv[:cut]), argv[cut + 1 :]
    check_spec(a.old, "OLD")
    check_spec(a.new, "NEW")
    cli.make_folder(a.workdir, "--workdir")
    sides = {name: environment(spec, a.workdir) for name, spec in (("old", a.old), ("new", a.new))}
    snaps = {name: snapshot(side) for name, side in sides.items()}
    lines = api_diff.diff(snaps["old"], snaps["new"])
    print(
        f"API: flashinfer-python {snaps['old']['flashinfer_version']} -> {snaps['new']['flashinfer_version']}: "
        f"{len(lines)} difference(s)"
    )
    print("\n".join(lines))
    if not all(has_gpu(side) for side in sides.values()):
        print("no GPU: the API comparison only (run it on a GPU host for the cases)")
        return 1 if lines else 0
    specs = common_specs(list(sides.values()), a.arch)
    print(f"the {len(specs)} {a.arch} implementations both versions register: {', '.join(specs)}", flush=True)
    folders = {name: a.workdir / f"results-{name}" for name in sides}
    for name, side in sides.items():
        print(f"{name}: flashinfer-python {snaps[name]['flashinfer_version']}", flush=True)
        run_cases(side, a.arch, specs, folders[name], extra)
        (folders[name] / "api.json").write_text(json.dumps(snaps[name]))
    return compare_runs.main([str(folders["old"]), str(folders["new"])])


if __name__ == "__main__":
    sys.exit(main())
