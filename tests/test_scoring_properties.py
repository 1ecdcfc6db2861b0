"""Property tests: scaling every latency leaves speedups unchanged; reordering changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from d2kbench.scoring.baseline import parse_baseline, resolve_baseline
from d2kbench.scoring.metrics import fast_p, overall_performance_score, performance_score, task_speedup
from d2kbench.scoring.records import CandidateRecord, RunRecord
from d2kbench.scoring.runs import TaskSet, score_runs
from d2kbench.scoring.trajectory import trajectory

latency = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
scale = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
WORKLOADS = ("w0", "w1", "w2")


@st.composite
def latencies(draw):
    n = draw(st.integers(1, 4))
    return {f"w{i}": draw(latency) for i in range(n)}


@st.composite
def run_sets(draw):
    """Runs of up to 3 models x 2 guidance settings x up to 4 tasks, and per-task baselines."""
    tasks = [f"t{i}" for i in range(draw(st.integers(1, 4)))]
    base = {t: {w: draw(latency) for w in WORKLOADS} for t in tasks}
    runs, cid = [], 0
    for m in [f"m{i}" for i in range(draw(st.integers(1, 3)))]:
        for g in ("none", "L1+L2+L3"):
            for t in tasks:
                cands = []
                for _ in range(draw(st.integers(0, 3))):
                    cid += 1
                    ok = draw(st.booleans())
                    cands.append(CandidateRecord(id=cid, turn=draw(st.integers(0, 20)), eligible=ok,
                                                 latencies_ms={w: draw(latency) for w in WORKLOADS} if ok else {}))
                runs.append(RunRecord(run_id=f"{m}/{g}/{t}", task=t, model=m, guidance=g, budget_turns=20,
                                      candidates=cands))
    return base, runs


def scaled_runs(runs, c):
    return [r.model_copy(update={"candidates": [x.model_copy(update={"latencies_ms": {w: v * c for w, v in
                                                                                      x.latencies_ms.items()}})
                                                for x in r.candidates]}) for r in runs]


def sheet_of(base, runs):
    b = resolve_baseline(parse_baseline("reference"), list(base), {t: {"reference": v} for t, v in base.items()}, [])
    return score_runs(runs, b, TaskSet(default=sorted({r.task for r in runs}), source="test"))


@given(latencies(), latencies(), scale)
def test_scaling_every_latency_leaves_the_task_speedup_unchanged(base, cand_values, c):
    cand = {w: v for w, v in zip(base, list(cand_values.values()) * 4)}
    s = task_speedup(base, cand)
    scaled = task_speedup({w: v * c for w, v in base.items()}, {w: v * c for w, v in cand.items()})
    assert scaled == pytest.approx(s, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(run_sets(), st.integers(-20, 20), scale)
def test_scaling_every_latency_leaves_all_scores_unchanged(data, k, c):
    base, runs = data
    ref = sheet_of(base, runs)
    # a power of two scales every float exactly: every score, selection and fast_p is bit-identical
    exact = sheet_of({t: {w: v * 2.0**k for w, v in b.items()} for t, b in base.items()}, scaled_runs(runs, 2.0**k))
    assert exact.groups == ref.groups
    assert [(r.final_candidate, r.speedup) for r in exact.runs] == [(r.final_candidate, r.speedup) for r in ref.runs]
    # any other constant: the same scores up to rounding
    approx = sheet_of({t: {w: v * c for w, v in b.items()} for t, b in base.items()}, scaled_runs(runs, c))
    for g, h in zip(ref.groups, approx.groups):
        assert h.s_perf == pytest.approx(g.s_perf, rel=1e-9)


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.one_of(st.none(), st.floats(1e-3, 1e3)), min_size=1,
                       max_size=12), st.randoms(use_true_random=False))
def test_reordering_tasks_changes_no_task_aggregate(speedups, rnd):
    items = list(speedups.items())
    rnd.shuffle(items)
    shuffled = dict(items)
    assert performance_score(shuffled) == performance_score(speedups)
    for p in (1.0, 1.5, 2.0):
        assert fast_p(shuffled, p) == fast_p(speedups, p)
    models = {k: v for k, v in speedups.items() if v is not None}
    if models:
        assert overall_performance_score(dict(reversed(list(models.items())))) == overall_performance_score(models)


@settings(max_examples=60, deadline=None)
@given(run_sets(), st.randoms(use_true_random=False))
def test_reordering_runs_changes_nothing(data, rnd):
    base, runs = data
    ref = sheet_of(base, runs)
    shuffled_runs = list(runs)
    rnd.shuffle(shuffled_runs)
    shuffled_base = dict(reversed(list(base.items())))
    other = sheet_of(shuffled_base, shuffled_runs)
    assert other.groups == ref.groups and other.runs == ref.runs
    for lv in ("none", "L1+L2+L3"):
        assert other.overall(lv) == ref.overall(lv)
        for m in ref.models():
            mine = [r for r in ref.runs if (r.model, r.guidance) == (m, lv)]
            assert trajectory(list(reversed(mine))) == trajectory(mine)
