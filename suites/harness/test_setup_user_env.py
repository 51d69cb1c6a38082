"""ci/setup.sh with the active Python: where that Python has torch, its torch and FlashInfer are tested as installed
and only the missing requirements of the [test] extra are added (ci/active_python.py), never torch or FlashInfer;
without torch, or with MOE_USE_VENV=1, the suite's own .venv; ~/gpu-env.sh's python3 second to an active environment
of the user's own. And the session header: where the torch and FlashInfer under test are loaded from
(fixtures/plugin/environment_report.py).

Each test builds a throwaway venv offline in a few seconds (fakes as installed metadata, a stub pip); ci/setup.sh
itself runs for real, from a copy of its inputs."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ci import cli

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "ci" / "constraints.txt"
SETUP_INPUTS = ("ci/setup.sh", "ci/active_python.py", "ci/cli.py", "ci/constraints.txt", "pyproject.toml")
USER_TORCH = "2.11.0+cu130"  # the H200's serving-like environment's (reference.evidence.NIGHTLY_GREEN)


def ci_pins() -> dict[str, str]:
    """ci/constraints.txt's ``name==version`` lines by canonical name."""
    found = {}
    for line in CONSTRAINTS.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line.split("#")[0].strip())
        if match:
            found[canonicalize_name(match[1])] = match[2]
    return found


def _fake_installed(site: Path, name: str, version: str) -> None:
    info = site / f"{canonicalize_name(name).replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")


def _link_installed(name: str, site: Path) -> None:
    """This environment's distribution ``name`` (its top-level files and dist-info) linked into ``site``."""
    dist = md.distribution(name)
    for top in {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
        if not (site / top).exists():
            (site / top).symlink_to(Path(dist.locate_file(top)))


# ---------------------------------------------------------------- ci/setup.sh in a user's environment
# A throwaway venv standing in for a vLLM or SGLang environment: a fake torch 2.11.0+cu130, a FlashInfer (an
# editable install of a checkout folder, none, or one whose import fails), the [test] extra's requirements as
# metadata (two of them missing), packaging linked in, and a stub ``pip`` module that records each call (its
# arguments and the constraint file it was given) and "installs" what it was asked for as metadata. ci/setup.sh runs
# from a copy of its inputs with that venv's python3 first on PATH, offline (PIP_NO_INDEX), with MOE_VENV a stub
# environment whose marker is current: a wrong turn into the .venv path prints that stub instead of the user's python.
STUB_PIP = """import json, os, re, sys
args = sys.argv[1:]
keep = args[args.index("-c") + 1] if "-c" in args else None
with open(os.environ["STUB_PIP_LOG"], "a") as log:
    log.write(json.dumps({"argv": args, "constraints": open(keep).read() if keep else None}) + "\\n")
site = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for arg in args[1:] if args[:1] == ["install"] else ():
    if arg.startswith("-") or arg == keep:
        continue
    name = re.split(r"[<>=!~;\\[ ]", arg)[0]
    info = os.path.join(site, name.replace("-", "_") + "-1.0.dist-info")
    os.makedirs(info, exist_ok=True)
    open(os.path.join(info, "METADATA"), "w").write(f"Metadata-Version: 2.1\\nName: {name}\\nVersion: 1.0\\n")
"""
MISSING = ("scipy", "pytest-timeout")  # the [test] requirements the user's environment lacks


def _test_extra() -> list[Requirement]:
    lines = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["test"]
    return [r for r in map(Requirement, lines) if r.marker is None or r.marker.evaluate()]


def _site(python: Path) -> Path:
    return Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )


