"""The baseline of every speedup, as a parameter (docs/protocol.md, "Baseline").

Accepted forms:

* ``reference``, ``expert``, ``straightforward``: one of the task's own solutions, timed on the
  same hardware;
* ``run:<run_id>``: the first correct submission of one recorded run (one task only);
* ``model:<name>``: per task, the first correct submission of that model's unguided run. This is
  the paper's baseline ("one fixed model's first correct unguided submission", which therefore
  scores 1.0).

A task the baseline has no latencies for is listed in :attr:`Baseline.missing` with the reason;
scoring then raises or excludes the task, as the caller chose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict

from d2kbench.scoring.metrics import ScoringError
from d2kbench.scoring.records import UNGUIDED, RunRecord
from d2kbench.scoring.selection import first_correct

#: The task solutions that can serve as a baseline by name.
SOLUTION_BASELINES = ("reference", "expert", "straightforward")


class BaselineSpec(BaseModel):
    """A parsed ``--baseline`` value: a task solution, a run, or a model's unguided runs."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["solution", "run", "model"]
    name: str

    def __str__(self) -> str:
        return self.name if self.kind == "solution" else f"{self.kind}:{self.name}"

    def describe(self) -> str:
        """A sentence for report headers."""
        if self.kind == "solution":
            return f"the task's `{self.name}` solution"
        if self.kind == "run":
            return f"the first correct submission of run `{self.name}`"
        return f"the first correct unguided submission of model `{self.name}` (the paper's baseline)"


def parse_baseline(text: str) -> BaselineSpec:
    """Parse a baseline option (see the module docstring for the accepted forms).

    Raises:
        ValueError: any other text; the message lists the accepted forms.
    """
    t = str(text).strip()
    if t in SOLUTION_BASELINES:
        return BaselineSpec(kind="solution", name=t)
    for kind in ("run", "model"):
        if t.startswith(kind + ":") and t[len(kind) + 1:].strip():
            return BaselineSpec(kind=kind, name=t[len(kind) + 1:].strip())
    raise ValueError(f"unknown baseline {text!r}: use {', '.join(SOLUTION_BASELINES)}, run:<run_id> or model:<name>")


class Baseline(BaseModel):
    """Resolved baseline latencies: task -> workload -> per-call mean latency (ms).

    ``sources``: task -> where its latencies come from; ``missing``: task -> why it has none.
    """

    spec: BaselineSpec
    latencies_ms: dict[str, dict[str, float]] = {}
    sources: dict[str, str] = {}
    missing: dict[str, str] = {}


def resolve_baseline(spec: BaselineSpec, tasks: Iterable[str],
                     solution_ms: Mapping[str, Mapping[str, Mapping[str, float]]],
                     runs: Iterable[RunRecord]) -> Baseline:
    """Baseline latencies for ``tasks``.

    Args:
        spec: the parsed baseline.
        tasks: the task ids to resolve.
        solution_ms: task -> solution name -> workload -> latency (ms) of the task solutions.
        runs: the recorded runs to search for ``run:`` and ``model:`` baselines.

    Raises:
        ScoringError: ``run:`` names no recorded run; ``model:`` finds more than one unguided run
            of the model for a task (narrow the selection, e.g. by campaign or seed).
    """
    runs = list({r.run_id: r for r in runs}.values())  # a run listed twice is one run
    out = Baseline(spec=spec)

    def take(task: str, run: RunRecord) -> None:
        first = first_correct(run.candidates)
        if first is None:
            out.missing[task] = f"run {run.run_id} ({run.model}, {run.guidance}) has no correct submission"
        else:
            out.latencies_ms[task] = dict(first.latencies_ms)
            out.sources[task] = f"run {run.run_id}, candidate {first.id} (turn {first.turn})"

    if spec.kind == "run":
        matches = [r for r in runs if r.run_id == spec.name]
        if not matches:
            raise ScoringError(f"baseline run {spec.name!r} is not in the store (with results on this hardware)")
    for task in tasks:
        if spec.kind == "solution":
            lat = solution_ms.get(task, {}).get(spec.name)
            if lat:
                out.latencies_ms[task] = dict(lat)
                out.sources[task] = f"{spec.name} solution"
            else:
                out.missing[task] = f"no recorded timings of the {spec.name} solution on this hardware"
        elif spec.kind == "run":
            run = matches[0]
            if run.task == task:
                take(task, run)
            else:
                out.missing[task] = f"baseline run {run.run_id} is of task {run.task!r}"
        else:
            own = [r for r in runs if r.model == spec.name and r.guidance == UNGUIDED and r.task == task]
            if len(own) > 1:
                raise ScoringError(f"task {task!r}: model {spec.name!r} has {len(own)} unguided runs "
                                   f"({', '.join(r.run_id for r in own)}); select one campaign or seed")
            if own:
                take(task, own[0])
            else:
                out.missing[task] = f"model {spec.name!r} has no unguided run of this task"
    return out
