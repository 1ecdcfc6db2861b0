"""Run a campaign: lock, record the plan (it declares the tasks of the campaign's scores),
schedule (resume), execute, summarise."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from d2kbench.campaign.plan import Plan
from d2kbench.campaign.state import CampaignLock, schedule
from d2kbench.campaign.worker import Job
from d2kbench.store import Store


class CampaignResult(BaseModel):
    """What one invocation did: runs planned, already done, started, and their outcomes."""

    name: str
    planned: int
    already_done: int
    started: int
    interrupted: list[str]
    outcomes: list[dict]


def run_campaign(plan: Plan, *, store_path: str | Path, runs_root: str | Path, executor,
                 retry_failed: bool = False, on_schedule: Callable | None = None,
                 on_start: Callable | None = None, on_done: Callable | None = None) -> CampaignResult:
    """Run every planned run that is not done yet.

    Args:
        plan: the plan.
        store_path: the SQLite store (runs are recorded there as they go).
        runs_root: where run directories go.
        executor: a :class:`LocalExecutor` or :class:`RayExecutor`.
        retry_failed: also start a new attempt of runs whose last attempt failed.
        on_schedule: called with the :class:`Schedule` before anything starts.
        on_start, on_done: executor callbacks ``(job, outcome)``.

    Raises:
        CampaignBusy: another process runs this campaign on this store.
    """
    with CampaignLock(store_path, plan.name):
        store = Store(store_path)
        try:
            store.record_plan(plan.name, plan.model_dump(mode="json"))  # the declared tasks of its scores
            sched = schedule(store, plan, retry_failed=retry_failed)
        finally:
            store.close()
        if on_schedule:
            on_schedule(sched)
        jobs = [Job(spec=spec, attempt=attempt, store=str(Path(store_path).resolve()),
                    runs_root=str(Path(runs_root).resolve())) for spec, attempt in sched.todo]
        outcomes = executor.run(jobs, on_start=on_start, on_done=on_done) if jobs else []
    return CampaignResult(name=plan.name, planned=len(plan.runs()), already_done=len(sched.done), started=len(jobs),
                          interrupted=sched.interrupted, outcomes=outcomes)
