"""Installing the suite into a user's environment: pyproject.toml declares ranges, so a serving environment's torch
stays; ci/constraints.txt holds CI's exact versions for ci/setup.sh; a wheel or sdist is refused naming the checkout.
ci/setup.sh tests an active Python that has torch as installed, adding only the [test] extra's missing requirements
(never torch or FlashInfer); without torch, or with MOE_USE_VENV=1, the suite's own .venv. The session header names
where the torch and FlashInfer under test are loaded from. Every venv here is throwaway and offline (fake installed
metadata, a stub or linked pip); ci/setup.sh runs for real from a copy of its inputs."""

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
# What users run, which the ranges must admit: the H200's serving-like environment
# (reference.evidence.NIGHTLY_GREEN), the newest torch here, and the FlashInfer 0.7.x line.
USERS_RUN = {
    "torch": ["2.11.0+cu130", "2.13.0", "2.14.1"],
    "numpy": ["1.26.4", "2.4.6"],
    "pytest": ["9.1.1"],
    "hypothesis": ["6.168.3"],
    "flashinfer-python": ["0.7.2.post1", "0.7.4", "0.7.9"],
    "nvshmem4py-cu13": ["0.4.1"],
}
USER_TORCH = "2.11.0+cu130"
SETUP_INPUTS = (
    "ci/setup.sh",
    "ci/caller_paths.sh",
    "ci/bundle_python.sh",
    "ci/active_python.py",
    "ci/cli.py",
    "ci/constraints.txt",
    "pyproject.toml",
)


def requirements(pyproject: Path) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = [line for extra in project.get("optional-dependencies", {}).values() for line in extra]
    return [Requirement(line) for line in project["dependencies"] + extras]


def not_ranges(pyproject: Path) -> list[str]:
    """The requirements pinned exactly (==, ===) or without a lower bound."""
    return [
        str(r)
        for r in requirements(pyproject)
        if any(s.operator in ("==", "===") for s in r.specifier) or not any(s.operator == ">=" for s in r.specifier)
    ]


