"""``benchmark()`` and its report: several solutions side by side, bars, achieved rates."""

from __future__ import annotations

import pytest

from d2kbench.harness.benchmark import benchmark
from d2kbench.harness.evaluate import Options
from d2kbench.harness.results import Status
from d2kbench.report.benchmark import Bar, to_markdown
from conftest import SOLUTIONS


def test_bar_parse():
    assert Bar.parse("expert/reference>=1.8") == Bar("expert", "reference", 1.8)
    with pytest.raises(ValueError, match="A/B>=FACTOR"):
        Bar.parse("expert faster than reference")


def test_benchmark_interleaves_solutions_and_checks_bars(muon):
    wls = [muon.spec.workload("smoke_tall_1x64x48")]
    res = benchmark(muon, ["straightforward", str(SOLUTIONS / "muon" / "wrong_values.py")], wls, "cpu", "reference",
                    options=Options(timeout_s=60, integrity=False))
    sf, bad, ref = (res.run(s) for s in ["straightforward", str(SOLUTIONS / "muon" / "wrong_values.py"), "reference"])
    assert sf.results[0].status is Status.OK and ref.results[0].status is Status.OK
    assert bad.results[0].status is Status.INCORRECT
    s = res.speedup("straightforward", "reference", "smoke_tall_1x64x48")
    assert s == pytest.approx(ref.results[0].timing.mean_ms / sf.results[0].timing.mean_ms)
    assert res.geomean_speedup("straightforward", "reference") == pytest.approx(s)
    # the interpreter is far slower than torch on the CPU: a 1x bar must fail, a tiny one pass
    assert Bar("straightforward", "reference", 1.0).check(res) == [("smoke_tall_1x64x48", s, False)]
    assert Bar("straightforward", "reference", s / 2).check(res)[0][2] is True
    # achieved rates count the work model the task file assigns (muon: expert -> gram_expert)
    assert res.rates["straightforward"][0].work_model == "reference"
    assert res.rates["straightforward"][0].pct_bf16_ceiling is None  # no GPU ceiling on the CPU
    page = to_markdown(res, [Bar("straightforward", "reference", 1.0)])
    assert "| straightforward / reference >= 1.0 | smoke_tall_1x64x48 |" in page and "FAIL" in page
    assert "wrong_values.py on smoke_tall_1x64x48: incorrect" in page


def test_work_model_of_solutions(muon):
    assert muon.spec.sol.work_of("expert")[0] == "gram_expert"
    assert muon.spec.sol.work_of("some/path.py")[0] == "reference"