def user_environment(where: Path, torch: bool = True, flashinfer: str = "editable") -> Path:
    """The throwaway environment described above; flashinfer: editable, none or broken. Its python3."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / "bin" / "python3"
    site = _site(python)
    _link_installed("packaging", site)
    (site / "pip").mkdir()
    (site / "pip" / "__init__.py").write_text("")
    (site / "pip" / "__main__.py").write_text(STUB_PIP)
    if torch:
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(f"__version__ = {USER_TORCH!r}\n")
        _fake_installed(site, "torch", USER_TORCH)
    if flashinfer != "none":
        checkout = where.parent / f"{where.name}-flashinfer"
        (checkout / "flashinfer").mkdir(parents=True)
        body = "raise ImportError('libcuda.so.1: cannot open shared object file')" if flashinfer == "broken" else ""
        (checkout / "flashinfer" / "__init__.py").write_text(f"__version__ = '0.7.4'\n{body}\n")
        (site / "flashinfer-checkout.pth").write_text(f"{checkout}\n")
        _fake_installed(site, "flashinfer-python", "0.7.4")
        info = site / "flashinfer_python-0.7.4.dist-info"
        (info / "direct_url.json").write_text(json.dumps({"url": checkout.as_uri(), "dir_info": {"editable": True}}))
    for req in _test_extra():
        if req.name not in MISSING:
            _fake_installed(site, req.name, ci_pins()[canonicalize_name(req.name)])
    return python


def installed_versions(python: Path) -> dict[str, str]:
    probe = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    return json.loads(
        subprocess.run(
            [str(python), "-c", probe], cwd="/", env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )


@pytest.fixture
def setup_in(tmp_path):
    """run(env_python=..., **variables) -> (CompletedProcess, pip calls): ci/setup.sh as described above."""
    root = tmp_path / "checkout"
    (root / "ci").mkdir(parents=True)
    for name in SETUP_INPUTS:
        shutil.copy(ROOT / name, root / name)
    stub = tmp_path / "stub-venv"
    (stub / "bin").mkdir(parents=True)
    (stub / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (stub / "bin" / "python").chmod(0o755)
    (stub / ".moe-installed").touch()
    os.utime(stub / ".moe-installed", (time.time() + 3600,) * 2)
    (tmp_path / "home").mkdir()
    log = tmp_path / "pip.log"

    def run(env_python: Path, **variables: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
        log.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "MOE_", "VIRTUAL_ENV"))}
        env.update(
            HOME=str(tmp_path / "home"),
            PATH=f"{env_python.parent}:{os.environ['PATH']}",
            STUB_PIP_LOG=str(log),
            PIP_NO_INDEX="1",
            PIP_CONFIG_FILE=os.devnull,
            PYTHONNOUSERSITE="1",
            MOE_VENV=str(stub),
        )
        env.update(variables)
        done = subprocess.run(
            ["bash", str(root / "ci" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60
        )
        return done, [json.loads(line) for line in log.read_text().splitlines()]

    run.stub = stub / "bin" / "python"
    run.root = root
    return run


def _pinned(constraints: str) -> dict[str, str]:
    found = {}
    for line in constraints.splitlines():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)\s*(==|<)\s*(\S+)", line.strip())
        if match:
            found[canonicalize_name(match[1])] = match[2] + match[3]
    return found


@pytest.mark.parametrize("flashinfer", ["editable", "none", "broken"])
def test_setup_tests_the_active_environment_adding_only_its_missing_test_tools(setup_in, tmp_path, flashinfer):
    """The python3 on PATH has torch: setup prints it, installs the two missing [test] requirements at CI's pins
    and nothing else, with torch and flashinfer-python pinned at what is installed (or forbidden where absent);
    a FlashInfer that is absent or does not import is reported, never installed."""
    python = user_environment(tmp_path / "user", flashinfer=flashinfer)
    before = installed_versions(python)
    done, calls = setup_in(python)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(python), (done.stdout, done.stderr)
    assert f"testing {python} (the python3 on PATH has torch)" in done.stderr, done.stderr
    assert f"torch {USER_TORCH} from " in done.stderr, done.stderr
    assert len(calls) == 1, calls
    argv, keep = calls[0]["argv"], _pinned(calls[0]["constraints"])
    names = [a for a in argv[argv.index("-c") + 2 :]]
    ci = ci_pins()
    assert argv[0] == "install" and sorted(names) == sorted(f"{n}=={ci[n]}" for n in MISSING), argv
    assert not [a for a in argv if re.match(r"(torch|flashinfer|nvidia|triton)", a)], argv
    assert keep["torch"] == f"=={USER_TORCH}", keep
    assert keep["flashinfer-python"] == ("<0" if flashinfer == "none" else "==0.7.4"), keep
    assert keep["flashinfer-jit-cache"] == keep["flashinfer-cubin"] == "<0", keep
    assert all(keep[canonicalize_name(n)] == f"=={v}" for n, v in before.items()), (before, keep)
    after = installed_versions(python)
    assert {n: after.get(n) for n in before} == before and set(after) - set(before) == set(MISSING), after
    said = {
        "editable": f"flashinfer-python 0.7.4 from {tmp_path / 'user-flashinfer' / 'flashinfer'}",
        "none": "no flashinfer module here: FlashInfer is not installed into this environment by setup",
        "broken": "does not import (ImportError: libcuda.so.1: cannot open shared object file): setup installs "
        "no FlashInfer here",
    }[flashinfer]
    assert said in done.stderr, done.stderr
    assert not list(setup_in.root.glob(".venv*")), "a venv made beside the user's environment"
    again, calls = setup_in(python)
    assert again.returncode == 0 and calls == [], (again.stderr, calls)  # all there now: pip is not called
    assert "every requirement of the [test] extra is installed" in again.stderr, again.stderr


@pytest.mark.parametrize("case", ["no torch", "MOE_USE_VENV=1", "checkout's own .venv"])
def test_setup_makes_the_venv_where_the_active_python_has_no_torch_or_when_asked(setup_in, tmp_path, case):
    """The .venv path (MOE_VENV, here a stub whose marker is current, so nothing is built): the python3 on PATH has
    no torch, or MOE_USE_VENV=1 asks for it, or that python3 is the checkout's own .venv; the user's pip is never
    called."""
    python = user_environment(tmp_path / "user", torch=case != "no torch")
    variables = {"MOE_OTHER_FLASHINFER": ""}
    if case == "MOE_USE_VENV=1":
        variables["MOE_USE_VENV"] = "1"
    if case == "checkout's own .venv":
        variables["MOE_VENV"] = str(python.parent.parent)
        (python.parent.parent / ".moe-installed").touch()
        os.utime(python.parent.parent / ".moe-installed", (time.time() + 3600,) * 2)
    done, calls = setup_in(python, **variables)
    venv_python = Path(variables.get("MOE_VENV", setup_in.stub.parent.parent)) / "bin" / "python"
    assert done.returncode == 0 and done.stdout.strip() == str(venv_python), (done.stdout, done.stderr)
    why = {
        "no torch": "the python3 on PATH has no torch",
        "MOE_USE_VENV=1": "MOE_USE_VENV=1",
        "checkout's own .venv": "the python3 on PATH is this checkout's",
    }[case]
    assert f"using {venv_python} ({why}" in done.stderr, done.stderr
    assert calls == [], calls


def test_moe_python_without_torch_stops_setup_and_with_torch_is_tested(setup_in, tmp_path):
    without = user_environment(tmp_path / "bare", torch=False)
    done, calls = setup_in(without, MOE_PYTHON=str(without))
    assert done.returncode == cli.INPUT and not done.stdout and calls == [], (done.stdout, done.stderr)
    assert f"MOE_PYTHON={without} has no torch: set-up installs no torch into it" in done.stderr, done.stderr
    with_torch = user_environment(tmp_path / "user")
    done, calls = setup_in(without, MOE_PYTHON=str(with_torch))  # wins over the python3 on PATH
    assert done.returncode == 0 and done.stdout.strip() == str(with_torch), done.stderr
    assert len(calls) == 1 and f"(MOE_PYTHON={with_torch})" in done.stderr, (calls, done.stderr)


@pytest.mark.parametrize("bundle", ["the active python3", "another python"])
def test_gpu_env_sh_is_second_to_an_active_environment_with_torch(setup_in, tmp_path, bundle):
    """~/gpu-env.sh's python3 is used when the active python3 is that bundle's (gpu-env.sh sourced already); an
    active environment of the user's own with torch wins over it."""
    python = user_environment(tmp_path / "user")
    other = tmp_path / "bundle" / "bin"
    other.mkdir(parents=True)
    (other / "python3").symlink_to(sys.executable)  # has torch too (this environment's)
    target = python.parent if bundle == "the active python3" else other
    (tmp_path / "home" / "gpu-env.sh").write_text(f"export PATH={target}:$PATH\n")
    done, calls = setup_in(python)
    assert done.returncode == 0, done.stderr
    if bundle == "the active python3":
        assert done.stdout.strip() == "python3" and calls == [], (done.stdout, calls)
        assert "using ~/gpu-env.sh's python3 (the python3 on PATH is ~/gpu-env.sh's)" in done.stderr, done.stderr
    else:
        assert done.stdout.strip() == str(python) and len(calls) == 1, (done.stdout, done.stderr)


