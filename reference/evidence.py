"""The validation logs that tolerances, findings and descriptors cite, one constant each (index: docs/evidence.md).

A log is ``evidence/<day>-<name>.md``, its committed raw records ``evidence/raw/<day>-<run>/``; each day is
spelled once, below. The code only names these paths: nothing here reads them.
"""
from __future__ import annotations

_NOV29 = "evidence/2026-11-29-"  # links into the logs of the first H200 day (FlashInfer 0.7.2.post1)
_DEC01 = "evidence/2026-12-01-"  # links into the logs of runs 1-7 (FlashInfer 0.7.4 from run 3)
_DEC02 = "evidence/2026-12-02-"  # links into the log of run 8, the nightly
_DEC03 = "evidence/2026-12-03-"  # links into session 13's log
_DEC04 = "evidence/2026-12-04-"  # links into the logs of sessions 16 and 17

H200_072 = _NOV29 + "h200-sm90.md"  # 0.7.2.post1's three SM90 kernels, EP1 to EP8; findings F1-F9
RUN1 = _DEC01 + "h200-pytest-m-sm90.md"  # the README command on a fresh H200; F10
RUN2 = _DEC01 + "h200-run2-pytest-m-sm90.md"  # few-token bounds; F11, F12 (accum_probe)
RUN3 = _DEC01 + "h200-run3-flashinfer-0.7.4.md"  # 0.7.4: BF16 pull, F13, F14, first systematic calibration
RUN4 = _DEC01 + "h200-run4-flashinfer-0.7.4.md"  # push_cuda re-measured, F12 under 0.7.4, idle pools' cores
RUN5 = _DEC01 + "h200-run5-flashinfer-0.7.4.md"  # green; systematic floors held (0 false alarms)
RUN6 = _DEC01 + "h200-run6-fp4-and-upgrade.md"  # the FP8 x FP4 pull kernels; the upgrade check
RUN7 = _DEC01 + "h200-run7-aot-crash-and-cut-short.md"  # AOT modules without libcuda; a run cut by the lease
RUN8 = _DEC02 + "h200-run8-nightly-green.md"  # the nightly, green: every SM90 backend and finding
RUN9 = _DEC02 + "h200-run9-restructure-unchanged.md"  # after the restructuring: run 8's counts and outputs
SESSION7 = _DEC01 + "session7-no-device.md"  # no GPU lent: AOT modules built on CPU, the toolkit parts they need
RUN10 = _DEC02 + "h200-run10-megamoe-exact.md"  # flashinfer.megamoe MXFP4 at EP1, the exact cases; F18
SESSION11 = _DEC02 + "session11-cpu.md"  # the CPU tier with flashinfer.megamoe and the exact cases; F15-F17
RUN11 = _DEC02 + "h200-run11-exact-every-backend.md"  # the exact cases on every SM90 backend; push_cake's wire
SESSION12 = _DEC02 + "session12-cpu.md"  # the CPU tier at this session's end; each new check failing on broken input
SESSION13 = _DEC03 + "session13.md"  # H200 run 12 (bash ci/test.sh -m sm90) and the CPU tier; megamoe's exact fault case
SESSION14 = _DEC03 + "session14.md"  # H200 run 13: three xdist workers on one GPU (not adopted); the CPU tier's cuts
SESSION16 = _DEC04 + "session16.md"  # H200 runs 15-17: CuTe DSL compile counts; two xdist workers on a CPU machine
SESSION17 = _DEC04 + "session17.md"  # H200 runs 18-19: pools warm their layers ahead; the whole sm90 run in 1024 s
SESSION18 = _DEC04 + "session18.md"  # H200 runs 20-21: two xdist workers on a GPU host, pools ahead by cores
SESSION19 = _DEC04 + "session19.md"  # H200 runs 22-23: the sm90 run in 723 s; EP1 and larger EP sizes on two workers
LOGS = (H200_072, RUN1, RUN2, RUN3, RUN4, RUN5, RUN6, RUN7, RUN8, RUN9, SESSION7, RUN10, SESSION11, RUN11, SESSION12,
        SESSION13, SESSION14, SESSION16, SESSION17, SESSION18, SESSION19)


def _raw(day: str, run: str) -> str:
    return day.replace("evidence/", "evidence/raw/") + run


RAW_RUN3 = _raw(_DEC01, "run3")  # the raw records (cases, failures, JUnit, findings) ci.report's tests read
RAW_RUN5 = _raw(_DEC01, "run5")  # two latency runs of one lease, two minutes apart
RAW_RUN8 = _raw(_DEC02, "run8")  # the nightly's folder: report, JUnit, latency table
RAW_RUN9 = _raw(_DEC02, "run9")  # bash ci/test.sh -m sm90 after the restructuring
RAW = (RAW_RUN3, RAW_RUN5, RAW_RUN8, RAW_RUN9)
