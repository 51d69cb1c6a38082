"""Check a FlashInfer upgrade as a user would: OLD and NEW each in their own environment, the same cases
on both, one verdict.

    python -m ci.upgrade_check 0.7.2.post1 0.7.4             # versions (or wheel paths) to install
    python -m ci.upgrade_check .venv-fi-0.7.2.post1 .venv    # existing environments (a folder with bin/python)

For each side it makes (or reuses) an environment (torch 2.13.0 first, then the suite's test extras, then
the FlashInfer spec), snapshots FlashInfer's MegaMoE API, and, where a GPU is present, runs the same
derandomized cases (the ci profile) of `-m ARCH` with a results folder. It prints the API diff
(ci/api_diff.py) and, for GPU runs, ci/compare_runs.py's verdict. Exit: compare_runs's code on a GPU, else
0 when the API is unchanged and 1 when it changed (a changed API is for review, not necessarily a fault).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ci import ROOT, api_diff, compare_runs, pytest_argv


def environment(spec: str, workdir: Path) -> Path:
    """The python of an environment with FlashInfer ``spec`` (a version, a wheel path or an existing venv)."""
    given = Path(spec)
    if (given / "bin" / "python").exists():
        return given / "bin" / "python"
    name = given.name if given.suffix == ".whl" else spec
    venv = workdir / f"venv-{name}"
    python = venv / "bin" / "python"
    if not (venv / ".moe-installed").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run(pip + ["torch==2.13.0"], check=True)
        package = str(given) if given.suffix == ".whl" else f"flashinfer-python=={spec}"
        subprocess.run(pip + ["-e", f"{ROOT}[test]", package], check=True)
        (venv / ".moe-installed").touch()
    return python


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MOE_HYPOTHESIS_PROFILE": "ci"}


def snapshot(python: Path) -> dict:
    out = subprocess.run([str(python), "-m", "ci.snapshot_flashinfer_api"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("{"):])


def has_gpu(python: Path) -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([str(python), "-c", probe], env=_env()).returncode == 0


def run_cases(python: Path, arch: str, results: Path) -> None:
    subprocess.run([*pytest_argv(python), "-q", "-p", "no:cacheprovider", "-m", arch, "--results-dir", str(results)],
                   cwd=ROOT, env=_env())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--arch", default="sm90", help="the arch marker whose cases run on a GPU")
    p.add_argument("--workdir", type=Path, default=ROOT / "results" / "upgrade")
    a = p.parse_args(argv)
    a.workdir.mkdir(parents=True, exist_ok=True)
    pythons = {side: environment(spec, a.workdir) for side, spec in (("old", a.old), ("new", a.new))}
    snaps = {side: snapshot(py) for side, py in pythons.items()}
    lines = api_diff.diff(snaps["old"], snaps["new"])
    print(f"API: flashinfer-python {snaps['old']['flashinfer_version']} -> {snaps['new']['flashinfer_version']}: "
          f"{len(lines)} difference(s)")
    print("\n".join(lines))
    if not all(has_gpu(py) for py in pythons.values()):
        print("no GPU: the API comparison only (run it on a GPU host for the cases)")
        return 1 if lines else 0
    folders = {side: a.workdir / f"results-{side}" for side in pythons}
    for side, py in pythons.items():
        run_cases(py, a.arch, folders[side])
    return compare_runs.main([str(folders["old"]), str(folders["new"])])


if __name__ == "__main__":
    sys.exit(main())
