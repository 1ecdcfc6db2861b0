"""The Ray executor on a local Ray instance (CPU, ``num_cpus=2``): a small campaign, and a
campaign killed midway and resumed on Ray without redoing or losing a run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray")

from agents_fakes.fake_provider import FakeProvider  # noqa: E402
from test_campaign import by_key, slow_done, write_plan  # noqa: E402

from d2kbench.campaign.executors import RayExecutor, make_executor  # noqa: E402
from d2kbench.campaign.plan import load_plan  # noqa: E402
from d2kbench.campaign.runner import run_campaign  # noqa: E402
from d2kbench.store import Store  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_ray_runs_a_small_campaign(tmp_path, local_ray):
    with FakeProvider(slow_done(0.5)) as fp:
        plan = load_plan(write_plan(tmp_path / "plan.yaml", fp.base_url + "/v1", seeds=1))
        ex = make_executor("ray", device=plan.device, gpus=plan.gpus, concurrency=plan.concurrency)
        assert isinstance(ex, RayExecutor) and not ex.gpus and ex.concurrency == 2
        started, done = [], []
        res = run_campaign(plan, store_path=tmp_path / "s.sqlite", runs_root=tmp_path / "runs", executor=ex,
                           on_start=lambda j, _: started.append(j.run_id), on_done=lambda j, o: done.append(o))
        assert (res.planned, res.started) == (4, 4) and sorted(started) == sorted(o["run_id"] for o in done)
        assert all(o["status"] == "finished" and o["turns"] == 1 for o in done)
        rows = by_key(Store(tmp_path / "s.sqlite"))
        assert len(rows) == 4 and all(v[0]["status"] == "finished" for v in rows.values())
        assert len(fp.requests) == 4


@pytest.mark.slow
def test_ray_campaign_killed_midway_resumes(tmp_path, local_ray):
    with FakeProvider(slow_done(1.5)) as fp:
        plan_path = write_plan(tmp_path / "plan.yaml", fp.base_url + "/v1")
        store_path = tmp_path / "s.sqlite"
        cmd = [sys.executable, "-m", "d2kbench.cli", "campaign", str(plan_path), "--store", str(store_path),
               "--executor", "ray", "--ray-num-cpus", "2"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def count(status: str) -> int:
            if not store_path.exists():
                return 0
            return Store(store_path).conn.execute("SELECT COUNT(*) FROM runs WHERE status=?", (status,)).fetchone()[0]

        t0 = time.monotonic()
        while not (count("finished") >= 1 and count("running") >= 1):
            assert time.monotonic() - t0 < 180, "the Ray campaign made no progress"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        first = {r["run_id"]: dict(r) for r in Store(store_path).conn.execute("SELECT * FROM runs")}
        done_first = {k for k, v in first.items() if v["status"] == "finished"}
        running_first = {k for k, v in first.items() if v["status"] == "running"}
        plan = load_plan(plan_path)
        res = run_campaign(plan, store_path=store_path, runs_root=tmp_path / "runs",
                           executor=RayExecutor(gpus=False, concurrency=2))
        assert res.already_done >= len(done_first) and res.started == 8 - res.already_done
        assert all(o["status"] == "finished" for o in res.outcomes)
        rows = by_key(Store(store_path))
        assert len(rows) == 8
        for attempts in rows.values():
            assert [a["status"] for a in attempts].count("finished") == 1
        for rid in done_first:  # finished before the kill: never redone
            assert len(rows[first[rid]["run_key"]]) == 1
        # Ray tasks may outlive a killed driver for a moment: an attempt that was running either
        # finished on its own (kept, not redone) or was stopped by the resume and is interrupted
        # (a task the dead driver had queued may even have started after the kill)
        for rid in running_first | set(res.interrupted):
            assert Store(store_path).run(rid)["status"] in ("finished", "interrupted")
        assert not set(res.interrupted) & done_first
