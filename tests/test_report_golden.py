"""A whole report built from the synthetic store, compared with the checked-in golden pages.

To accept an intended change of the output: ``D2K_UPDATE_GOLDEN=1 pytest tests/test_report_golden.py``,
then review the diff of ``tests/golden/``.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import synthetic_store as syn

from d2kbench.report.build import build_report, score
from d2kbench.report.data import Selection, load
from d2kbench.scoring.baseline import parse_baseline
from d2kbench.store import Store

GOLDEN = Path(__file__).parent / "golden"
PAGES = ("report.md", "tasks/muon_newton_schulz.md", "tasks/toy_softmax.md")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    return syn.build(tmp_path_factory.mktemp("store") / "golden.sqlite")


@pytest.fixture(scope="module")
def data(store_path):
    store = Store(store_path)
    try:
        return load(store, Selection(), baseline=parse_baseline("reference"))
    finally:
        store.close()


@pytest.fixture(scope="module")
def built(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    files = build_report(data, parse_baseline("reference"), out)
    return out, files


@pytest.mark.parametrize("page", PAGES)
def test_pages_match_the_golden_files(built, page):
    out, _ = built
    text = (out / page).read_text()
    golden = GOLDEN / page
    if os.environ.get("D2K_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_hand_computed_scores_of_the_synthetic_store(data):
    sheet = score(data, parse_baseline("reference"))
    s = {(g.model, g.guidance): g for g in sheet.groups}
    assert s[("model-a", "none")].s_perf == pytest.approx(2.5 ** 0.5, rel=1e-12)
    assert s[("model-a", "L1")].s_perf == pytest.approx(1.0, rel=1e-12)          # 2.0 and a failure (0.5)
    assert s[("model-a", "L1+L2")].s_perf == pytest.approx(5 ** 0.5, rel=1e-12)
    assert s[("model-b", "none")].s_perf == pytest.approx(0.025 ** 0.5, rel=1e-12)
    assert s[("model-b", "L1+L2+L3")].s_perf == pytest.approx((2 * 50 ** (1 / 3)) ** 0.5, rel=1e-12)
    assert s[("model-c", "none")].fast_p == {1.0: 0.0, 1.5: 0.0, 2.0: 0.0}         # speedups exactly 1.0
    assert s[("model-a", "none")].fast_p == {1.0: 1.0, 1.5: 0.5, 2.0: 0.0}         # 2.0 is not > 2
    # model-d has no unguided run at all: both declared tasks count as failed (0.5 each)
    assert s[("model-d", "none")].s_perf == 0.5 and s[("model-d", "none")].missing == {
        "muon_newton_schulz": "no run", "toy_softmax": "no run"}
    unguided = (2.5 ** 0.5 * 0.025 ** 0.5 * 1.0 * 0.5) ** (1 / 4)
    assert sheet.overall("none") == pytest.approx(unguided, rel=1e-12)
    # model-d guided: 2.0 on Muon, no toy run -> sqrt(2 * 0.5) = 1, fast_1 = 1/2 (not 2.0 and 1.0)
    d = s[("model-d", "L1+L2+L3")]
    assert (d.s_perf, d.fast_p[1.0], d.n_tasks, d.n_correct) == (pytest.approx(1.0, rel=1e-12), 0.5, 2, 1)
    # model-c at L1: the Muon run is still running, no toy run; both count as failed
    assert s[("model-c", "L1")].missing == {"muon_newton_schulz": "running", "toy_softmax": "no run"}
    assert s[("model-b", "L1+L2")].s_perf == 0.5 and s[("model-b", "L1+L2")].n_tasks == 2
    assert sheet.overall("L1") == pytest.approx((1.0 * 0.5 * 0.5) ** (1 / 3), rel=1e-12)
    # model-a's unguided Muon run: the later, faster candidate is final; the first correct came earlier
    r = next(r for r in sheet.runs if r.run_id == "model-a.none.muon_newton_schulz")
    assert (r.final_turn, r.first_correct_turn, r.speedup) == (9, 5, pytest.approx(2.0))


def test_the_store_is_read_as_designed(data, store_path):
    assert data.hardware == "H200"
    assert data.skipped == {"model-c.L1.muon_newton_schulz": "running"}
    assert data.tasks == ["muon_newton_schulz", "toy_softmax"]  # declared by the recorded plans
    assert data.incomplete_evaluations == {"interrupted": 1}  # its 4000 ms never reach the reference timing
    ref = data.solutions["muon_newton_schulz"]["reference"]["paper_32x2048x5464"]
    assert (ref.mean_ms, ref.n_ok) == (40.0, 2)  # 41 and 39 ms pooled
    expert = data.solutions["muon_newton_schulz"]["expert"]
    assert expert["paper_32x2048x5464"].mean_ms == 16.0 and expert["paper_32x2048x5464"].n_ok == 1  # old sha ignored
    assert "adv_low_rank_noise_4x2048x5464" not in expert  # correctness-only: not timed
    usage = data.usage["model-a.L1+L2+L3.toy_softmax"]
    assert (usage.turns, usage.cache_write, usage.cost_usd) == (3, 3 * 460, pytest.approx(3 * 0.065))
    unpriced = data.usage["model-d.L1+L2+L3.muon_newton_schulz"]
    assert (unpriced.turns, unpriced.cost_usd, unpriced.unpriced_models) == (3, None, ["model-d"])
    plan = json.loads(Store(store_path).plans(["paper"])[0]["plan_json"])
    assert plan["agents"][0]["options"] == {"api_key": "<redacted>"}  # the plan's secret never reached the store


def test_figures_csv_and_html(built):
    out, files = built
    pngs = sorted(p.name for p in files if p.suffix == ".png")
    assert pngs == ["fig3_ablation.png", "fig4_trajectory.png", "task_muon_newton_schulz.png", "task_toy_softmax.png"]
    for p in files:
        if p.suffix == ".png":
            head = p.read_bytes()[:8]
            assert head == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000, p
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == 4
    assert "src=\"figures/" not in html and "http" not in html.split("<body>")[1]  # opens offline
    assert 'href="#page-tasks-muon_newton_schulz"' in html
    assert "<table>" in html and "SOL VIOLATION" in html
    with open(out / "tables" / "table1_correctness_sperf.csv") as f:
        rows = list(csv.DictReader(f))
    assert float(rows[0]["S_perf none"]) == pytest.approx(2.5 ** 0.5, rel=1e-15)  # unrounded in CSV
    assert rows[-1]["model"] == "all models"
    # every output says how many declared tasks counted as failed, and why: the HTML page, the
    # notes beside each CSV table, and the figures' own footnote (their section says it too)
    failed = "model-d / none: 2 of 2 (2 no run); model-d / L1+L2+L3: 1 of 2 (1 no run)."
    assert failed in html and "model-c / L1: 2 of 2 (1 no run, 1 running)" in html
    for key in ("table1_correctness_sperf", "table2_judge", "figure3_ablation", "table5_fast_p", "figure4_trajectory"):
        assert failed in (out / "tables" / f"{key}.notes.txt").read_text(), key
    assert "model-d (unguided: 2 no run; guided: 1 no run)" in (out / "tables" / "table4_fully_correct.notes.txt"
                                                                ).read_text()
    assert html.count("In the figure: 11 declared task(s) in 6 (model, guidance) group(s) counted as failed for "
                      "lack of a scored result (10 no run, 1 running)") == 2
    assert "evaluations left out (not complete): 1 interrupted" in html


def test_other_baselines_and_selections(store_path):
    store = Store(store_path)
    try:
        spec = parse_baseline("model:model-a")
        data = load(store, Selection(guidance=["none"]), baseline=spec)
        sheet = score(data, spec)
        # model-a's first correct unguided submissions are the baseline; its final Muon kernel is 1.6x faster
        assert sheet.group("model-a", "none").s_perf == pytest.approx(1.6 ** 0.5, rel=1e-12)
        only_toy = load(store, Selection(tasks=["toy_softmax"], models=["model-b"]))
        assert {r.run_id for r in only_toy.runs} == {"model-b.none.toy_softmax", "model-b.L1+L2+L3.toy_softmax"}
    finally:
        store.close()