# ---------------------------------------------------------------- the session header
def test_the_header_names_where_torch_and_flashinfer_are_loaded_from(pytestconfig):
    import torch

    lines = [
        line
        for group in pytestconfig.hook.pytest_report_header(config=pytestconfig, start_path=pytestconfig.rootpath)
        for line in (group if isinstance(group, list) else [group])
    ]
    torch_line = f"under test: torch {md.version('torch')} at {Path(torch.__file__).resolve().parent} ("
    assert any(line.startswith(torch_line) for line in lines), lines
    try:
        fi = f"under test: flashinfer-python {md.version('flashinfer-python')} at "
        import importlib.util

        fi += str(Path(importlib.util.find_spec("flashinfer").origin).resolve().parent) + " ("
    except (md.PackageNotFoundError, AttributeError):
        fi = "under test: flashinfer-python not installed"
    assert any(line.startswith(fi) for line in lines), lines


def test_the_header_shows_a_source_build_of_flashinfer_without_importing_it(tmp_path):
    """An editable FlashInfer checkout whose import fails (as it would without a GPU driver): the header names the
    checkout and the editable install, and the header did not import it."""
    python = user_environment(tmp_path / "user", flashinfer="broken")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [str(python), "-m", "fixtures.plugin.environment_report"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    checkout = tmp_path / "user-flashinfer"
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"under test: torch {USER_TORCH} at {_site(python) / 'torch'} (installed by pip by name from an index: a "
        "registry wheel)",
        f"under test: flashinfer-python 0.7.4 at {checkout / 'flashinfer'} (editable install of {checkout})",
    ], done.stdout
