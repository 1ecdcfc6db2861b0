"""Scores: speedup, geomean, S_perf, fast_p, trajectories, SOL and roofline (docs/protocol.md)."""
