"""The settings module (fixtures.settings) and the start-of-run checks (fixtures.plugin.options): every ``MOE_*``
variable is declared once, an invalid value is one line naming it, and bad options are one usage error."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures.plugin import options
from fixtures import settings

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]

# One value each declared variable refuses (NAME=value); the others take any text (paths, URLs checked by their
# readers, implementation names checked at configure time: test_a_bad_option_is_one_usage_error).
INVALID = dict(
    pair.split("=", 1)
    for pair in """MOE_CONFORMANCE_EP=1,two MOE_HYPOTHESIS_PROFILE=device MOE_HYPOTHESIS_EXAMPLES=0 MOE_MODEL_EP=some
    MOE_WORKERS=-1 MOE_CASE_TIMEOUT=abc MOE_JIT_TIMEOUT=0 MOE_COLLECTIVE_TIMEOUT=-5 MOE_POOL_STARTUP_TIMEOUT=inf
    MOE_MAX_POOLS=0 MOE_POOL_PREFETCH=maybe MOE_POOL_WARMUP=2 MOE_MAX_LAYERS=1.5 MOE_HOST_THREADS=zero MOE_RANK_NICE=20
    MOE_ORACLE_CACHE_GB=-1 MOE_GPU_MAX_HIDDEN=2k MOE_GPU_MAX_INTERMEDIATE=0 MOE_F13_TORCH_INTERLEAVE=2
    MOE_CLEAN_EXIT=nope MOE_CUTE_DSL_CACHE=maybe MOE_GSM8K_URL=ftp://example.org MOE_USE_VENV=yes
    MOE_POOL_ADDR=localhost MOE_POOL_AUTHKEY=xyz MOE_DIST_BACKEND=mpi MOE_PLACEMENT=anywhere MOE_SHARD=3/2
    MOE_PIN_WORKER_GPU=2 MOE_GPU_LIST=0,a MOE_LEDGER_GAPS=all MOE_GSM8K_DIR=/nonexistent
    MOE_GSM8K_CONFIG=/nonexistent.yaml""".split()
)
# Values at the edges that were taken and then broke a run: an overflow in torch.distributed or in a C long, an EP
# size no pool runs (every model test skipped), a shard count that hung the split, a data folder that is a file.
EDGES = {
    "MOE_COLLECTIVE_TIMEOUT-1e10": ("MOE_COLLECTIVE_TIMEOUT", "1e10"),
    "MOE_HOST_THREADS-past-a-C-long": ("MOE_HOST_THREADS", "3000000000"),
    "MOE_MODEL_EP-3": ("MOE_MODEL_EP", "3"),
    "MOE_SHARD-1/1e9": ("MOE_SHARD", "1/1000000000"),
    "MOE_GSM8K_DIR-a-file": ("MOE_GSM8K_DIR", str(Path(__file__))),
}
FREE_TEXT = set(
    """MOE_CONFORMANCE_IMPL MOE_RESULTS_DIR MOE_GSM8K_CACHE MOE_PYTHON MOE_VENV MOE_JIT_CACHE MOE_JIT_AOT
    MOE_OTHER_FLASHINFER""".split()
)


def test_every_declared_variable_has_an_invalid_value_here_or_takes_any_text():
    assert set(settings.DECLARED) == set(INVALID) | FREE_TEXT, set(settings.DECLARED) ^ (set(INVALID) | FREE_TEXT)
    for name in FREE_TEXT:
        assert settings.DECLARED[name].get({name: "any text"}) == "any text", name


@pytest.mark.parametrize("name, bad", [*sorted(INVALID.items()), *EDGES.values()], ids=[*sorted(INVALID), *EDGES])
def test_an_invalid_value_is_one_line_naming_the_variable(name, bad):
    with pytest.raises(settings.SettingError) as err:
        settings.validate({name: bad})
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{name}={bad!r}: expected "), message
    assert settings.DECLARED[name].accepts in message and "(default " in message, message


@pytest.mark.parametrize("name", sorted(settings.DECLARED))
def test_unset_or_empty_is_the_default(name):
    setting = settings.DECLARED[name]
    assert setting.get({}) == setting.default and setting.get({name: ""}) == setting.default
    assert setting.shown_default and setting.meaning and setting.accepts


def test_the_options_plugin_turns_an_invalid_value_into_a_usage_error(monkeypatch):
    monkeypatch.setenv("MOE_CASE_TIMEOUT", "abc")
    with pytest.raises(pytest.UsageError, match=r"^MOE_CASE_TIMEOUT='abc': expected seconds"):
        options.before_conftests(SimpleNamespace(known_args_namespace=SimpleNamespace(help=False)), [])


@pytest.mark.parametrize(
    "variables, argument, named",
    [
        ({"MOE_CASE_TIMEOUT": "abc"}, "-q", "MOE_CASE_TIMEOUT"),
        ({}, "--bogus-option", "unrecognized arguments: --bogus"),
    ],
    ids=["setting", "option"],
)
def test_a_bad_value_or_option_stops_ci_test_sh_with_one_line(variables, argument, named):
    """The README's command with a bad value or an option pytest does not know: one line naming it, no traceback, no
    pytest usage block, exit 4."""
    env, argv = {**os.environ, **variables}, ["bash", "ci/test.sh", "--collect-only", argument]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    # ci/setup.sh's own line (which Python it chose, and why) comes first
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    setup = [line for line in lines if line.startswith("ci/setup.sh: ")]
    lines = [line for line in lines if line not in setup]
    assert done.returncode == 4 and "Traceback" not in done.stdout + done.stderr, (done.returncode, lines)
    assert len(lines) == 1 and named in lines[0], lines


@pytest.mark.parametrize(
    "expr, unknown",
    [("cpu and not slwo", "slwo"), ("smm90", "smm90"), ("sm90 or (cpu and not slow)", None), ("gsm8k", None)],
)
def test_a_marker_expression_naming_no_registered_marker_is_a_usage_error(expr, unknown):
    """pytest alone selects by an unknown marker silently: "not slwo" deselects nothing, "smm90" everything."""
    markers = ["cpu: runs on a CPU-only machine", "sm90: needs a Hopper GPU", "slow: long-running", "gsm8k: gates"]
    config = SimpleNamespace(option=SimpleNamespace(markexpr=expr), getini=lambda name: markers)
    session = SimpleNamespace(config=config)
    if unknown is None:
        options.pytest_sessionstart(session)
        return
    with pytest.raises(pytest.UsageError, match=rf"^-m {expr!r}: no marker {unknown!r} is registered"):
        options.pytest_sessionstart(session)


class _Config:
    """The options fixtures.plugin.options.check reads, as pytest's config would give them."""

    def __init__(self, **given):
        self.given = {"--impl": None, "--ep": None, "--hypothesis-profile": None, "markexpr": "", **given}

    def getoption(self, name, default=None):
        return self.given.get(name, default)


