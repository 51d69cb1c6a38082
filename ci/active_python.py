"""What ci/setup.sh asks of a Python it may use: run as a script by that Python, standard library only (the checkout
is not installed there). Everything it says goes to stderr except ``where``'s lines.

  where         ``python=`` (sys.executable), ``prefix=`` (sys.prefix), ``torch=`` and ``pytest=`` (the folder each
                would be imported from, empty when there is none; finding it imports nothing), ``version=``, ``requires=``
                (pyproject.toml's requires-python) and ``python_ok=`` (1 where this Python meets it) on stdout
  prepare ROOT  in a user's environment: names the torch and FlashInfer there, then installs the requirements of
                ROOT/pyproject.toml's ``[test]`` extra that are missing, and nothing else

``prepare``'s rule: pip may only add distributions. Its constraint file pins every distribution already installed
at its installed version (torch, flashinfer-python and whatever a serving stack holds), and forbids torch and the
FlashInfer distributions outright where they are not installed (``NAME<0``), so a missing test tool that would
pull or move one makes pip stop with ResolutionImpossible instead. The missing names get CI's exact versions
(ci/constraints.txt) where CI pins them. An installed requirement outside pyproject's range is named and left
alone; FlashInfer is never installed here, importable or not: the FlashInfer tests skip or fail with their reasons.
Exit codes (ci/cli.py's table; ci/setup.sh exits with them): 4 this Python cannot add the missing requirements
(no pip, or no packaging), 6 pip could not add them (no package index, or they conflict with what is installed).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib
import importlib.util
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__:  # imported as ci.active_python
    from ci import cli
else:  # run as a script by a user's Python (ci/setup.sh): this file's folder is first on its path, ci/cli.py there
    import cli

# Never installed into a user's environment, whether or not they are there.
PROTECTED = ("torch", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


def say(text: str) -> None:
    print(f"ci/setup.sh: {text}", file=sys.stderr, flush=True)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def module_dir(name: str) -> str:
    """The folder ``import name`` would load from, without importing it ("" when there is none)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    if spec is None:
        return ""
    if spec.submodule_search_locations:
        return str(list(spec.submodule_search_locations)[0])
    return str(Path(spec.origin).parent) if spec.origin else ""


def version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _packaging():
    try:
        from packaging.requirements import Requirement
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pip carries its own copy
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import InvalidVersion, Version
    return Requirement, Version, InvalidVersion


def supported(pyproject: Path, running: tuple[int, ...] = tuple(sys.version_info[:3])) -> tuple[str, bool]:
    """pyproject.toml's ``requires-python`` (">=3.10") and whether ``running`` meets it (its lower bounds, the only
    kind the file states; a file without one: any Python)."""
    match = re.search(r'^requires-python\s*=\s*"([^"]*)"', pyproject.read_text(), re.M)
    spec = match[1] if match else ""
    floors = [tuple(int(p) for p in m.split(".")) for m in re.findall(r">=\s*([0-9]+(?:\.[0-9]+)*)", spec)]
    return spec or "any", all(running[: len(f)] >= f for f in floors)


def test_extra(pyproject: Path) -> list[str]:
    """The requirement lines of pyproject.toml's ``[project.optional-dependencies] test``."""
    text = pyproject.read_text()
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the list's quoted lines
        block = re.search(r"^test\s*=\s*\[(.*?)\]", text, re.S | re.M)
        return re.findall(r'"([^"]+)"', re.sub(r"#.*", "", block[1])) if block else []
    return tomllib.loads(text)["project"]["optional-dependencies"]["test"]


def ci_pins(constraints: Path) -> dict[str, str]:
    pins = {}
    for line in constraints.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.split("#")[0].strip())
        if match:
            pins[canonical(match[1])] = match[2]
    return pins


def describe_flashinfer() -> None:
    """Says which FlashInfer is here and whether it imports; installs nothing."""
    installed, where = version("flashinfer-python"), module_dir("flashinfer")
    if not where:
        say(
            f"no flashinfer module here{f' (flashinfer-python {installed} has metadata only)' if installed else ''}: "
            "FlashInfer is not installed into this environment by setup (the FlashInfer tests skip with their reason); "
            "install your build here, or MOE_USE_VENV=1 for the suite's own .venv"
        )
        return
    try:
        importlib.import_module("flashinfer")  # does it import
    except Exception as err:  # noqa: BLE001 (any failure is reported, not repaired)
        first = str(err).splitlines()[0] if str(err) else ""
        say(
            f"flashinfer at {where} does not import ({type(err).__name__}: {first}): setup installs no FlashInfer "
            "here; the FlashInfer tests fail or skip with this reason"
        )
        return
    say(f"flashinfer-python {installed or '(no metadata)'} from {where}")


