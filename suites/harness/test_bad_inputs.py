"""The mistakes people make with the ``python -m ci.*`` commands, run as they would run them: each gets its own exit
code (ci/cli.py: 4 unusable input, 6 could not complete, 5 nothing tested; never 0 and never a verdict's 1) and one
line on stderr that says what was wrong, with no traceback (the rows of issue 27's table, and their kin). And one
exit-code table for every command (ci.cli.EXIT_CODES): each ``python -m`` command of ci/, tools/ and gates/ (found by
its ``main`` and ``__main__`` block, called in this process) lists in its ``--help`` every code it returns, with the
table's meaning, and a bad argument is exit 4 with one line on stderr."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ci import api_diff, cli, nightly
from fixtures import arch
from gates.gsm8k.server import Server, ServerError, ServerSpec

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
LAYER = {"capacity": 16, "hidden": 64, "intermediate": 32, "num_experts": 8, "top_k": 2}
GATE = "model: toy\nrecipe: vllm\n"
NOBODY = "http://127.0.0.1:9"  # the discard port: nothing listens there


def _scenario(layer: dict | None = None, **batch) -> str:
    """A one-batch scenario's JSON: ``layer`` overrides LAYER's fields, ``batch`` the batch's."""
    body = {"layer": {**LAYER, **(layer or {})}, "ep_size": 1, "batches": [{"tokens": [4], **batch}]}
    return json.dumps(body, separators=(",", ":"))


def _servers(base: str, cand: str = f"{{name: c, url: '{NOBODY}'}}") -> str:
    return f"{GATE}baseline: {base}\ncandidate: {cand}\n"


@pytest.fixture
def refusing(request):
    """A server whose health path answers 200 (``status``: its code) and which refuses every completion (HTTP
    404, as a vLLM asked for a model it does not serve)."""
    status = getattr(request, "param", 200)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(status, b"{}")

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._send(404, b'{"error": "The model `toy` does not exist."}')

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


