"""Installing the suite into a user's environment. pyproject.toml declares ranges, so a serving environment's torch
stays; ci/constraints.txt holds CI's exact versions, which ci/setup.sh applies to every pip install; a wheel or
sdist is refused with one line that names the checkout (ci/build_backend/moe_conformance_backend.py).

The pip tests run offline, in a plain venv of their own: this environment's pip and setuptools are linked in, and
torch and numpy are fake installed distributions of other versions."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
SETUP_INPUTS = ("ci/setup.sh", "ci/active_python.py", "ci/cli.py", "ci/constraints.txt", "pyproject.toml")
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
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "SETUP_LOG": str(log),
        "MOE_OTHER_FLASHINFER": "0.7.2.post1",
    }
    for name in ("MOE_VENV", "MOE_PYTHON", "MOE_USE_VENV"):
        env.pop(name, None)

    def run() -> list[list[str]]:
        log.write_text("")
        done = subprocess.run(
            ["bash", str(tmp_path / "ci" / "setup.sh")], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return [line.split() for line in log.read_text().splitlines() if " -m pip install " in line]

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
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")


@pytest.fixture(scope="module")
def user_env(tmp_path_factory) -> Path:
    """A plain venv holding torch 2.11.0+cu130 and numpy 2.2.6 (fakes), with pip and setuptools: its python."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
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