def prepare(root: Path) -> int:
    try:
        Requirement, Version, InvalidVersion = _packaging()
    except ImportError:
        say("this Python has neither packaging nor pip: install the [test] extra's requirements yourself")
        return cli.INPUT
    say(f"torch {version('torch') or '(no metadata)'} from {module_dir('torch')}")
    describe_flashinfer()
    missing, outside = [], []
    for line in test_extra(root / "pyproject.toml"):
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue
        have = version(req.name)
        if have is None:
            missing.append(req)
        elif not req.specifier.contains(have, prereleases=True):
            outside.append(f"{req.name} {have} (pyproject.toml: {req.specifier})")
    if outside:
        say("outside pyproject.toml's ranges, left as they are: " + ", ".join(outside))
    if not missing:
        say("every requirement of the [test] extra is installed: nothing to install")
        return cli.OK
    pins = ci_pins(root / "ci" / "constraints.txt")
    lines, installed = [], set()
    for dist in md.distributions():
        name, have = dist.metadata["Name"], dist.version
        if not name or canonical(name) in installed:
            continue
        try:
            Version(have)
        except InvalidVersion:  # pip cannot read such a pin; it sees the version as installed anyway
            continue
        installed.add(canonical(name))
        lines.append(f"{name}=={have}")
    lines += [f"{name}<0" for name in PROTECTED if canonical(name) not in installed]
    wanted = []
    for req in missing:
        pin = pins.get(canonical(req.name))
        ci = f"{req.name}=={pin}" if pin and req.specifier.contains(pin, prereleases=True) else None
        wanted.append(ci or f"{req.name}{req.specifier}")
    names = " ".join(wanted)
    if importlib.util.find_spec("pip") is None:
        say(
            f"missing from the [test] extra: {names}; this Python has no pip: install them yourself "
            "(e.g. uv pip install), keeping torch and FlashInfer"
        )
        return cli.INPUT
    with tempfile.NamedTemporaryFile("w", prefix="moe-keep-", suffix=".txt", delete=False) as keep:
        keep.write("# what is installed stays as it is (ci/active_python.py)\n" + "\n".join(lines) + "\n")
    say(
        f"installing the missing test requirements {names}, with every installed distribution pinned "
        f"({keep.name}): no torch or FlashInfer is installed or changed"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", keep.name, *wanted],
        stdout=sys.stderr,
    )
    Path(keep.name).unlink(missing_ok=True)
    importlib.invalidate_caches()
    still = [str(r) for r in missing if version(r.name) is None]
    if done.returncode or still:
        say(
            f"pip could not add {' '.join(still) or names} without changing what is installed (exit "
            f"{done.returncode}): install them yourself, or MOE_USE_VENV=1 for the suite's own .venv"
        )
        return cli.INCOMPLETE
    return cli.OK


def main(argv: list[str] | None = None) -> int:
    p = cli.Parser(
        "ci.active_python",
        description=__doc__.split("\n\n")[0],
        more=__doc__.split("\n\n")[1],
        codes={
            cli.INPUT: "a bad argument; or (prepare) this Python has no pip or packaging to add the "
            "missing requirements with",
            cli.INCOMPLETE: "(prepare) pip could not add them: no package index, or a conflict with what is installed",
        },
    )
    p.add_argument("what", choices=("where", "prepare"))
    p.add_argument("root", nargs="?", type=Path, help="prepare: the checkout")
    a = p.parse_args(argv)
    if a.what == "where":
        if a.root is not None:
            p.error("where takes no ROOT")
        requires, ok = supported(Path(__file__).resolve().parents[1] / "pyproject.toml")
        print(
            f"python={sys.executable}\nprefix={sys.prefix}\ntorch={module_dir('torch')}\npytest={module_dir('pytest')}"
        )
        print(f"version={platform.python_version()}\nrequires={requires}\npython_ok={int(ok)}")
        return cli.OK
    if a.root is None:
        p.error("prepare needs ROOT, the checkout")
    return prepare(a.root)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
