"""Plain-data inputs of run scoring: agent runs and their evaluated candidates.

The report loader builds these from the store's ``runs``, ``candidates`` and ``results`` rows;
tests build them directly. Latencies are per-call means in ms, unrounded.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

#: Guidance levels of the cumulative ablation, in order (docs/protocol.md, "Runs").
GUIDANCE_LEVELS = ("none", "L1", "L1+L2", "L1+L2+L3")
#: The two settings of the paired runs (docs/protocol.md, "Runs").
UNGUIDED, GUIDED = "none", "L1+L2+L3"


def guidance_rank(guidance: str) -> tuple[int, str]:
    """Sort key: the ablation order of GUIDANCE_LEVELS, other settings after it by name."""
    return (GUIDANCE_LEVELS.index(guidance), "") if guidance in GUIDANCE_LEVELS else (len(GUIDANCE_LEVELS), guidance)


#: Guidance levels of each campaign design (``custom`` plans name their own).
DESIGNS = {"paired": (UNGUIDED, GUIDED), "ablation": GUIDANCE_LEVELS}

#: Independent-design runs: no code, judged only (docs/protocol.md, "Runs"); never performance-scored.
DESIGN = "design"


#: Status of a candidate that reproduces one of its task's held-back solutions
#: (:mod:`d2kbench.agents.leaks`): recorded, never eligible, named by every report.
HELD_BACK_COPY = "held_back_copy"


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
    """One agent run (task, model, backend, guidance, seed) and its candidates.

    ``incomplete``: descriptions of the run's candidates left out because their evaluation is
    not complete (still running or interrupted); the run is scored from the others, and every
    table that scores it says so.
    """

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
    incomplete: list[str] = []