GATE_YAML, ONE_URL, IN = "ci.gsm8k_gate {tmp}/g.yaml", _servers(f"{{name: b, url: '{NOBODY}'}}"), cli.INPUT
GATE_OUT, INC, NIGHT = GATE_YAML + " --out {tmp}/out", cli.INCOMPLETE, "ci.nightly --no-latency --out {tmp}/night"
REPRO = "ci.repro --impl reference-ep --scenario "  # the scenarios' JSON holds no space
# one file for its pytest phase to collect, whose every test -k deselects (collecting the whole suite: +7 s)
NO_TEST = NIGHT + " --arch cpu -- suites/harness/test_bad_inputs.py -k no_test_is_named_so"
# (id, argv split at spaces, exit code, what the one line on stderr says); {tmp} is the test's folder,
# {url} the refusing server
ROWS = [
    ("compare-missing-folder", "ci.compare_runs {tmp}/nowhere {tmp}", IN, "incomparable"),
    ("compare-malformed-record", "ci.compare_runs {tmp}/a {tmp}/a", IN, "a/cases-main.jsonl line 1 is malformed"),
    ("compare-no-arguments", "ci.compare_runs", IN, "give OLD and NEW"),
    ("compare-no-records", "ci.compare_runs {tmp}/a {tmp}/a", IN, "incomparable: no per-case records or failures in"),
    ("gate-missing-config", "ci.gsm8k_gate {tmp}/none.yaml", IN, "cannot read the config"),
    ("gate-malformed-config", GATE_YAML, IN, "not valid YAML"),
    ("gate-incomplete-config", GATE_YAML, IN, "'baseline' is a required property; required: model, recipe, baseline"),
    ("gate-misspelt-key", GATE_YAML, IN, "'concurency' was unexpected); accepted: mode,"),
    ("gate-server-both-command-and-url", GATE_YAML, IN, "baseline: give exactly one of command"),
    ("gate-unknown-recipe", GATE_YAML, IN, "'vlm' is not one of"),
    # the default health_timeout_s: seconds, not startup_timeout_s's 1800
    ("gate-url-where-nothing-listens", GATE_OUT, INC, "did not answer 200 within 10 s"),
    ("gate-server-refuses-requests", GATE_OUT, INC, "refused a completion request: HTTP 404"),
    ("repro-malformed-json", REPRO + '{"batches":[', IN, "--scenario is not JSON"),
    ("repro-negative-tokens", REPRO + _scenario(tokens=[-5]), IN, "tokens/0: -5 is less than the minimum of 0"),
    ("repro-nan-input-scale", REPRO + _scenario(input_scale=float("nan")), IN, "input_scale is nan (not a finite"),
    ("repro-negative-clamp", REPRO + _scenario({"clamp_limit": -1.0}), IN, "clamp_limit -1.0 <= 0"),
    ("repro-unknown-weight-kind", REPRO + _scenario({"weight_kind": "nope"}), IN, "weight_kind 'nope' is none of"),
    (
        "repro-unknown-implementation",
        REPRO.replace("reference-ep", "nonexistent") + _scenario(),
        IN,
        "unknown implementation 'nonexistent'",
    ),
    ("routing-repro-malformed-json", "ci.repro_routing {", IN, "the case is not JSON"),
    ("backends-unknown-arch", "ci.backends sm91", IN, "unknown arch sm91; known arches: sm90, sm100"),
    ("api-diff-not-a-snapshot", "ci.api_diff {tmp}/a.json {tmp}/a.json", IN, "is not an API snapshot"),
    ("api-diff-null-sections", "ci.api_diff {tmp}/a.json {tmp}/a.json", IN, "mega_kernels, deprecated_kernel_aliases"),
    ("upgrade-check-no-such-environment", "ci.upgrade_check 0.7.4 {tmp}/nowhere", IN, "not a version, and no such"),
    ("nightly-unknown-arch", NIGHT + " --arch sm91", IN, "--arch sm91: expected one of sm90, sm100"),
    ("nightly-that-runs-no-test", NO_TEST, cli.NOTHING_TESTED, "RED: no test ran"),
    ("nightly-zero-examples", NIGHT + " --examples 0", IN, "--examples: '0': expected a number > 0"),
    ("nightly-phase-timeout-nan", NIGHT + " --phase-timeout nan", IN, "--phase-timeout: 'nan': expected a number > 0"),
    ("calibrate-zero-tokens", "tools.calibrate --tokens 0", IN, "--tokens: '0': expected a number > 0"),
    ("report-missing-folder", "ci.report {tmp}/gone", IN, "does not exist"),
    ("report-empty-folder", "ci.report {tmp}/empty", IN, "holds no results"),
    ("report-malformed-record", "ci.report {tmp}/r", IN, "is malformed"),
    ("report-out-is-a-file", "ci.report {tmp}/r --out {tmp}/f", IN, "/f: cannot make or write a folder there"),
    ("gate-out-is-a-file", GATE_YAML + " --out {tmp}/f", IN, "/f: cannot make or write a folder there"),
    ("report-record-not-an-object", "ci.report {tmp}/r", IN, "failures-main.jsonl line 1 is malformed (not a JSON"),
    ("report-folder-named-like-a-record", "ci.report {tmp}/r", IN, "cases-main.jsonl is a folder, named like a"),
    ("compare-record-without-its-fields", "ci.compare_runs {tmp}/a {tmp}/a", IN, "lacks a per-case record's impl"),
    ("time-budget-missing-folder", "ci.time_budget {tmp}/run", IN, "does not exist; give a results folder"),
    ("time-budget-empty-folder", "ci.time_budget {tmp}/run", cli.NOTHING_TESTED, "no test times"),
    ("time-budget-malformed-record", "ci.time_budget {tmp}/run", IN, "holds a malformed record or JUnit file"),
    ("time-budget-record-lacking-a-field", "ci.time_budget {tmp}/run", IN, "holds a malformed record or JUnit file"),
    ("outcomes-missing-file", "ci.outcomes {tmp}/nothing.xml", IN, "cannot read a JUnit file"),
    ("outcomes-xml-that-is-no-junit", "ci.outcomes {tmp}/x.xml", IN, "its root is <x>, not JUnit's"),
]
FILES = {  # what a row writes under the test's folder first
    "compare-malformed-record": {"a/cases-main.jsonl": '{"impl": \n'},
    "compare-no-records": {"a/env.json": "{}"},
    "outcomes-xml-that-is-no-junit": {"x.xml": "<x/>"},
    "gate-malformed-config": {"g.yaml": "model: [\n"},
    "gate-incomplete-config": {"g.yaml": GATE},
    "gate-misspelt-key": {"g.yaml": ONE_URL + "client: {concurency: 4}\n"},
    "gate-server-both-command-and-url": {"g.yaml": _servers(f"{{name: b, url: '{NOBODY}', command: 'vllm serve'}}")},
    "gate-unknown-recipe": {"g.yaml": ONE_URL.replace("vllm", "vlm")},
    "gate-url-where-nothing-listens": {"g.yaml": ONE_URL},
    "gate-server-refuses-requests": {"g.yaml": _servers("{name: b, url: '{url}'}")},
    "api-diff-not-a-snapshot": {"a.json": "{}"},
    "api-diff-null-sections": {"a.json": json.dumps(dict.fromkeys(api_diff.SECTIONS))},
    "report-empty-folder": {"empty/": ""},  # a name ending in "/": a folder
    "report-malformed-record": {"r/cases-main.jsonl": "{not json\n"},
    "report-record-not-an-object": {"r/failures-main.jsonl": "[1, 2]\n"},
    "report-out-is-a-file": {"r/env.json": "{}", "f": "a file"},
    "gate-out-is-a-file": {"g.yaml": ONE_URL, "f": "a file"},
    "report-folder-named-like-a-record": {"r/cases-main.jsonl/": "", "r/env.json": "{}"},
    "compare-record-without-its-fields": {"a/cases-main.jsonl": "{}\n"},
    "time-budget-empty-folder": {"run/": ""},
    "time-budget-malformed-record": {"run/tests-main.jsonl": '{"time": 1, "impl": \n'},
    "time-budget-record-lacking-a-field": {"run/tests-main.jsonl": '{"time": 1}\n'},
}
# the most seconds a row may take: 60, 120 for the commands that start pytest or load an implementation
SECONDS = {"gate-url-where-nothing-listens": 40, "gate-server-refuses-requests": 40, "nightly-that-runs-no-test": 300}


