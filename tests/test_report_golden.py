"""A whole report built from the synthetic store, compared with the checked-in golden pages.

To accept an intended change of the output: ``D2K_UPDATE_GOLDEN=1 pytest tests/test_report_golden.py``,
then review the diff of ``tests/golden/``.
"""

from __future__ import annotations

import csv
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
    unguided = (2.5 ** 0.5 * 0.025 ** 0.5 * 1.0) ** (1 / 3)
    assert sheet.overall("none") == pytest.approx(unguided, rel=1e-12)
    # model-a's unguided Muon run: the later, faster candidate is final; the first correct came earlier
    r = next(r for r in sheet.runs if r.run_id == "model-a.none.muon_newton_schulz")
    assert (r.final_turn, r.first_correct_turn, r.speedup) == (9, 5, pytest.approx(2.0))


def test_the_store_is_read_as_designed(data):
    assert data.hardware == "H200"
    assert data.skipped == {"model-c.L1.muon_newton_schulz": "running"}
    ref = data.solutions["muon_newton_schulz"]["reference"]["paper_32x2048x5464"]
    assert (ref.mean_ms, ref.n_ok) == (40.0, 2)  # 41 and 39 ms pooled
    expert = data.solutions["muon_newton_schulz"]["expert"]
    assert expert["paper_32x2048x5464"].mean_ms == 16.0 and expert["paper_32x2048x5464"].n_ok == 1  # old sha ignored
    assert "adv_low_rank_noise_4x2048x5464" not in expert  # correctness-only: not timed
    usage = data.usage["model-a.L1+L2+L3.toy_softmax"]
    assert (usage.turns, usage.cache_write, usage.cost_usd) == (3, 3 * 460, pytest.approx(3 * 0.065))


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
