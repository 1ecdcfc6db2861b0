"""Evaluation harness: inputs, isolated worker, checks, timing, ``evaluate()``."""