def pins(constraints: Path) -> tuple[dict[str, str], list[str]]:
    """``name==version`` lines by canonical name, and the lines that are not of that form."""
    found, bad = {}, []
    for line in constraints.read_text().splitlines():
        line = line.split("#")[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        if match:
            found[canonicalize_name(match[1])] = match[2]
        elif line:
            bad.append(line)
    return found, bad


def test_no_requirement_is_pinned_exactly():
    assert not not_ranges(PYPROJECT), f"pyproject.toml: ranges only (>=, <), the pins go in {CONSTRAINTS}"


def test_the_range_check_sees_an_exact_pin(tmp_path):
    """The check itself can fail: today's ranges with torch pinned again."""
    broken = tmp_path / "pyproject.toml"
    broken.write_text(re.sub(r'"torch[^"]*"', '"torch==2.13.0"', PYPROJECT.read_text()))
    assert not_ranges(broken) == ["torch==2.13.0"]


def test_the_ranges_admit_what_users_run():
    refused = [
        f"{r} refuses {v}"
        for r in requirements(PYPROJECT)
        for v in USERS_RUN.get(r.name, ())
        if not r.specifier.contains(v, prereleases=True)
    ]
    assert not refused, refused


def test_the_constraints_pin_each_declared_package_inside_its_range():
    pinned, bad = pins(CONSTRAINTS)
    assert not bad, f"{CONSTRAINTS}: one name==version a line: {bad}"
    wrong = [
        f"{r}: {pinned.get(canonicalize_name(r.name), 'not pinned')}"
        for r in requirements(PYPROJECT)
        if not r.specifier.contains(pinned.get(canonicalize_name(r.name), "0.0.0a0"), prereleases=True)
    ]
    assert not wrong, f"{CONSTRAINTS} against pyproject.toml's ranges: {wrong}"


# ci/setup.sh with a python3 that has no torch (it answers nothing to ci/active_python.py) and whose venvs only log
# their calls: what it installs in its .venv path, in which order, at which pins.
FAKE_PYTHON3 = """#!/bin/bash
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/bin/bash\\necho "%s $*" >> %s\\n' "$3" "$SETUP_LOG" > "$3/bin/python"
  chmod +x "$3/bin/python"
fi
"""


@pytest.fixture
def setup_sh(tmp_path):
    """ci/setup.sh in a copy of its inputs (tmp_path is its root and HOME), run with the fake python3."""
    (tmp_path / "ci").mkdir()
    for name in SETUP_INPUTS:
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(FAKE_PYTHON3)
    (tmp_path / "bin" / "python3").chmod(0o755)
    log = tmp_path / "setup.log"
    env = {k: v for k, v in os.environ.items() if k not in ("MOE_VENV", "MOE_PYTHON", "MOE_USE_VENV")}
    env.update(HOME=str(tmp_path), PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SETUP_LOG=str(log))
    env["MOE_OTHER_FLASHINFER"] = "0.7.2.post1"

    def run() -> list[list[str]]:
        log.write_text("")
        done = subprocess.run(
            ["bash", str(tmp_path / "ci" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return [line.split() for line in log.read_text().splitlines() if " -m pip install " in line]

    run.env = env  # for a test that runs it with another value
    return tmp_path, run


def test_setup_installs_torch_first_and_everything_at_the_constraints(setup_sh):
    root, run = setup_sh
    calls = run()
    main, other = str(root / ".venv"), str(root / ".venv-fi-0.7.2.post1")
    for venv, extra in ((main, f"{root}[test,flashinfer]"), (other, f"{root}[test]")):
        installs = [c[c.index("install") + 1 :] for c in calls if c[0] == venv and "--upgrade" not in c]
        assert [i[-1] for i in installs][:1] == ["torch"] and len(installs) == 2, f"{venv}: {installs}"
        assert extra in installs[1], f"{venv}: {installs}"
        assert all("-c" in c for c in calls if c[0] == venv), f"{venv}: a pip install without -c: {calls}"
    used = {c[c.index("-c") + 1] for c in calls if c[0] == other}
    pinned, _ = pins(Path(used.pop()))
    assert not used and "flashinfer-python" not in pinned and pinned["torch"] == pins(CONSTRAINTS)[0]["torch"]
    assert "flashinfer-python==0.7.2.post1" in calls[-1], calls[-1]


def test_an_other_flashinfer_that_is_no_version_stops_set_up_with_one_line_before_any_install(setup_sh):
    root, run = setup_sh
    env = {**run.env, "MOE_OTHER_FLASHINFER": "0.7.2.post1 bogus"}
    done = subprocess.run(["bash", str(root / "ci" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    said = [line for line in done.stderr.splitlines() if "MOE_OTHER_FLASHINFER" in line]
    assert done.returncode == 4 and said == [
        "ci/setup.sh: MOE_OTHER_FLASHINFER: 'bogus' is not a flashinfer-python version (e.g. 0.7.2.post1; empty: none)"
    ], done.stderr[-2000:]
    assert not (root / ".venv-fi-bogus").exists()


@pytest.mark.parametrize("changed", ["ci/constraints.txt", "pyproject.toml"])
def test_setup_reinstalls_when_its_inputs_change(setup_sh, changed):
    root, run = setup_sh
    run()
    assert run() == [], "installed again with nothing changed"
    later = (root / ".venv" / ".moe-installed").stat().st_mtime + 10
    os.utime(root / changed, (later, later))
    assert {c[0] for c in run()} == {str(root / ".venv"), str(root / ".venv-fi-0.7.2.post1")}


def _link_installed(name: str, site: Path) -> None:
    """This environment's distribution ``name`` (its top-level files and dist-info) linked into ``site``."""
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        pytest.skip(f"{name} is not installed here: the offline venv borrows it")
    for top in {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
        if not (site / top).exists():
            (site / top).symlink_to(Path(dist.locate_file(top)))


def _fake_installed(site: Path, name: str, version: str) -> None:
    info = site / f"{canonicalize_name(name).replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")


def _site(python: Path) -> Path:
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.strip())


@pytest.fixture(scope="module")
def user_env(tmp_path_factory) -> Path:
    """A plain venv holding torch 2.11.0+cu130 and numpy 2.2.6 (fakes), with pip and setuptools: its python."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = _site(python)
    for name in ("pip", "setuptools"):
        _link_installed(name, site)
    _fake_installed(site, "torch", USER_TORCH)
    _fake_installed(site, "numpy", "2.2.6")
    return python


def checkout_copy(dest: Path) -> Path:
    """What an install of the checkout reads: pyproject.toml, the build backend, each package's __init__.py."""
    text = PYPROJECT.read_text()
    config = tomllib.loads(text)
    for folder in config["build-system"].get("backend-path", []):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for package in (p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]):
        (dest / package).mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / package / "__init__.py", dest / package)
    (dest / "pyproject.toml").write_text(text)
    return dest


def offline(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python args`` without any pip configuration, index or PYTHONPATH of this machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def editable(user_env, tmp_path_factory):
    """``pip install --no-index --no-build-isolation -e`` of a checkout copy into the user's venv."""
    checkout = checkout_copy(tmp_path_factory.mktemp("checkout"))
    done = offline(
        user_env, "-m", "pip", "install", "--no-index", "--no-build-isolation", "-e", str(checkout), cwd=checkout.parent
    )
    return checkout, done


def test_an_editable_install_keeps_the_environments_torch(user_env, editable):
    _, done = editable
    assert done.returncode == 0, done.stdout + done.stderr
    torch = offline(user_env, "-c", "import importlib.metadata as m; print(m.version('torch'))", cwd=Path("/"))
    assert torch.stdout.strip() == USER_TORCH, torch.stdout + torch.stderr
    assert re.search(r"Requirement already satisfied: torch\W.*\(2\.11\.0\+cu130\)", done.stdout), done.stdout
    assert not re.search(r"^(Collecting|Downloading) torch", done.stdout, re.M), done.stdout


def test_an_editable_install_imports_the_packages_from_the_checkout(user_env, editable):
    checkout, done = editable
    assert done.returncode == 0, done.stdout + done.stderr
    names = [
        p.rstrip("*") for p in tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    assert {"reference", "fixtures", "ci", "gates", "tools"} <= set(names)
    probe = "import importlib.util as u, sys; print('\\n'.join(u.find_spec(n).origin for n in sys.argv[1:]))"
    where = offline(user_env, "-c", probe, *names, cwd=Path("/"))  # outside the checkout: through the install
    assert where.stdout.split() == [str(checkout / n / "__init__.py") for n in names], where.stdout + where.stderr


@pytest.mark.parametrize("command", [["wheel", "--no-deps", "-w", "wheels"], ["install"]], ids=["wheel", "install"])
def test_a_wheel_is_refused_naming_the_checkout(user_env, tmp_path, command):
    checkout = checkout_copy(tmp_path / "checkout")
    done = offline(user_env, "-m", "pip", *command, "--no-index", "--no-build-isolation", str(checkout), cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"installs from its checkout only: pip install -e {checkout} " in output, output
    assert "Traceback" not in output and not list(tmp_path.rglob("*.whl")), output


# ---------------------------------------------------------------- ci/setup.sh in a user's environment
# A venv standing in for a vLLM or SGLang one: a fake torch, a FlashInfer (editable, none, or failing to import), the
# [test] extra but MISSING as metadata, and a stub pip that logs each call and "installs" metadata. MOE_VENV is a stub
# whose marker is current: a wrong turn into the .venv path prints that stub instead of the user's python.
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
            _fake_installed(site, req.name, pins(CONSTRAINTS)[0][canonicalize_name(req.name)])
    return python


def installed_versions(python: Path) -> dict[str, str]:
    probe = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    return json.loads(offline(python, "-c", probe, cwd=Path("/")).stdout)


def _current(venv: Path) -> Path:
    """Marks ``venv`` installed after its inputs changed: ci/setup.sh builds nothing there."""
    (venv / ".moe-installed").touch()
    os.utime(venv / ".moe-installed", (time.time() + 3600,) * 2)
    return venv


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
    _current(stub)
    (tmp_path / "home").mkdir()
    log = tmp_path / "pip.log"

    def run(env_python: Path, **variables: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
        log.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "MOE_", "VIRTUAL_ENV"))}
        env.update(HOME=str(tmp_path / "home"), PATH=f"{env_python.parent}:{os.environ['PATH']}", STUB_PIP_LOG=str(log))
        env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PYTHONNOUSERSITE="1", MOE_VENV=str(stub))
        env.update(variables)
        done = subprocess.run(["bash", root / "ci" / "setup.sh"], env=env, capture_output=True, text=True, timeout=60)
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
    """The python3 on PATH has torch: setup prints it and installs only the missing [test] requirements at CI's pins,
    torch and FlashInfer pinned as installed (or forbidden); a FlashInfer absent or not importing is reported."""
    python = user_environment(tmp_path / "user", flashinfer=flashinfer)
    before = installed_versions(python)
    done, calls = setup_in(python)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(python), (done.stdout, done.stderr)
    assert f"testing {python} (the python3 on PATH has torch)" in done.stderr, done.stderr
    assert f"torch {USER_TORCH} from " in done.stderr, done.stderr
    assert len(calls) == 1, calls
    argv, keep = calls[0]["argv"], _pinned(calls[0]["constraints"])
    names, ci = argv[argv.index("-c") + 2 :], pins(CONSTRAINTS)[0]
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
    """The .venv path (MOE_VENV, a stub whose marker is current): for a python3 without torch, with MOE_USE_VENV=1 or
    that is the checkout's own .venv; the user's pip is never called."""
    python = user_environment(tmp_path / "user", torch=case != "no torch")
    variables = {"MOE_OTHER_FLASHINFER": "", **({"MOE_USE_VENV": "1"} if case == "MOE_USE_VENV=1" else {})}
    if case == "checkout's own .venv":
        variables["MOE_VENV"] = str(_current(python.parent.parent))
    done, calls = setup_in(python, **variables)
    venv_python = Path(variables.get("MOE_VENV", setup_in.stub.parent.parent)) / "bin" / "python"
    assert done.returncode == 0 and done.stdout.strip() == str(venv_python), (done.stdout, done.stderr)
    why = {
        "no torch": "the python3 on PATH has no torch",
        "checkout's own .venv": "the python3 on PATH is this checkout's",
    }
    why = why.get(case, case)
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
    (_site(python) / "pytest.py").write_text("")  # a bundle holds the [test] extra: set-up imports pytest there
    other = tmp_path / "bundle" / "bin"
    other.mkdir(parents=True)
    (other / "python3").symlink_to(sys.executable)  # has torch too (this environment's)
    target = python.parent if bundle == "the active python3" else other
    (tmp_path / "home" / "gpu-env.sh").write_text(f"export PATH={target}:$PATH\n")
    done, calls = setup_in(python)
    assert done.returncode == 0, done.stderr
    if bundle == "the active python3":
        wrapper = setup_in.root / "ci" / "bundle_python.sh"
        assert done.stdout.strip() == str(wrapper) and calls == [], (done.stdout, calls)
        assert "using ~/gpu-env.sh's python3 (the python3 on PATH is ~/gpu-env.sh's)" in done.stderr, done.stderr
    else:
        assert done.stdout.strip() == str(python) and len(calls) == 1, (done.stdout, done.stderr)


def test_the_bundle_python_that_set_up_prints_runs_from_a_shell_that_never_sourced_gpu_env_sh(setup_in, tmp_path):
    """Where the python3 on PATH has no torch and ~/gpu-env.sh exists, set-up sources it in its own process; what it
    prints must still run the bundle's python3 from the caller's shell (ci/test.sh execs it), not the python3 on the
    caller's PATH."""
    without = user_environment(tmp_path / "bare", torch=False)
    _bundle(tmp_path, "export PATH={bundle}:$PATH\nexport BUNDLE_ENV_SEEN=yes\n")  # this environment's python
    done, calls = setup_in(without)
    assert done.returncode == 0 and calls == [], (done.stdout, done.stderr)
    assert "using ~/gpu-env.sh's python3 (~/gpu-env.sh exists; the python3 on PATH has no torch)" in done.stderr
    caller = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MOE_", "VIRTUAL_ENV", "BUNDLE_"))}
    caller.update(HOME=str(tmp_path / "home"), PATH=f"{without.parent}:{os.environ['PATH']}")
    probe = "import os, sys, torch; print(sys.executable, os.environ.get('BUNDLE_ENV_SEEN'))"
    ran = subprocess.run(
        [done.stdout.strip(), "-c", probe], env=caller, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == [sys.executable, "yes"], ran.stdout


def _python_3_9(tmp_path: Path) -> Path:
    """A python3 that ci/active_python.py's ``where`` finds to be 3.9.18 with torch (no such interpreter here)."""
    old = tmp_path / "old-python" / "python3"
    old.parent.mkdir()
    old.write_text(
        f'#!/bin/sh\n[ "$2" = where ] && {{ printf "python=%s\\nprefix=/x\\ntorch=/x/torch\\nversion=3.9.18\\n'
        f'requires=>=3.10\\npython_ok=0\\n" "$0"; exit 0; }}\nexec "{sys.executable}" "$@"\n'
    )
    old.chmod(0o755)
    return old


@pytest.mark.parametrize("how", ["MOE_PYTHON", "the python3 on PATH"])
def test_a_python_older_than_requires_python_is_refused_before_pip(setup_in, tmp_path, how):
    """pyproject.toml requires Python 3.10: set-up says so and exits 4, and asks pip for nothing in that environment."""
    old = _python_3_9(tmp_path)
    if how == "MOE_PYTHON":
        done, calls = setup_in(user_environment(tmp_path / "user"), MOE_PYTHON=str(old))
        who = f"MOE_PYTHON={old}"
    else:
        done, calls = setup_in(old)
        who = str(old)
    assert done.returncode == cli.INPUT and not done.stdout and calls == [], (done.stdout, done.stderr)
    assert f"{who} is Python 3.9.18; the suite needs Python >=3.10 (pyproject.toml)" in done.stderr, done.stderr


def _bundle(tmp_path: Path, gpu_env: str, python: str = "") -> Path:
    """A prepared host's ~/gpu-env.sh whose text is ``gpu_env`` with ``{bundle}`` its bin folder, where python3 runs
    ``python`` (default: this environment's, which has torch and pytest)."""
    bundle = tmp_path / "bundle" / "bin"
    bundle.mkdir(parents=True)
    (bundle / "python3").write_text(f'#!/bin/sh\nexec "{python or sys.executable}" "$@"\n')
    (bundle / "python3").chmod(0o755)
    (tmp_path / "home" / "gpu-env.sh").write_text(gpu_env.format(bundle=bundle))
    return bundle


def test_a_gpu_env_sh_that_prints_and_reads_unset_variables_still_gives_one_python(setup_in, tmp_path):
    """A user's own ~/gpu-env.sh may print a line and extend a variable that is not set: set-up's stdout is still the
    one python to run (ci/test.sh captures it), and the unset variable is no error."""
    without = user_environment(tmp_path / "bare", torch=False)
    _bundle(
        tmp_path,
        'echo "bundle: torch 2.11"\nexport PATH={bundle}:$PATH\nexport LD_LIBRARY_PATH=/opt/lib:$LD_LIBRARY_PATH\n',
    )
    done, calls = setup_in(without, LD_LIBRARY_PATH="")
    assert done.returncode == 0 and calls == [], (done.stdout, done.stderr)
    assert done.stdout.splitlines() == [str(setup_in.root / "ci" / "bundle_python.sh")], done.stdout
    assert "bundle: torch 2.11" in done.stderr, done.stderr


@pytest.mark.parametrize("lacks", ["torch", "pytest", "a supported version"])
def test_a_bundle_python_that_cannot_run_the_suite_stops_set_up_with_one_line(setup_in, tmp_path, lacks):
    """~/gpu-env.sh's python3 must hold torch and the [test] extra (docs/gpu-hosts.md) and meet requires-python: set-up
    says which it lacks and exits 4, instead of printing a python whose pytest would fail with a traceback."""
    if lacks == "torch":
        python = str(user_environment(tmp_path / "no-torch", torch=False))
    elif lacks == "pytest":
        python = str(user_environment(tmp_path / "no-pytest"))  # fake torch; no pytest module
    else:
        python = str(_python_3_9(tmp_path))
    without = user_environment(tmp_path / "bare", torch=False)
    _bundle(tmp_path, "export PATH={bundle}:$PATH\n", python)
    done, calls = setup_in(without)
    assert done.returncode == cli.INPUT and not done.stdout and calls == [], (done.stdout, done.stderr)
    expected = {
        "torch": "has no torch: the bundle must hold torch",
        "pytest": "has no pytest: the bundle must hold the [test] extra",
        "a supported version": "~/gpu-env.sh's python3 is Python 3.9.18; the suite needs Python >=3.10",
    }[lacks]
    assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("MOE_USE_VENV", "yes", "MOE_USE_VENV='yes': expected 1 or 0"),
        ("MOE_OTHER_FLASHINFER", "0.7.2.post1 latest", "MOE_OTHER_FLASHINFER: 'latest' is not a flashinfer-python"),
        ("MOE_OTHER_FLASHINFER", "*", "MOE_OTHER_FLASHINFER: '*' is not a flashinfer-python"),
    ],
    ids=["use-venv-word", "other-flashinfer-word", "other-flashinfer-pattern"],
)
def test_a_bad_setting_stops_set_up_before_anything_is_installed(setup_in, tmp_path, variable, value, says):
    """A setting set-up reads is checked first: a bad one exits 4 with one line, before pip adds anything to the
    user's environment or an environment is made."""
    python = user_environment(tmp_path / "user")
    done, calls = setup_in(python, **{variable: value})
    assert done.returncode == cli.INPUT and not done.stdout, (done.stdout, done.stderr)
    assert calls == [] and not list(setup_in.root.glob(".venv-fi-*")), calls
    assert says in done.stderr, done.stderr


@pytest.mark.parametrize("variable", ["MOE_JIT_CACHE", "MOE_JIT_AOT"])
def test_a_named_jit_tarball_that_is_missing_stops_set_up(setup_in, tmp_path, variable):
    """On a prepared host a JIT tarball named by its variable must be there; the default ones are restored where they
    are. A missing one is a bad setting, not minutes of compiling that nothing explains."""
    without = user_environment(tmp_path / "bare", torch=False)
    _bundle(tmp_path, "export PATH={bundle}:$PATH\n")
    done, _ = setup_in(without, **{variable: str(tmp_path / "nowhere.tgz")})
    assert done.returncode == cli.INPUT and not done.stdout, (done.stdout, done.stderr)
    assert f"{variable}={tmp_path / 'nowhere.tgz'}: no such file" in done.stderr, done.stderr


def test_requires_python_is_read_from_pyproject():
    sys.path.insert(0, str(ROOT / "ci"))
    try:
        from ci.active_python import supported
    finally:
        sys.path.remove(str(ROOT / "ci"))
    assert supported(PYPROJECT, (3, 10, 0)) == (">=3.10", True)
    assert supported(PYPROJECT, (3, 9, 18)) == (">=3.10", False)
    assert supported(PYPROJECT, (3, 13, 1)) == (">=3.10", True)


@pytest.mark.parametrize(
    "moe_python, expected",
    [("env/bin/python3", "{caller}/env/bin/python3"), ("/abs/python3", "/abs/python3"), ("python3.11", "python3.11")],
    ids=["relative", "absolute", "a-name-on-path"],
)
def test_a_relative_moe_python_names_the_callers_folder(tmp_path, moe_python, expected):
    """ci/test.sh and ci/conformance.sh cd into the checkout: ci/caller_paths.sh makes a relative MOE_PYTHON path name
    the folder they were started from, and leaves a bare name to PATH."""
    script = f'caller="{tmp_path}"; source "{ROOT / "ci" / "caller_paths.sh"}"; echo "$MOE_PYTHON"'
    env = {**os.environ, "MOE_PYTHON": moe_python}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == expected.format(caller=tmp_path), done.stderr


# ---------------------------------------------------------------- the session header
def test_the_header_names_where_torch_and_flashinfer_are_loaded_from(pytestconfig):
    import torch

    groups = pytestconfig.hook.pytest_report_header(config=pytestconfig, start_path=pytestconfig.rootpath)
    lines = [line for group in groups for line in (group if isinstance(group, list) else [group])]
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
    argv = [str(python), "-m", "fixtures.plugin.environment_report"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    checkout = tmp_path / "user-flashinfer"
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"under test: torch {USER_TORCH} at {_site(python) / 'torch'} (installed by pip by name from an index: a "
        "registry wheel)",
        f"under test: flashinfer-python 0.7.4 at {checkout / 'flashinfer'} (editable install of {checkout})",
    ], done.stdout