@pytest.mark.parametrize("name, argv, code, says", ROWS, ids=[row[0] for row in ROWS])
def test_a_bad_input_gets_its_own_exit_code_and_one_line(name, argv, code, says, tmp_path, request):
    seconds = SECONDS.get(name, 120 if name.startswith(("repro", "routing-repro", "nightly")) else 60)
    uses_url = "{url}" in argv + "".join(FILES.get(name, {}).values())
    url = request.getfixturevalue("refusing") if uses_url else ""  # started only where a row needs the server

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path)).replace("{url}", url)

    for path, text in FILES.get(name, {}).items():
        folder = (tmp_path / path) if path.endswith("/") else (tmp_path / path).parent
        folder.mkdir(parents=True, exist_ok=True)
        if not path.endswith("/"):
            (tmp_path / path).write_text(fill(text))
    argv = [fill(arg) for arg in argv.split()]
    started = time.monotonic()
    # in this process, as the --help and bad-argument tests call them (a traceback fails the test with it): the
    # __main__ blocks hand main's code to the shell (``returned``), and a process start per row cost the CPU tier 60 s
    # (reference.evidence.BAD_INPUTS_AND_FAILURE_REPORTS)
    returncode, stdout, stderr = call(argv[0], argv[1:])
    took = time.monotonic() - started
    said = [line for line in stderr.splitlines() if line.strip()]
    assert returncode == code and said and says in said[-1], f"exit {returncode}\n{stderr[-3000:]}"
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    if argv[0] != "ci.nightly":  # the nightly's progress goes to stdout, set-up's messages to stderr
        assert len(said) == 1, f"more than one line on stderr:\n{stderr[-3000:]}"
    assert took < seconds, f"took {took:.0f} s"


@pytest.mark.parametrize("refusing", [503], indirect=True)
def test_a_url_whose_health_path_refuses_is_named_in_seconds(refusing, tmp_path):
    spec = ServerSpec("b", url=refusing, health_timeout_s=1)
    started = time.monotonic()
    with pytest.raises(ServerError, match="did not answer 200 within 1 s .*last: HTTP 503"):
        Server(spec, "toy", tmp_path).wait_healthy()
    assert time.monotonic() - started < 10


