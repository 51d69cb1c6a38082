"""One-off probes behind findings and settings; each run as ``python -m evidence.probes.NAME``."""
