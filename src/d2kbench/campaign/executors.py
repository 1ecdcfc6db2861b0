"""Executors: run jobs concurrently on a local pool or on Ray, one process per run.

Both start each run as a ``python -m d2kbench.campaign.worker`` subprocess in its own process
group that dies with its parent (``PR_SET_PDEATHSIG``), so killing the campaign kills its runs
and a resumed campaign never races an orphan. GPU runs get one GPU each:

* local: a pool of slots, one per GPU (``CUDA_VISIBLE_DEVICES=<gpu>`` for the run), or on the
  CPU ``concurrency`` slots;
* Ray: remote tasks with ``num_gpus=1`` (Ray sets ``CUDA_VISIBLE_DEVICES``), or ``num_cpus=1``
  with at most ``concurrency`` in flight on the CPU. Across nodes the store and the runs
  directory must be on a filesystem every node shares.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from queue import Queue

from d2kbench.campaign.worker import Job
from d2kbench.sandbox.process import new_group_dying_with_parent
from d2kbench.store import Store

# Imports inside functions: ray (an optional extra) and torch load only for the executor that needs them.

#: Seconds a run may exceed its own wall-clock limit before its worker is killed.
WORKER_GRACE_S = 900.0

Callback = Callable[[Job, dict], None]


def _record_failure(job: Job, error: str, *, killed: bool = False) -> str:
    """Close the job's run when its worker died before closing it itself: ``interrupted`` when
    the worker was killed from outside (SIGKILL / SIGTERM: a resume starts it again), else
    ``failed``. Returns the status written (or found)."""
    store = Store(job.store)
    try:
        row = store.run(job.run_id)
        if row is None or row["status"] != "running":
            return row["status"] if row is not None else "failed"
        store.add_event(job.run_id, 0, "error", {"kind": "worker", "message": error})
        if killed:
            store.mark_interrupted([job.run_id], error)
            return "interrupted"
        store.finish_run(job.run_id, status="failed", exit_reason="worker_error", error=error)
        return "failed"
    finally:
        store.close()


def run_job(job: Job, gpu: str | None = None) -> dict:
    """Run one job in a worker subprocess; returns the outcome as a dict.

    A worker that crashes or outlives its wall-clock limit (plus :data:`WORKER_GRACE_S`) is
    killed and its run recorded as ``failed``; this never raises for a failing run.
    """
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    limit = (job.spec.wall_clock_s or 24 * 3600.0) + WORKER_GRACE_S
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "d2kbench.campaign.worker"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=env, preexec_fn=new_group_dying_with_parent)
        try:
            out, _ = proc.communicate(job.model_dump_json().encode(), timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            error = f"worker killed after {limit:.0f} s"
            _record_failure(job, error)
            return {"run_id": job.run_id, "run_key": job.spec.key(), "status": "failed", "error": error}
        err.seek(0)
        tail = err.read()[-3000:].decode(errors="replace")
    lines = [x for x in out.decode(errors="replace").splitlines() if x.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        error = f"worker exited with status {proc.returncode} without an outcome: {tail.strip()[-1500:]}"
        killed = proc.returncode in (-signal.SIGKILL, -signal.SIGTERM)
        status = _record_failure(job, error, killed=killed)
        return {"run_id": job.run_id, "run_key": job.spec.key(), "status": status, "error": error}


class LocalExecutor:
    """A pool of ``len(slots)`` concurrent runs; ``slots`` are GPU ids (or None for CPU slots)."""

    name = "local"

    def __init__(self, slots: list[str | None]):
        if not slots:
            raise ValueError("the local executor needs at least one slot")
        self.slots = list(slots)

    def run(self, jobs: list[Job], on_start: Callback | None = None, on_done: Callback | None = None) -> list[dict]:
        """Run every job; callbacks get (job, outcome) (``on_start``: outcome ``{}``)."""
        free: Queue = Queue()
        for s in self.slots:
            free.put(s)
        results = []

        def one(job: Job) -> dict:
            slot = free.get()
            try:
                if on_start:
                    on_start(job, {"gpu": slot})
                return run_job(job, slot)
            finally:
                free.put(slot)

        with ThreadPoolExecutor(max_workers=len(self.slots)) as pool:
            futs = {pool.submit(one, j): j for j in jobs}
            for f in as_completed(futs):
                out = f.result()
                results.append(out)
                if on_done:
                    on_done(futs[f], out)
        return results


def _ray_run_job(job_json: str) -> dict:
    """Body of the Ray task: Ray already set ``CUDA_VISIBLE_DEVICES`` for ``num_gpus=1``."""
    return run_job(Job.model_validate_json(job_json), None)


class RayExecutor:
    """Runs jobs as Ray tasks on an existing cluster (``address``) or a local Ray instance.

    Args:
        gpus: request one GPU per run (``num_gpus=1``); else one CPU.
        concurrency: most runs in flight (default: unlimited on GPUs, 1 on the CPU).
        address: a Ray cluster address (``auto``) or None for a local instance.
        num_cpus: CPUs of a local instance (default: Ray's choice).
    """

    name = "ray"

    def __init__(self, *, gpus: bool, concurrency: int | None = None, address: str | None = None,
                 num_cpus: int | None = None):
        self.gpus, self.address, self.num_cpus = gpus, address, num_cpus
        self.concurrency = concurrency or (10**6 if gpus else 1)

    def _init(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, num_cpus=None if self.address else self.num_cpus,
                     include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)

    def run(self, jobs: list[Job], on_start: Callback | None = None, on_done: Callback | None = None) -> list[dict]:
        """Run every job on Ray; callbacks as :meth:`LocalExecutor.run` (``on_start`` fires on submission)."""
        import ray

        self._init()
        task = ray.remote(num_gpus=1 if self.gpus else 0, num_cpus=1, max_retries=0)(_ray_run_job)
        pending = list(jobs)
        inflight: dict = {}
        results = []
        while pending or inflight:
            while pending and len(inflight) < self.concurrency:
                job = pending.pop(0)
                inflight[task.remote(job.model_dump_json())] = job
                if on_start:
                    on_start(job, {})
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                job = inflight.pop(ref)
                try:
                    out = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost task must not stop the campaign
                    error = f"Ray task failed: {type(e).__name__}: {e}"
                    _record_failure(job, error)
                    out = {"run_id": job.run_id, "run_key": job.spec.key(), "status": "failed", "error": error}
                results.append(out)
                if on_done:
                    on_done(job, out)
        return results


def local_slots(device: str, gpus: list[int] | None, concurrency: int | None) -> list[str | None]:
    """Slots of the local pool: the plan's GPUs (or every visible one) on a GPU machine, else
    ``concurrency`` CPU slots (default 1)."""
    if device != "cpu":
        if gpus:
            return [str(g) for g in gpus]
        try:
            import torch

            n = torch.cuda.device_count()
        except Exception:  # noqa: BLE001
            n = 0
        if n:
            slots: list[str | None] = [str(g) for g in range(n)]
            return slots[: concurrency or n]
        if device == "cuda":
            raise ValueError("the plan asks for device cuda but no GPU is visible")
    return [None] * (concurrency or 1)


def make_executor(kind: str, *, device: str, gpus: list[int] | None, concurrency: int | None,
                  ray_address: str | None = None, ray_num_cpus: int | None = None):
    """``local`` or ``ray`` executor for a plan's device settings.

    Raises:
        ValueError: unknown kind, or GPUs requested where none are visible.
    """
    if kind == "local":
        return LocalExecutor(local_slots(device, gpus, concurrency))
    if kind == "ray":
        use_gpus = device == "cuda" or (device == "auto" and bool(local_slots("auto", gpus, None)[0]))
        return RayExecutor(gpus=use_gpus, concurrency=concurrency if not use_gpus else (len(gpus) if gpus else None),
                           address=ray_address, num_cpus=ray_num_cpus)
    raise ValueError(f"unknown executor {kind!r} (local or ray)")


def runs_root_default(store_path: str | Path) -> Path:
    """Run directories beside the store: ``<store dir>/runs``."""
    return Path(store_path).resolve().parent / "runs"
