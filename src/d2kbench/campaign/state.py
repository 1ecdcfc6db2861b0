"""Resume: what of a plan is done, what to (re)start, and the one-campaign-at-a-time lock.

A planned run is identified by its key (``RunSpec.key``: task, model, backend, guidance, seed,
budget; not the endpoint or the backend options, so a moved endpoint or a rotated key resumes
where the campaign stopped); attempts recorded by older versions under their key (which held
the endpoint and options) are recognised too. Each start is an *attempt* with its own
``run_id`` (``<key>-a<n>``), so nothing recorded by an earlier attempt is overwritten.
A key with a ``finished`` attempt is done and never redone; a ``failed`` attempt counts as done
too unless ``retry_failed``. Attempts left ``running`` by a killed campaign (the lock proves no
other campaign process is alive) become ``interrupted`` and the run starts again as the next
attempt; their candidates, turns and events stay in the store.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import TextIO

from pydantic import BaseModel, ConfigDict

from d2kbench.agents.runner import RunSpec
from d2kbench.campaign.plan import Plan
from d2kbench.machine import host_id
from d2kbench.sandbox.process import kill_stale_group

DONE_STATUSES = ("finished",)


class CampaignBusy(RuntimeError):
    """Another process holds this campaign's lock."""


class CampaignLock:
    """An exclusive lock on ``(store, campaign name)`` (a ``flock``ed file beside the store).

    Raises:
        CampaignBusy: on enter, when another live process holds it.
    """

    def __init__(self, store_path: str | Path, name: str):
        self.path = Path(f"{Path(store_path).resolve()}.{name}.lock")
        self._fh: TextIO | None = None

    def __enter__(self) -> CampaignLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise CampaignBusy(f"campaign lock {self.path} is held by another process ({holder}); "
                               f"is the campaign already running?") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


class Schedule(BaseModel):
    """``todo``: (spec, attempt) to start; ``done``: keys already finished (or failed, when
    not retried); ``interrupted``: run ids found ``running`` and marked ``interrupted``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    todo: list[tuple[RunSpec, int]]
    done: list[str]
    interrupted: list[str]


def _stop_orphans(store, plan: Plan) -> None:
    """Kill the process groups of attempts still marked ``running`` on this machine (workers
    that outlived a killed campaign, e.g. Ray tasks), so none finishes behind our back."""
    host = host_id()
    killed = False
    for spec in plan.runs():
        for r in _attempts(store, spec):
            if r["status"] != "running":
                continue
            cfg = json.loads(r["config_json"] or "{}")
            if cfg.get("host") == host and isinstance(cfg.get("pid"), int):
                killed = kill_stale_group(cfg["pid"]) or killed
    if killed:
        time.sleep(0.5)  # let the killed groups go before statuses are read


def _attempts(store, spec: RunSpec) -> list:
    """Every recorded attempt of a planned run, under its key or the key older versions gave it."""
    return [r for k in spec.keys() for r in store.runs_of(run_key=k)]


def schedule(store, plan: Plan, *, retry_failed: bool = False) -> Schedule:
    """Decide what to run. Call while holding the :class:`CampaignLock`: it stops orphaned
    workers of this machine, then marks attempts still ``running`` as ``interrupted``."""
    _stop_orphans(store, plan)
    todo, done, stale = [], [], []
    for spec in plan.runs():
        key = spec.key()
        rows = _attempts(store, spec)
        stale += [r["run_id"] for r in rows if r["status"] == "running"]
        finished = any(r["status"] in DONE_STATUSES for r in rows)
        failed = any(r["status"] == "failed" for r in rows)
        if finished or (failed and not retry_failed):
            done.append(key)
        else:
            attempts = [r["attempt"] for r in rows] or [0]
            todo.append((spec, max(attempts) + 1))
    if stale:
        store.mark_interrupted(stale, "the campaign process stopped while this attempt ran")
    return Schedule(todo=todo, done=done, interrupted=stale)
