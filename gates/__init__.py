"""Accuracy gates: end-to-end checks of a served model with a candidate backend against a baseline."""
