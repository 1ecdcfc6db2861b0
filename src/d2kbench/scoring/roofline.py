"""Roofline figures of one measured latency (docs/timing.md, "Speed of light (SOL) and the roofline").

SOL times come from the task's hand-written work counts (``task.yaml`` ``sol``) through
:func:`d2kbench.scoring.sol.sol_ms`: ``max(tensor-core FLOPs / TC rate, FP32 FLOPs / FP32 rate,
minimal bytes / bandwidth)``. Two bounds per workload:

* the *reference-derived* bound (``sol.reference``: the reference algorithm's work); a design
  that removes work (an algorithmic change such as Muon's Gram form) may legitimately run
  under it, which is flagged as ``beats_reference_bound``, not penalised;
* the *floor* (``sol.floor``: the least work of any known design); utilisation is measured
  against it, and a latency more than :data:`SOL_VIOLATION_TOLERANCE` under the datasheet
  floor is physically implausible (``sol_violation``: a counting bug, L2 residency or cheating).

These figures are diagnostics shown next to S_perf and fast_p, never inside them.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from d2kbench.scoring.sol import ceilings, sol_ms
from d2kbench.tasks.schema import SolSpec

#: A latency this fraction under the datasheet floor is a ``sol_violation`` (docs/timing.md, "Integrity of a timing").
SOL_VIOLATION_TOLERANCE = 0.02


class SolBounds(BaseModel):
    """The SOL times of one workload on one GPU (ms) and the limit that binds each.

    ``sol_floor_measured_ms`` uses the measured ceilings (None where we have no measured table
    for the GPU); the other times use the datasheet ceilings.
    """

    hardware: str
    sol_reference_ms: float
    reference_bound: str
    floor_variant: str
    sol_floor_ms: float
    floor_bound: str
    sol_floor_measured_ms: float | None


def sol_bounds(sol: SolSpec, axes: dict[str, int], hardware: str) -> SolBounds:
    """The reference-derived SOL time and the floor of a workload with axis values ``axes``.

    Raises:
        ValueError: a GPU without datasheet ceilings.
        d2kbench.tasks.formula.FormulaError: a work formula that does not evaluate on ``axes``.
    """
    sheet = ceilings(hardware, "datasheet")
    try:
        measured = ceilings(hardware, "measured")
    except ValueError:
        measured = None
    ref_ms, ref_bound = sol_ms(sol.reference, axes, sheet)
    floor_counts = sol.counts(sol.floor)
    floor_ms, floor_bound = sol_ms(floor_counts, axes, sheet)
    return SolBounds(hardware=sheet.name, sol_reference_ms=ref_ms, reference_bound=ref_bound, floor_variant=sol.floor,
                     sol_floor_ms=floor_ms, floor_bound=floor_bound,
                     sol_floor_measured_ms=sol_ms(floor_counts, axes, measured)[0] if measured else None)


class Roofline(BaseModel):
    """Roofline figures of one latency on one workload (times in ms, utilisation as fractions).

    ``utilisation`` = floor SOL (datasheet) / latency; ``utilisation_measured`` the same against
    the measured ceilings (None without a measured table). ``gap_closed`` = (T_base - T) /
    (T_base - T_SOL floor), None without a baseline or when T_base <= T_SOL floor.
    """

    bounds: SolBounds
    latency_ms: float
    utilisation: float
    utilisation_measured: float | None
    gap_closed: float | None
    beats_reference_bound: bool
    sol_violation: bool


def roofline(sol: SolSpec, axes: dict[str, int], latency_ms: float, hardware: str,
             baseline_ms: float | None = None) -> Roofline:
    """Roofline figures of ``latency_ms`` on a workload with axis values ``axes``.

    Args:
        sol: the task's SOL counts.
        axes: the workload's axis values.
        latency_ms: the measured per-call mean latency.
        hardware: a GPU with datasheet ceilings (``H200``, ``H100``, ``B200`` or a device name).
        baseline_ms: the baseline's latency, for the gap closed.

    Raises:
        ValueError: a latency that is not finite and positive; a GPU without datasheet ceilings.
        d2kbench.tasks.formula.FormulaError: a work formula that does not evaluate on ``axes``.
    """
    if not (isinstance(latency_ms, (int, float)) and math.isfinite(latency_ms) and latency_ms > 0):
        raise ValueError(f"latency must be a finite positive number of ms, got {latency_ms!r}")
    b = sol_bounds(sol, axes, hardware)
    gap = None
    if baseline_ms is not None and baseline_ms > b.sol_floor_ms:
        gap = (baseline_ms - latency_ms) / (baseline_ms - b.sol_floor_ms)
    meas = b.sol_floor_measured_ms
    return Roofline(
        bounds=b, latency_ms=latency_ms, utilisation=b.sol_floor_ms / latency_ms,
        utilisation_measured=meas / latency_ms if meas is not None else None, gap_closed=gap,
        beats_reference_bound=latency_ms < b.sol_reference_ms,
        sol_violation=latency_ms < b.sol_floor_ms * (1.0 - SOL_VIOLATION_TOLERANCE),
    )
