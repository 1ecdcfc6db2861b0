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
