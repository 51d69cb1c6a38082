"""The nightly GPU job in one command: every backend of this machine's arch at every EP size that fits, under
the nightly hypothesis profile, into one results folder with a report people read.

    python -m ci.nightly [--out results/nightly-DATE] [--arch sm90] [--examples N] [--no-latency] [--baseline DIR]
                         [-- PYTEST ARGS]

It detects the GPUs (count and arch) and runs each pytest phase through ``bash ci/test.sh``, the README's test
command (its set-up, ini and defaults; the nightly adds its profile, the progress lines and the results folder):
  1. with one GPU (or none): ``bash ci/test.sh -m ARCH --ep 1,2,4,8`` (``junit.xml``), over the workers ci/test.sh
     picks (``MOE_WORKERS``: on a GPU, with model layers at every EP size, the rank-pool tests on one; without one
     each implementation on one); with several, EP1 (``pytest -m ARCH --ep 1``) spread over one pytest-xdist
     worker per GPU (``--dist loadgroup``: each rank pool's tests on one worker), each worker and its rank pools
     pinned to its GPU (``junit-ep1.xml``), then EP2/4/8 (``pytest -m "ARCH and ep" --ep 2,4,8``) in one process
     that sees every GPU (``junit-ep2-8.xml``): a backend takes a GPU per rank where there are enough and shares
     GPU 0 where it may and there are not (fixtures.pools.placement; each per-case record says which);
  2. ``python -m tools.bench_latency`` (a GPU only), then ``python -m ci.report``.
The folder holds the JUnit files, the per-case records, ``env.json`` (versions, GPUs,
driver, commit, each phase's wall time), ``api.json`` (the FlashInfer API snapshot, for ci.compare_runs),
``latency.json``, ``report.md``, ``report.html`` and ``plots/``; with ``--baseline`` (a previous night's folder) the
report opens with ci.compare_runs' verdict against it (the exit code stays the night's own). Where
``$GITHUB_STEP_SUMMARY`` is set, report.md is appended to it. ``--arch cpu`` runs the CPU tier the same way (the
job's own test). Exit codes (CODES): a night that tested nothing is red too.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

from ci import ROOT, cli
from fixtures import settings


CODES = {
    0: "every phase passed, and tests ran",
    1: "a phase failed (tests failed, crashed or timed out)",
    cli.INPUT: "unusable input: a bad argument (--baseline not a folder), a bad setting set-up names, or "
    "arguments a phase's pytest refused (its usage error)",
    cli.INCOMPLETE: "no GPU of a known arch here (say --arch cpu for the CPU tier), or set-up could not install",
    cli.NOTHING_TESTED: "nothing tested: no test ran, or every test skipped",
}


def gpus(arch: str) -> list[int]:
    """The CUDA device indices of this machine's GPUs of ``arch`` (empty for the CPU)."""
    from fixtures import arch as arches

    if arch not in arches.ARCH_MARKERS:
        return []
    return [i for i, cc in enumerate(arches.capabilities()) if arches.ARCH_MARKERS[arch](cc)]


def environment(devices: list[int]) -> dict:
    import importlib.metadata as md

    import torch

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    def command(*argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        **{n: version(n) for n in ("flashinfer-python", "nvidia-cutlass-dsl", "hypothesis", "pytest", "pytest-xdist")},
        "gpus": [torch.cuda.get_device_name(i) for i in devices],
        "driver": command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").split("\n")[0],
        "commit": command("git", "rev-parse", "HEAD"),
        "dirty": bool(command("git", "status", "--porcelain")),
    }


