"""Campaign plans, scheduling and resume on the local pool: a campaign killed midway restarts
where it stopped, never redoes a finished run and loses no recorded result. Runs here are cheap
(the fake provider answers "Done." after a delay; no harness evaluation)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from agents_fakes.fake_provider import FakeProvider

from d2kbench.campaign.executors import LocalExecutor, local_slots
from d2kbench.campaign.plan import PlanError, load_plan
from d2kbench.campaign.runner import run_campaign
from d2kbench.campaign.state import CampaignBusy, CampaignLock
from d2kbench.store import Store

TASK = "muon_newton_schulz"


def write_plan(path: Path, url: str, **over) -> Path:
    plan = {"name": "test-campaign", "design": "ablation", "tasks": [TASK],
            "agents": [{"model": "claude-sonnet-4-6", "backend": "openai", "base_url": url,
                        "options": {"api_key": "k", "retry": {"max_retries": 0}}}],
            "seeds": 2, "budget_turns": 4, "device": "cpu", "concurrency": 2, **over}
    path.write_text(yaml.safe_dump(plan))
    return path


def slow_done(delay: float) -> dict:
    return {"steps": [], "exhausted": {"text": "Done.", "delay_s": delay,
                                       "usage": {"input_tokens": 1000, "output_tokens": 100}}}


def by_key(store: Store) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in store.conn.execute("SELECT * FROM runs ORDER BY attempt"):
        out.setdefault(r["run_key"], []).append(dict(r))
    return out


# ---- plans --------------------------------------------------------------------------------------

def test_plans_expand_to_paired_and_cumulative_runs(tmp_path):
    paired = load_plan(write_plan(tmp_path / "p.yaml", "http://127.0.0.1:9/v1", design="paired", seeds=1))
    assert [r.guidance for r in paired.runs()] == ["none", "L1+L2+L3"]
    abl = load_plan(write_plan(tmp_path / "a.yaml", "http://127.0.0.1:9/v1"))
    runs = abl.runs()
    assert [(r.seed, r.guidance) for r in runs] == [(s, g) for s in (0, 1) for g in ("none", "L1", "L1+L2", "L1+L2+L3")]
    keys = [r.key() for r in runs]
    assert len(set(keys)) == 8 and keys == [r.key() for r in load_plan(tmp_path / "a.yaml").runs()]
    # the campaign name is not part of a run's identity; its settings are
    renamed = load_plan(write_plan(tmp_path / "b.yaml", "http://127.0.0.1:9/v1", name="other"))
    assert [r.key() for r in renamed.runs()] == keys
    longer = load_plan(write_plan(tmp_path / "c.yaml", "http://127.0.0.1:9/v1", budget_turns=5))
    assert not set(r.key() for r in longer.runs()) & set(keys)
    custom = load_plan(write_plan(tmp_path / "d.yaml", "u", design="custom", guidance=["L1", "L1+L2"], seeds=[7]))
    assert [(r.seed, r.guidance) for r in custom.runs()] == [(7, "L1"), (7, "L1+L2")]


@pytest.mark.parametrize("over,message", [
    ({"design": "custom"}, "design 'custom' needs a 'guidance' list"),
    ({"guidance": ["L1"]}, "only for design 'custom'"),
    ({"design": "custom", "guidance": ["L2"]}, "unknown guidance levels"),
    ({"agents": [{"model": "m", "backend": "gemini"}]}, "agents.0.backend: Value error, unknown backend 'gemini'"),
    ({"tasks": ["no_such_task"]}, "tasks: .*no such task"),
    ({"budget_turns": 0}, "budget_turns: Input should be greater than or equal to 1"),
    ({"workers": 3}, "workers: Extra inputs are not permitted"),
    ({"name": "bad name!"}, "name: String should match pattern"),
])
def test_malformed_plans_name_the_cause(tmp_path, over, message):
    p = write_plan(tmp_path / "plan.yaml", "http://127.0.0.1:9/v1", **over)
    with pytest.raises(PlanError, match=message) as e:
        load_plan(p)
    assert str(p) in str(e.value)


def test_unreadable_plans(tmp_path):
    with pytest.raises(PlanError, match="not found"):
        load_plan(tmp_path / "missing.yaml")
    (tmp_path / "x.yaml").write_text("name: [unclosed")
    with pytest.raises(PlanError, match="not valid YAML"):
        load_plan(tmp_path / "x.yaml")
    (tmp_path / "y.yaml").write_text("- a list")
    with pytest.raises(PlanError, match="must be a mapping"):
        load_plan(tmp_path / "y.yaml")


def test_slots_one_gpu_per_run_or_cpu_concurrency():
    assert local_slots("cpu", None, 3) == [None, None, None]
    assert local_slots("cuda", [2, 5], None) == ["2", "5"]
    with pytest.raises(ValueError, match="no GPU is visible"):
        local_slots("cuda", None, None)


# ---- running and resuming -------------------------------------------------------------------

def test_campaign_runs_records_and_skips_finished_runs(tmp_path):
    with FakeProvider(slow_done(0.0)) as fp:
        plan = load_plan(write_plan(tmp_path / "plan.yaml", fp.base_url + "/v1", seeds=1))
        store_path = tmp_path / "s.sqlite"
        res = run_campaign(plan, store_path=store_path, runs_root=tmp_path / "runs", executor=LocalExecutor([None, None]))
        assert (res.planned, res.already_done, res.started) == (4, 0, 4)
        assert all(o["status"] == "finished" for o in res.outcomes)
        store = Store(store_path)
        rows = by_key(store)
        assert len(rows) == 4 and all(len(v) == 1 and v[0]["status"] == "finished" for v in rows.values())
        assert {v[0]["guidance"] for v in rows.values()} == {"none", "L1", "L1+L2", "L1+L2+L3"}
        assert all(v[0]["campaign"] == "test-campaign" for v in rows.values())
        # 1000 * $3 + 100 * $15 per million tokens, one turn each
        assert all(v[0]["cost_usd"] == pytest.approx(0.0045) for v in rows.values())
        n_requests = len(fp.requests)
        res = run_campaign(plan, store_path=store_path, runs_root=tmp_path / "runs", executor=LocalExecutor([None]))
        assert (res.already_done, res.started) == (4, 0) and len(fp.requests) == n_requests


@pytest.mark.slow
def test_failed_runs_are_kept_and_retried_only_when_asked(tmp_path):
    with FakeProvider({"steps": [], "exhausted": {"error": 401, "error_message": "invalid key"}}) as fp:
        plan = load_plan(write_plan(tmp_path / "plan.yaml", fp.base_url + "/v1", seeds=1, design="paired"))
        kw = dict(store_path=tmp_path / "s.sqlite", runs_root=tmp_path / "runs", executor=LocalExecutor([None]))
        res = run_campaign(plan, **kw)
        assert [o["status"] for o in res.outcomes] == ["failed", "failed"]
        assert "invalid key" in res.outcomes[0]["error"]
        assert run_campaign(plan, **kw).started == 0
        res = run_campaign(plan, retry_failed=True, **kw)
        assert res.started == 2
        rows = by_key(Store(tmp_path / "s.sqlite"))
        assert all([r["attempt"] for r in v] == [1, 2] for v in rows.values())


def test_a_campaign_runs_once_at_a_time(tmp_path):
    plan = load_plan(write_plan(tmp_path / "plan.yaml", "http://127.0.0.1:9/v1"))
    with CampaignLock(tmp_path / "s.sqlite", plan.name):
        with pytest.raises(CampaignBusy, match="already running"):
            run_campaign(plan, store_path=tmp_path / "s.sqlite", runs_root=tmp_path / "runs",
                         executor=LocalExecutor([None]))


def _wait_for(cond, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_killed_campaign_resumes_without_redoing_or_losing_runs(tmp_path):
    with FakeProvider(slow_done(1.5)) as fp:
        plan_path = write_plan(tmp_path / "plan.yaml", fp.base_url + "/v1")
        store_path = tmp_path / "s.sqlite"
        cmd = [sys.executable, "-m", "d2kbench.cli", "campaign", str(plan_path), "--store", str(store_path)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # killed: its output is never read

        def count(status: str) -> int:
            if not store_path.exists():
                return 0
            return Store(store_path).conn.execute("SELECT COUNT(*) FROM runs WHERE status=?", (status,)).fetchone()[0]

        _wait_for(lambda: count("finished") >= 2 and count("running") >= 1, 120, "two finished runs, one running")
        proc.send_signal(signal.SIGKILL)  # the campaign process dies; its workers die with it
        proc.wait()
        store = Store(store_path)
        first = {r["run_id"]: dict(r) for r in store.conn.execute("SELECT * FROM runs")}
        done_first = {k: v for k, v in first.items() if v["status"] == "finished"}
        running = [k for k, v in first.items() if v["status"] == "running"]
        assert 2 <= len(done_first) < 8 and running, first
        time.sleep(2.5)  # an orphaned worker would finish its run by now
        assert all(store.run(k)["status"] == "running" for k in running)

        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"{len(done_first)} of 8 runs already done" in out.stdout.replace("\n", " ")
        assert "interrupted attempt(s) restart" in out.stdout.replace("\n", " ")
        rows = by_key(Store(store_path))
        assert len(rows) == 8
        for attempts in rows.values():
            assert [a["status"] for a in attempts].count("finished") == 1
            assert all(a["status"] in ("finished", "interrupted") for a in attempts)
        # the runs finished before the kill are untouched: same rows, no second attempt
        for rid, row in done_first.items():
            assert [a["run_id"] for a in rows[row["run_key"]]] == [rid]
            assert Store(store_path).run(rid)["finished_at"] == row["finished_at"]
        for rid in running:
            assert Store(store_path).run(rid)["status"] == "interrupted"
        # at most one model request per started attempt: nothing ran twice
        attempts = sum(len(v) for v in rows.values())
        assert 8 <= len([r for r in fp.requests if r.api == "chat"]) <= attempts
        # a third invocation has nothing to do
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "8 of 8 runs already done" in out.stdout.replace("\n", " ")


def test_campaign_cli_reports_plan_errors(tmp_path):
    p = write_plan(tmp_path / "plan.yaml", "http://127.0.0.1:9/v1", design="custom")
    out = subprocess.run([sys.executable, "-m", "d2kbench.cli", "campaign", str(p), "--store", str(tmp_path / "s")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "needs a 'guidance' list" in out.stdout
    out = subprocess.run([sys.executable, "-m", "d2kbench.cli", "campaign", str(write_plan(tmp_path / "ok.yaml", "u")),
                          "--executor", "slurm"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown executor 'slurm'" in out.stdout
