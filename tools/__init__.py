"""Maintainer tools: calibration, API snapshots, FlashInfer AOT builds and benchmarks, each run as
``python -m tools.NAME`` from the checkout. CI and users run ``ci/``; these produce what it reads."""
