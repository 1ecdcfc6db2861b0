"""Campaigns: plans of agent runs (paired / cumulative ablations), executed on a local pool or
on Ray, resumable after a crash without redoing a finished run or losing a result."""
