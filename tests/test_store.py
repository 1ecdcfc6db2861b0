"""Store rules that protect recorded results."""

from __future__ import annotations

from d2kbench.store import Store


def test_a_late_finish_cannot_revive_an_interrupted_attempt(tmp_path):
    """A worker that outlived a killed campaign must not mark its superseded attempt finished."""
    store = Store(tmp_path / "s.sqlite")
    kw = dict(task="muon_newton_schulz", model="m", backend="openai", guidance="none", seed=0, budget_turns=3,
              config={}, run_key="k")
    store.start_run("k-a1", attempt=1, **kw)
    store.mark_interrupted(["k-a1"], "campaign killed")
    store.start_run("k-a2", attempt=2, **kw)
    assert store.finish_run("k-a1", status="finished") is False  # the orphan's late answer
    assert store.finish_run("k-a2", status="finished") is True
    assert store.finish_run("k-a2", status="failed") is False  # closed once
    statuses = dict(store.conn.execute("SELECT run_id, status FROM runs").fetchall())
    assert statuses == {"k-a1": "interrupted", "k-a2": "finished"}
    store.close()


def _record(store: Store, eval_id: str, workload: str, mean_ms: float, task: str = "muon_newton_schulz") -> None:
    from d2kbench.harness.results import SolutionRun, Status, WorkloadResult
    from d2kbench.harness.timing import summarize

    run = SolutionRun(solution="expert", path="expert.py", sha256="ab" * 32, role="candidate")
    res = WorkloadResult(workload=workload, status=Status.OK, timing=summarize([mean_ms] * 3, "events"))
    store.record(eval_id, task, run, res, "cuda", {"gpu": "NVIDIA H200"}, "2026-11-29T12:00:00+00:00")


def test_merge_appends_another_stores_evaluations_once(tmp_path):
    main, gpu = Store(tmp_path / "main.sqlite"), Store(tmp_path / "gpu.sqlite")
    _record(main, "e1", "w1", 1.0)
    _record(gpu, "e2", "w1", 2.0)
    _record(gpu, "e2", "w2", 3.0)
    gpu.close()
    assert main.merge_evaluations(tmp_path / "gpu.sqlite") == 2
    assert main.merge_evaluations(tmp_path / "gpu.sqlite") == 0  # idempotent
    rows = main.rows()
    assert sorted((r["eval_id"], r["workload"], r["mean_ms"]) for r in rows) == [
        ("e1", "w1", 1.0), ("e2", "w1", 2.0), ("e2", "w2", 3.0)]
    assert main.env("e2") == {"gpu": "NVIDIA H200"}
    assert main.result(next(r for r in rows if r["workload"] == "w2")).timing.mean_ms == 3.0
    main.close()


def test_merge_can_take_one_task_only(tmp_path):
    main, gpu = Store(tmp_path / "main.sqlite"), Store(tmp_path / "gpu.sqlite")
    _record(gpu, "e1", "w1", 1.0, task="kv_cache_fp8_store")
    _record(gpu, "e2", "w1", 2.0)
    gpu.close()
    assert main.merge_evaluations(tmp_path / "gpu.sqlite", task="muon_newton_schulz") == 1
    assert [r["eval_id"] for r in main.rows()] == ["e2"]
    assert main.merge_evaluations(tmp_path / "gpu.sqlite") == 1  # the other task's evaluation, later
    main.close()


def test_merge_of_a_missing_file_raises(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="no store"):
        Store(tmp_path / "m.sqlite").merge_evaluations(tmp_path / "absent.sqlite")