def raising_factory():
    """An implementation factory that raises (``--impl suites.harness.test_settings:raising_factory``)."""
    raise RuntimeError("no kernel here")


def _usage_error(monkeypatch, **given) -> str:
    monkeypatch.delenv("MOE_CONFORMANCE_IMPL", raising=False)
    monkeypatch.delenv("MOE_CONFORMANCE_EP", raising=False)
    with pytest.raises(pytest.UsageError) as err:
        options.check(_Config(**given))
    message = str(err.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize(
    "given, starts, also",
    [
        ({"--impl": ["nonexistent"]}, "--impl: unknown implementation 'nonexistent'", ["reference-ep"]),
        ({"--impl": ["reference-ep[nope]"]}, "--impl: reference-ep[nope]: unknown recipe", ["sm90_pull_fp8_blockwise"]),
        ({"--impl": ["faulty:nope@reference-ep"]}, "--impl: unknown fault 'nope'", ["scale_1e-2"]),
        ({"--hypothesis-profile": "device"}, "--hypothesis-profile 'device'", list(settings.PROFILE_NAMES)),
        ({"--ep": "1,x"}, "--ep '1,x': expected EP sizes", []),
        ({"--impl": ["reference-ep"], "--ep": "3"}, "--ep 3: no selected implementation supports EP3", []),
        ({"--impl": ["reference-ep"], "--ep": "1,3"}, "--ep 1,3: no selected implementation supports EP3", []),
        ({"--impl": [""]}, "--impl: names no implementation", ["reference-ep"]),
        ({"--impl": [","]}, "--impl: names no implementation", ["reference-ep"]),
        ({"--ep": ""}, "--ep '': expected EP sizes", []),
        ({"--hypothesis-profile": "default"}, "--hypothesis-profile 'default'", list(settings.PROFILE_NAMES)),
        (
            {"--impl": [f"{__name__}:raising_factory"]},
            f"--impl: {__name__}:raising_factory: its factory raised RuntimeError",
            [],
        ),
        ({"--impl": ["sys:exit"]}, "--impl: sys:exit: its factory raised SystemExit", []),
        (
            {"--impl": ["sm90_fp8_fp8_bf16_push_cuda+nope=1"]},
            "--impl: sm90_fp8_fp8_bf16_push_cuda+nope=1: unknown knob 'nope=1'",
            ["combine_dtype"],
        ),
        ({"--impl": ["sm90_fp8_fp8_bf16_push_cuda+"]}, "--impl: sm90_fp8_fp8_bf16_push_cuda+: no knob given", []),
    ],
    ids=[
        "unknown-impl",
        "unknown-recipe",
        "unknown-fault",
        "unknown-hypothesis-profile",
        "non-integer-ep",
        "unsupported-ep-3",
        "unsupported-ep-1,3",
        "empty-impl",
        "comma-impl",
        "empty-ep",
        "hypothesis-own-default-profile",
        "factory-raises",
        "factory-exits",
        "unknown-knob",
        "no-knob",
    ],
)
def test_a_bad_option_is_one_usage_error(monkeypatch, given, starts, also):
    message = _usage_error(monkeypatch, **given)
    assert message.startswith(starts) and all(word in message for word in also), message


def test_an_unknown_impl_from_the_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("MOE_CONFORMANCE_IMPL", "nonexistent")
    with pytest.raises(pytest.UsageError, match=r"^MOE_CONFORMANCE_IMPL: unknown implementation 'nonexistent'"):
        options.check(_Config())


def test_an_ep_size_some_selected_impls_support_stays_a_skip_for_the_others(monkeypatch):
    from fixtures.core.implementation import load
    from fixtures.core.selection import ep_skip_reason

    only8 = "sm100_bf16_bf16_bf16_rank_major_cuda"
    assert load(only8).contract.ep_sizes == (8,), "pick another EP8-only backend for this test"
    monkeypatch.delenv("MOE_CONFORMANCE_IMPL", raising=False)
    options.check(_Config(**{"--impl": [f"reference-ep,{only8}"], "--ep": "1,8"}))  # no usage error
    assert "does not support EP1" in ep_skip_reason(only8, load(only8).contract, 1)
    with pytest.raises(pytest.UsageError, match="no selected implementation supports EP1"):
        options.check(_Config(**{"--impl": [only8], "--ep": "1,8"}))


def test_the_docs_table_lists_users_variables_or_all_of_them():
    users, everything = settings.markdown_table(user_only=True), settings.markdown_table(user_only=False)
    for s in settings.DECLARED.values():
        assert f"`{s.name}`" in everything and (f"`{s.name}`" in users) == (s.audience == settings.USER), s.name


# ---------------------------------------------------------------- static: one place reads the environment
def _direct_reads(source: str) -> list[int]:
    """Lines where ``source`` reads a MOE_* variable from an environ mapping (os.environ, os.getenv, a parameter
    named environ), by literal name or through a module constant holding one."""
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    assigns = [n for n in nodes if isinstance(n, ast.Assign) and str(getattr(n.value, "value", "")).startswith("MOE_")]
    consts = {t.id for n in assigns for t in n.targets if isinstance(t, ast.Name)}

    def moe(node) -> bool:
        return str(getattr(node, "value", "")).startswith("MOE_") or getattr(node, "id", None) in consts

    def environ(node) -> bool:
        return ast.unparse(node).split(".")[-1] == "environ"

    def reads(n) -> bool:
        if isinstance(n, ast.Call) and n.args and moe(n.args[0]) and isinstance(n.func, ast.Attribute):
            return n.func.attr == "getenv" or (n.func.attr in ("get", "pop", "setdefault") and environ(n.func.value))
        if isinstance(n, ast.Subscript):
            return isinstance(n.ctx, ast.Load) and environ(n.value) and moe(n.slice)
        return isinstance(n, ast.Compare) and moe(n.left) and any(environ(c) for c in n.comparators)

    return [n.lineno for n in nodes if reads(n)]


def _project_files(*suffixes: str) -> list[Path]:
    """The project's own files (evidence/ aside: its logs and probes are history, not the product)."""
    folders = ("reference", "fixtures", "suites", "ci", "gates", "tools", "configs", ".github", ".ci")
    out = [ROOT / "conftest.py", ROOT / "pytest.ini", ROOT / "pyproject.toml"]
    out += [p for folder in folders for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted(p for p in out if p.suffix in suffixes)


def test_only_the_settings_module_reads_moe_variables_from_the_environment():
    found = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in _project_files(".py")
        if p != ROOT / "fixtures" / "settings.py"
        for line in _direct_reads(p.read_text())
    ]
    assert not found, "read these through fixtures.settings: " + ", ".join(found)


@pytest.mark.parametrize(
    "source",
    [
        'import os\nx = os.environ.get("MOE_X", "1")\n',
        'import os\nx = os.environ["MOE_X"]\n',
        'import os\nx = os.getenv("MOE_X")\n',
        'import os\nENV = "MOE_X"\nx = os.environ.get(ENV)\n',
        'def f(environ):\n    return environ.get("MOE_X")\n',
        'import os\nx = "MOE_X" in os.environ\n',
    ],
)
def test_the_static_check_sees_a_direct_read(source):
    assert _direct_reads(source) and not _direct_reads('import os\nos.environ["MOE_X"] = "1"\n')


def test_every_moe_name_in_code_and_scripts_is_declared():
    """A new variable in a script or module without a declaration (or a misspelt one) fails here."""
    files = [p for p in _project_files(".py", ".sh", ".yml", ".yaml", ".toml", ".ini") if p != Path(__file__)]
    files += [ROOT / ".ci" / "run"]  # CI's entry point, a script without a suffix
    used = {
        (m, p.relative_to(ROOT))
        for p in files
        for m in re.findall(r"\bMOE_[A-Z0-9_]+", p.read_text(errors="replace"))
        if not m.endswith("_")
    }
    undeclared = sorted(f"{name} ({path})" for name, path in used if name not in settings.DECLARED)
    assert not undeclared, "declare in fixtures/settings.py: " + ", ".join(undeclared)