def phase_commands(arch: str, devices: list[int], out: Path, extra: list[str]) -> list[tuple[str, list, dict]]:
    """(name, argv, extra environment) per pytest phase. One GPU or none: one phase at every EP size, as ci/test.sh
    runs it (on a GPU, with the nightly's model layers at every EP size, its workers keep every rank-pool test on one;
    without one each implementation on one, so the
    EP-invariance checks compare each EP size with EP1 of the same process). Several: EP1 spread over a
    worker per GPU, then the EP > 1 cases only (``-m "ARCH and ep"``: the tests that take no EP size ran
    in the first phase), whose EP-invariance checks skip saying EP1 ran in another process."""
    base = [
        "bash",
        str(ROOT / "ci" / "test.sh"),
        "-p",
        "fixtures.plugin.progress",
        "-p",
        "no:cacheprovider",
        "--results-dir",
        str(out),
        "-rsx",
    ]
    if len(devices) <= 1:
        return [("all", [*base, "-m", arch, "--ep", "1,2,4,8", "--junitxml", str(out / "junit.xml"), *extra], {})]
    ep1 = [
        *base,
        "-m",
        arch,
        "--ep",
        "1",
        "--junitxml",
        str(out / "junit-ep1.xml"),
        "-n",
        str(len(devices)),
        "--dist",
        "loadgroup",
    ]
    # -p fixtures.plugin.options: a replacement for a crashed xdist worker parses the command line before any conftest
    # (ci/test.sh says more)
    ep1 += ["-p", "fixtures.plugin.options"]
    env1 = {
        settings.PIN_WORKER_GPU.name: "1",
        settings.GPU_LIST.name: ",".join(map(str, devices)),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    rest = [*base, "-m", f"{arch} and ep", "--ep", "2,4,8", "--junitxml", str(out / "junit-ep2-8.xml")]
    return [("ep1", [*ep1, *extra], env1), ("ep2-8", [*rest, *extra], {})]


def run(cmd: list, env: dict, log: Path, timeout: float) -> tuple[int, float, str]:
    """Run a phase, its output into ``log``; the progress lines (fixtures.plugin.progress) also to this console. Returns
    the exit status, the seconds and the last line of output: where a process dies without a summary (the dynamic
    loader's "symbol lookup error", exit 127, on the H200) that line is the only word on why."""
    started, last = time.monotonic(), ""
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                fh.write(line)
                last = line.strip() or last
                if "[progress]" in line:
                    print(line[line.index("[progress]") :].rstrip(), flush=True)
            code = proc.wait()
        finally:
            timed_out = not timer.is_alive()
            timer.cancel()
    return (124 if timed_out and code != 0 else code), round(time.monotonic() - started, 1), last[-400:]


def nothing_tested(out: Path, arch: str) -> str | None:
    """Why a night whose phases all passed tested nothing (no test ran, or every test skipped), else None: such a
    night is red, since a green one must have tested something."""
    from fixtures import arch as arches
    from fixtures.core.results import junit_outcomes

    outcomes = junit_outcomes(out)
    known = (
        ""
        if arch in (*arches.ARCH_MARKERS, "cpu")
        else f" ({arch} is no arch the suite knows: {', '.join(arches.ARCH_MARKERS)}, cpu)"
    )
    if not outcomes:
        return f"no test ran{known}"
    if all(outcome == "skipped" for outcome in outcomes.values()):
        return f"every one of its {len(outcomes)} tests skipped{known}: the report lists why"
    return None


def write_report(out: Path, baseline: Path | None, environ=None) -> None:
    """The night's report (against ``baseline``, a previous night's folder, if given), also as the job summary
    where ``$GITHUB_STEP_SUMMARY`` is set."""
    from ci import report, report_baseline

    for path in report.write(out, baseline):
        print(f"nightly: wrote {path}", flush=True)
    if report_baseline.job_summary(out / "report.md", environ):
        print("nightly: appended report.md to the job summary ($GITHUB_STEP_SUMMARY)", flush=True)


def main(argv=None) -> int:
    p = cli.Parser("ci.nightly", description=__doc__.splitlines()[0], codes=CODES)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--arch", default=None, help="default: this machine's GPU arch (sm90, ...); 'cpu' for the CPU tier")
    p.add_argument("--profile", default=settings.HYPOTHESIS_PROFILE.raw() or "nightly")  # pytest checks it
    p.add_argument(
        "--examples", type=cli.positive(int), default=None, help="cap the hypothesis examples (MOE_HYPOTHESIS_EXAMPLES)"
    )
    p.add_argument("--no-latency", action="store_true")
    p.add_argument("--phase-timeout", type=cli.positive(float), default=6 * 3600, help="seconds a phase may take")
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a previous night's folder: the report opens with ci.compare_runs' verdict against it",
    )
    a, extra = p.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]
    if a.baseline and not a.baseline.is_dir():  # before hours of tests, not after
        p.error(f"--baseline {a.baseline} is not a folder: give a previous night's results folder")
    # set-up's messages (which cached modules it installed, which it left out) go to this job's log
    setup = subprocess.run(["bash", "ci/setup.sh"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if setup.returncode:  # it said why on stderr, in one line: a bad setting (4) or it could not install (6)
        return setup.returncode if setup.returncode in (cli.INPUT, cli.INCOMPLETE) else cli.INCOMPLETE
    python = setup.stdout.strip()
    if importlib.util.find_spec("torch") is None:  # a bare interpreter: go on in the suite's environment
        os.execv(python, [python, "-m", "ci.nightly", *(sys.argv[1:] if argv is None else argv)])
    from fixtures import arch as arches

    arch = a.arch or arches.local_arch()
    if arch is None:
        print("no GPU of a known arch here: say --arch cpu to run the CPU tier as a nightly job", file=sys.stderr)
        return cli.INCOMPLETE
    if arch not in (*arches.ARCH_MARKERS, "cpu"):  # pytest 9.2 refuses an unknown marker in -m: say so here first
        print(
            f"python -m ci.nightly: --arch {arch}: expected one of {', '.join(arches.ARCH_MARKERS)}, cpu",
            file=sys.stderr,
        )
        return cli.INPUT
    devices = gpus(arch)
    out = cli.make_folder(a.out or ROOT / "results" / f"nightly-{datetime.date.today().isoformat()}", "--out")
    env_info = environment(devices)
    env_info.update(arch=arch, profile=a.profile, examples=a.examples, phases={})
    try:
        from tools.snapshot_flashinfer_api import snapshot

        (out / "api.json").write_text(json.dumps(snapshot(), indent=1, sort_keys=True))
    except Exception as err:  # noqa: BLE001 (no FlashInfer here: the report says so)
        env_info["api_snapshot"] = f"not taken: {type(err).__name__}: {err}"
    common = {
        settings.HYPOTHESIS_PROFILE.name: a.profile,
        **({settings.HYPOTHESIS_EXAMPLES.name: str(a.examples)} if a.examples else {}),
    }
    log, worst, refused = out / "nightly.log", 0, False
    print(f"nightly: {arch}, {len(devices)} GPU(s), profile {a.profile}, results in {out}", flush=True)
    for name, cmd, env in phase_commands(arch, devices, out, extra):
        print(f"nightly: phase {name}: {' '.join(cmd)}", flush=True)
        code, seconds, last = run(cmd, {**common, **env}, log, a.phase_timeout)
        env_info["phases"][name] = {"exit": code, "seconds": seconds, "last_line": last}
        print(f"nightly: phase {name} exit {code} after {seconds} s", flush=True)
        worst = worst if code in (0, 5) else max(worst, 1)  # 5, nothing collected: judged below, by what ran
        refused |= code == cli.INPUT  # pytest's usage error: the arguments or a setting, not the kernels
    if devices and not a.no_latency:
        code, seconds, last = run(
            [python, "-m", "tools.bench_latency", "--json", str(out / "latency.json")], common, log, a.phase_timeout
        )
        env_info["phases"]["latency"] = {"exit": code, "seconds": seconds, "last_line": last}
    (out / "env.json").write_text(json.dumps(env_info, indent=1))
    write_report(out, a.baseline)
    if refused:
        print(
            "nightly: a phase's pytest refused its arguments or a setting (exit 4; nightly.log says which)",
            file=sys.stderr,
            flush=True,
        )
        return cli.INPUT
    empty = nothing_tested(out, arch) if worst == 0 else None
    if empty:
        print(f"nightly: RED: {empty}", file=sys.stderr, flush=True)
        return cli.NOTHING_TESTED
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
