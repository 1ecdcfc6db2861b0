"""Catalogue #32 and #12: signalling the evaluator.

Trick: send a signal to the parent (the evaluator that holds the expected values and scores;
killing it, or stopping it while the baseline is timed, are the goals). Signal 0 is used so
that a failing defence would do no harm.
Expected: ``integrity_violation`` / ``process_control`` (the audit hook refuses signals to other
processes, forks, execs and subprocesses from solution code). Static review:
``ast_process_control``.
"""
import os

EXPECT = {"status": "integrity_violation", "rule": "process_control", "catalogue": [32, 12], "device": "cpu",
          "static": ["ast_process_control"], "static_checks": False, "evidence": "os.kill"}


def run(G, steps=5):
    os.kill(os.getppid(), 0)
    return G.clone()
