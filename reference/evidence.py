"""The validation logs that tolerances, findings and descriptors cite, one constant each (index: docs/evidence.md).

A log is ``evidence/<day>-<name>.md``, its committed raw records ``evidence/raw/<day>-<name>/``; each day is
spelled once, below. The code only names these paths: nothing here reads them.
"""

from __future__ import annotations

_NOV29 = "evidence/2026-11-29-"  # links into the logs of FlashInfer 0.7.2.post1's SM90 kernels at EP1 to EP8
_DEC01 = "evidence/2026-12-01-"  # links into the logs of the README command, 0.7.4's calibration, FP4 and the upgrade
_DEC02 = "evidence/2026-12-02-"  # links into the logs of the nightly, the megamoe and exact cases
_DEC03 = "evidence/2026-12-03-"  # links into the logs of the exact cases on built kernels and xdist on one GPU
_DEC04 = "evidence/2026-12-04-"  # links into the logs of the CuTe DSL compiles, pool warm-ups and GPU-host workers
_DEC05 = "evidence/2026-12-05-"  # links into the logs of the layered tree, the -m sm90 layouts and an H100's memory

H200_072 = _NOV29 + "h200-sm90.md"  # 0.7.2.post1's three SM90 kernels, EP1 to EP8; findings F1-F9
README_COMMAND_H200 = _DEC01 + "h200-pytest-m-sm90.md"  # the README command on a fresh H200; F10
FP8_ACCUMULATION = _DEC01 + "h200-fp8-accumulation-and-few-tokens.md"  # few-token bounds; F11, F12 (accum_probe)
FLASHINFER_074_CALIBRATION = _DEC01 + "h200-flashinfer-0.7.4-first-calibration.md"  # BF16 pull, F13, F14, floors
PUSH_CUDA_AND_IDLE_POOLS = _DEC01 + "h200-push-cuda-and-idle-pools.md"  # push_cuda re-measured, F12 under 0.7.4
GREEN_FLOORS_HELD = _DEC01 + "h200-green-floors-held.md"  # green; systematic floors held (0 false alarms)
FP4_PULL_AND_UPGRADE = _DEC01 + "h200-fp4-pull-and-upgrade.md"  # the FP8 x FP4 pull kernels; the upgrade check
AOT_CRASH_AND_CUT_SHORT = _DEC01 + "h200-aot-crash-and-cut-short.md"  # AOT modules without libcuda; a run cut short
NIGHTLY_GREEN = _DEC02 + "h200-nightly-green.md"  # the nightly, green: every SM90 backend and finding
RESTRUCTURE_UNCHANGED = _DEC02 + "h200-restructure-unchanged.md"  # after the restructuring: the nightly's counts
AOT_BUILT_ON_CPU = _DEC01 + "aot-modules-built-on-cpu.md"  # AOT modules built on CPU, the toolkit parts they need
MEGAMOE_EXACT = _DEC02 + "h200-megamoe-exact.md"  # flashinfer.megamoe MXFP4 at EP1, the exact cases; F18
MEGAMOE_ON_CPU = _DEC02 + "cpu-megamoe-and-exact-cases.md"  # the CPU tier with flashinfer.megamoe; F15-F17
EXACT_EVERY_BACKEND = _DEC02 + "h200-exact-every-backend.md"  # the exact cases on every SM90 backend; push_cake's wire
CPU_CHECKS_ON_BROKEN_INPUT = _DEC02 + "cpu-tier-checks-on-broken-input.md"  # the CPU tier; new checks failing
EXACT_AND_COMPILE_COSTS = _DEC03 + "sm90-exact-cases-and-compile-costs.md"  # -m sm90 on a bare host; compile costs
XDIST_ON_ONE_GPU = _DEC03 + "sm90-three-xdist-workers.md"  # three xdist workers on one GPU (not adopted)
CPU_TIER_WORKERS = _DEC04 + "cute-dsl-compile-counts-and-cpu-workers.md"  # CuTe DSL compiles; two CPU workers
POOL_WARMUPS = _DEC04 + "sm90-pool-warmups.md"  # pools warm their layers ahead; -m sm90 green in 1024 s
GPU_MEMORY_FULL = _DEC04 + "sm90-two-workers-memory-full.md"  # two workers, pools ahead by cores: GPU memory full
GPU_HOST_WORKERS = _DEC04 + "sm90-three-workers-and-fp4-accumulation.md"  # -m sm90 in 560 s on three workers; FP4
PLAIN_PYTEST = _DEC05 + "plain-pytest-and-declared-ranges.md"  # pytest 9.2 and xdist groups; newest versions
SM90_LAYERED_TREE = _DEC05 + "sm90-layered-tree.md"  # -m sm90 red after the ledger: static scales, GPU ledger gaps
SM90_SEPARATE_POOLS = _DEC05 + "sm90-separate-pools.md"  # -m sm90 in 695 s, the ledger on its own pools; F20
CPU_TIER_SAME_DAY = _DEC05 + "cpu-tier-same-day.md"  # the fresh-clone CPU tier, same day: 610 s, then 551 s
HARNESS_TRIM = _DEC05 + "harness-tests-merged-and-dropped.md"  # every harness test id merged, renamed or dropped
SM90_LAYOUT_FORECAST = _DEC05 + "sm90-layout-by-ep-size-forecast.md"  # workers by EP size: a forecast, not a run
BAD_INPUTS_AND_FAILURE_REPORTS = _DEC05 + "bad-inputs-and-failure-reports.md"  # users' reads: bad inputs, reports
SM90_H100_ORACLE_MEMORY = _DEC05 + "sm90-h100-oracle-memory.md"  # -m sm90 on an H100: the oracle out of memory
SM90_H200_OVER_TEN_MINUTES = _DEC05 + "sm90-h200-green-over-ten-minutes.md"  # -m sm90 green, forecast counts, 633 s
SETUP_AND_REPRODUCTION = _DEC05 + "setup-and-reproduction-reviews.md"  # set-up, reproductions; the CPU tier
SM90_H100_FOUR_WORKERS = _DEC05 + "sm90-h100-four-workers-slower.md"  # one H100: four workers 706 s, three 581 s
DRAWS_WITHOUT_LOCAL_CONSTANTS = _DEC05 + "draws-without-local-constants.md"  # draws free of the modules loaded
SM90_LEDGER_REDRAWN = _DEC05 + "sm90-h100-ledger-redrawn.md"  # -m sm90 in 508 s on a fresh H100; the ledger redrawn
SM90_H100_FORECAST_COUNTS = _DEC05 + "sm90-h100-forecast-counts.md"  # -m sm90 green in 492 s, the derived counts

