"""Scores: speedup, geomean, S_perf, fast_p, trajectories, SOL and roofline (SPEC.md section 3)."""
