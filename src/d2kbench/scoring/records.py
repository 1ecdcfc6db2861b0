"""Plain-data inputs of run scoring: agent runs and their evaluated candidates.

The report loader builds these from the store's ``runs``, ``candidates`` and ``results`` rows;
tests build them directly. Latencies are per-call means in ms, unrounded.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

#: Guidance levels of the cumulative ablation, in order (SPEC.md section 4).
GUIDANCE_LEVELS = ("none", "L1", "L1+L2", "L1+L2+L3")
#: The two settings of the paired runs (SPEC.md section 4).
UNGUIDED, GUIDED = "none", "L1+L2+L3"


def guidance_rank(guidance: str) -> tuple[int, str]:
    """Sort key: the ablation order of GUIDANCE_LEVELS, other settings after it by name."""
    return (GUIDANCE_LEVELS.index(guidance), "") if guidance in GUIDANCE_LEVELS else (len(GUIDANCE_LEVELS), guidance)


#: Independent-design runs: no code, judged only (SPEC.md section 4); never performance-scored.
DESIGN = "design"


class CandidateRecord(BaseModel):
    """One submission of a run, as the harness evaluated it.

    ``eligible``: every workload passed every check. ``latencies_ms``: timed workload id ->
    per-call mean latency (ms); empty for a candidate that failed or was not timed.
    """

    model_config = ConfigDict(frozen=True)

    id: int
    turn: int
    eligible: bool
    latencies_ms: dict[str, float] = {}
    sha256: str = ""


class RunRecord(BaseModel):
    """One agent run (task, model, backend, guidance, seed) and its candidates."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    task: str
    model: str
    guidance: str
    campaign: str | None = None
    backend: str = ""
    seed: int = 0
    budget_turns: int = 0
    status: str = "finished"
    candidates: list[CandidateRecord] = []