def test_waiting_for_a_server_it_started_says_so(tmp_path, capsys):
    """A server the gate starts may load for minutes: the wait says where it is and how long it may take, and ends
    with the log's last line."""
    command = f"{sys.executable} -c \"print('loading weights', flush=True); import time; time.sleep(60)\""
    spec = ServerSpec("b", command=command, startup_timeout_s=2)
    with Server(spec, "toy", tmp_path) as server, pytest.raises(ServerError, match="not healthy .* within 2 s"):
        server.wait_healthy()
    assert "waiting up to 2 s" in capsys.readouterr().err


SKIPPED = '<testcase classname="suites.x" name="a"><skipped type="pytest.skip"/></testcase>'


@pytest.mark.parametrize(
    "junit, verdict",
    [
        ("", "no test ran"),
        (SKIPPED, "every one of its 1 tests"),
        (SKIPPED + '<testcase classname="suites.x" name="b"/>', None),
    ],
)
def test_a_night_that_tested_nothing_is_red(junit, verdict, tmp_path):
    (tmp_path / "junit.xml").write_text(f"<testsuites><testsuite>{junit}</testsuite></testsuites>")
    why = nightly.nothing_tested(tmp_path, "cpu")
    assert (why is None) if verdict is None else (verdict in why), why


# ---------------------------------------------------------------- one exit-code table for every command (ci.cli.EXIT_CODES)
# a bad argument of its own where the generic one would be taken for another program's (tools.bench_cases and
# ci.nightly hand the arguments they do not know to pytest)
BAD = {"tools.bench_cases": ["--from", "/nonexistent/results"], "ci.nightly": ["--phase-timeout", "soon"]}
GENERIC_BAD = ["--no-such-option"]
# words that name another class of code than the one listed beside them (a code meaning two things)
WRONG_CLASS = {
    cli.VERDICT: ("unusable", "malformed", "not there", "incomparable"),
    cli.INPUT: ("no gpu", "server did not", "regression", "reproduced", "could not complete"),
    cli.NOTHING_TESTED: ("malformed", "regression", "no gpu"),
    cli.INCOMPLETE: ("malformed", "not json", "unknown", "regression", "reproduced"),
}


def commands() -> list[str]:
    found = []
    for path in sorted([*(ROOT / "ci").glob("*.py"), *(ROOT / "tools").glob("*.py"), *(ROOT / "gates").rglob("*.py")]):
        text = path.read_text()
        if re.search(r"^def main\(", text, re.M) and re.search(r"^if __name__ == .__main__.:", text, re.M):
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


def call(module: str, argv: list[str]) -> tuple[int, str, str]:
    """``python -m module *argv`` in this process, from the checkout's root: (exit code, stdout, stderr); an exception
    other than SystemExit is left to fail the test with its traceback, as the shell would show it. The environment
    and working folder are restored after it."""
    out, err = io.StringIO(), io.StringIO()
    environ, cwd = dict(os.environ), os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = importlib.import_module(module).main(argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else cli.INTERNAL)
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
    return code, out.getvalue(), err.getvalue()