LOGS = (
    SM90_H100_FORECAST_COUNTS,
    SM90_LEDGER_REDRAWN,
    DRAWS_WITHOUT_LOCAL_CONSTANTS,
    SM90_H100_FOUR_WORKERS,
    SETUP_AND_REPRODUCTION,
    SM90_H200_OVER_TEN_MINUTES,
    SM90_H100_ORACLE_MEMORY,
    BAD_INPUTS_AND_FAILURE_REPORTS,
    SM90_LAYOUT_FORECAST,
    CPU_TIER_SAME_DAY,
    SM90_SEPARATE_POOLS,
    SM90_LAYERED_TREE,
    HARNESS_TRIM,
    PLAIN_PYTEST,
    H200_072,
    README_COMMAND_H200,
    FP8_ACCUMULATION,
    FLASHINFER_074_CALIBRATION,
    PUSH_CUDA_AND_IDLE_POOLS,
    GREEN_FLOORS_HELD,
    FP4_PULL_AND_UPGRADE,
    AOT_CRASH_AND_CUT_SHORT,
    NIGHTLY_GREEN,
    RESTRUCTURE_UNCHANGED,
    AOT_BUILT_ON_CPU,
    MEGAMOE_EXACT,
    MEGAMOE_ON_CPU,
    EXACT_EVERY_BACKEND,
    CPU_CHECKS_ON_BROKEN_INPUT,
    EXACT_AND_COMPILE_COSTS,
    XDIST_ON_ONE_GPU,
    CPU_TIER_WORKERS,
    POOL_WARMUPS,
    GPU_MEMORY_FULL,
    GPU_HOST_WORKERS,
)


def _raw(day: str, name: str) -> str:
    return day.replace("evidence/", "evidence/raw/") + name


RAW_FLASHINFER_074_CALIBRATION = _raw(_DEC01, "flashinfer-0.7.4-first-calibration")  # what ci.report's tests read
RAW_GREEN_FLOORS_HELD = _raw(_DEC01, "green-floors-held")  # two latency runs of one lease, two minutes apart
RAW_NIGHTLY_GREEN = _raw(_DEC02, "nightly-green")  # the nightly's folder: report, JUnit, latency table
RAW_RESTRUCTURE_UNCHANGED = _raw(_DEC02, "restructure-unchanged")  # bash ci/test.sh -m sm90 after the restructuring
RAW_SM90_LAYERED_TREE = _raw(_DEC05, "sm90-layered-tree")  # ledger-matrix.json: each (ledger row, kernel) outcome
RAW_SM90_SEPARATE_POOLS = _raw(_DEC05, "sm90-separate-pools")  # ledger-matrix.json, sweep.jsonl (F20)
RAW_SM90_LEDGER_REDRAWN = _raw(_DEC05, "sm90-h100-ledger-redrawn")  # ledger-matrix.json under today's draws
RAW = (
    RAW_SM90_LEDGER_REDRAWN,
    RAW_SM90_SEPARATE_POOLS,
    RAW_FLASHINFER_074_CALIBRATION,
    RAW_GREEN_FLOORS_HELD,
    RAW_NIGHTLY_GREEN,
    RAW_RESTRUCTURE_UNCHANGED,
    RAW_SM90_LAYERED_TREE,
)
