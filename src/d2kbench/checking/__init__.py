"""The checking core: a call's inputs (:mod:`~d2kbench.checking.inputs`), its expected values
(:mod:`~d2kbench.checking.expected`), the numerical and structural checks
(:mod:`~d2kbench.checking.checks`) and the verdict of a call and a workload
(:mod:`~d2kbench.checking.verdict`). Used by the harness and by the integrity protocol; imports
only the task schema and the evaluation records (docs/architecture.md).
"""