def returned(module: str) -> set[int]:
    """The codes a command's source can return: main's returns (cli constants, literals), its InputError and
    Incomplete, and what the ``__main__`` block hands to the shell must be main's own code."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    names = {
        name: getattr(cli, name) for name in "OK VERDICT INTERRUPTED INTERNAL INPUT NOTHING_TESTED INCOMPLETE".split()
    }
    raised = [ast.unparse(node.exc) for node in ast.walk(tree) if isinstance(node, ast.Raise) and node.exc is not None]
    codes = {cli.INPUT for r in raised if "cli.InputError" in r} | {
        cli.INCOMPLETE for r in raised if "cli.Incomplete" in r
    }
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    for node in ast.walk(main):
        if isinstance(node, ast.Return) and node.value is not None:
            for part in ast.walk(node.value):
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "cli":
                    codes.add(names[part.attr])
                elif isinstance(part, ast.Constant) and type(part.value) is int:
                    codes.add(part.value)
    guard = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    shell = ast.unparse(guard.body[-1])
    assert re.fullmatch(r"(sys\.exit|raise SystemExit)\(main\((sys\.argv\[1:\])?\)\)", shell), (
        f"{module}: its __main__ block ends `{shell}`, not handing main's exit code to the shell"
    )
    return codes


COMMANDS = commands()


def test_the_commands_are_found():
    found = {
        "ci.compare_runs",
        "ci.nightly",
        "ci.active_python",
        "tools.calibrate",
        "tools.gen_docs",
        "tools.strategy_reach",
    }
    assert found <= set(COMMANDS)


@pytest.mark.parametrize("script", ["ci/test.sh", "ci/conformance.sh"])
def test_the_scripts_help_lists_every_code_before_pytests_help(script):
    """The two scripts return set-up's 4 and 6 and pytest's 0 to 5: their --help lists all of them, with the table's
    meanings, and then pytest's help with the suite's options."""
    done = subprocess.run(["bash", script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == cli.OK and "exit codes:\n" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert cli.listed_codes(done.stdout.split("\nusage:")[0]) == cli.EXIT_CODES, done.stdout[:3000]
    assert "--impl" in done.stdout and "--results-dir" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("module", COMMANDS)
def test_help_lists_each_code_it_returns_with_the_tables_meaning(module):
    code, out, err = call(module, ["--help"])
    assert code == cli.OK and out.startswith("usage: python -m ") and "exit codes:\n" in out, out + err
    codes = cli.listed_codes(out)
    assert set(codes) <= set(cli.EXIT_CODES), f"{module} lists codes outside ci.cli.EXIT_CODES: {sorted(codes)}"
    assert cli.OK in codes and cli.INPUT in codes, f"{module} does not list 0 and 4 (a usage error): {sorted(codes)}"
    wrong = [
        f"{c}: {meaning!r} reads as another code's ({word!r})"
        for c, meaning in codes.items()
        for word in WRONG_CLASS.get(c, ())
        if word in meaning.lower()
    ]
    assert not wrong, f"{module}: " + "; ".join(wrong)
    unlisted = returned(module) - set(codes)
    assert not unlisted, f"{module} can return {sorted(unlisted)}, which its --help does not list: {sorted(codes)}"
    if module == "ci.backends":  # the names --impl takes beyond the listed ones
        assert "all " in out and "pkg.module:factory" in out, out


@pytest.mark.skipif(bool(arch.gpu_count("sm90")), reason="an SM90 GPU is here: the reproduction would run")
def test_a_reproduction_of_a_gpu_backend_without_its_gpu_is_no_verdict():
    """Exit 6 (no verdict) and one line, not a check's failure for want of CUDA, which read as the fault reproduced."""
    scenario = _scenario()
    code, out, err = call("ci.repro", ["--impl", "sm90_fp8_fp8_bf16_push_cuda", "--scenario", scenario])
    said = [line for line in err.splitlines() if line.strip()]
    assert code == cli.INCOMPLETE and len(said) == 1 and "needs an SM90 GPU" in said[0], (code, out[-500:], err[-2000:])


def test_a_gate_config_that_is_not_text_is_exit_4_and_one_line(tmp_path):
    (tmp_path / "g.yaml").write_bytes(b"\xff\xfe model: x\n")
    code, out, err = call("ci.gsm8k_gate", [str(tmp_path / "g.yaml"), "--out", str(tmp_path / "out")])
    said = [line for line in err.splitlines() if line.strip()]
    assert code == cli.INPUT and len(said) == 1 and "g.yaml is not text (not UTF-8)" in said[0], (code, err[-2000:])


def test_an_invalid_setting_a_command_reads_is_exit_4_and_one_line(monkeypatch, tmp_path):
    """A ``MOE_*`` value the command's code reads (here the gate's data folder) is unusable input, said in one line."""
    monkeypatch.setenv("MOE_GSM8K_DIR", str(tmp_path / "nowhere"))
    config = ROOT / "configs" / "gsm8k" / "qwen3-30b-a3b-vllm-megamoe.yaml"
    code, out, err = call("ci.gsm8k_gate", [str(config), "--out", str(tmp_path / "out")])
    said = [line for line in err.splitlines() if line.strip()]
    assert code == cli.INPUT and len(said) == 1 and "MOE_GSM8K_DIR=" in said[0], (code, out[-500:], err[-2000:])


@pytest.mark.parametrize("module", COMMANDS)
def test_a_bad_argument_is_exit_4_and_one_line(module):
    code, out, err = call(module, BAD.get(module, GENERIC_BAD))
    said = [line for line in err.splitlines() if line.strip()]
    assert code == cli.INPUT, f"{module}: exit {code}, not {cli.INPUT}\n{err[-2000:]}"
    assert len(said) == 1 and "Traceback" not in out + err, f"{module}: stderr is not one line:\n{err[-2000:]}"
