"""Golden end-to-end judge runs on the Muon task with scripted verdicts (fake provider):
the expert solution, the straightforward solution (one bad citation, repaired) and the
design fixture. The golden file holds scores, verification outcomes and versions, not line
numbers of the expert (those are located with ``ast`` and follow edits of the file).

To accept an intended change: ``D2K_UPDATE_GOLDEN=1 pytest tests/test_judge_golden.py``,
then review the diff of ``tests/golden/judge_muon.json``.
"""

from __future__ import annotations

import json
import os

import pytest
from agents_fakes.fake_provider import FakeProvider
from test_judge_support import (
    GOLDEN,
    PROPERTIES,
    cite,
    expert_path,
    expert_verdict,
    level,
    quote,
    straightforward_path,
    text_line,
    verdict,
)

from d2kbench.judge.runner import JudgeConfig, judge
from d2kbench.judge.targets import design_from_file, impl_from_solution
from d2kbench.store import Store

GOLDEN_FILE = GOLDEN / "judge_muon.json"


def straightforward_verdicts() -> tuple[dict, dict]:
    """(first answer, repaired answer) for the straightforward port: no Gram-side composition,
    batched GEMMs with fused epilogues, FP32 norm, autotuned tiles; the first answer cites the
    module docstring for the tiles (fails), the repair cites the autotune configurations that
    ``_gemm_configs`` returns (the decorator line alone would not be evidence)."""
    p = straightforward_path()
    epi_a, epi_b = text_line(p, "acc = acc * alpha"), text_line(p, "acc += beta * c.to(tl.float32)")
    step = text_line(p, "Bm = _bgemm(A, A, alpha=c, c=A, beta=b)")
    norm = text_line(p, "scale = 1.0 / (tl.sqrt(tl.load(ss_ptr + batch)) * norm_scale + 1e-6)")
    tune = text_line(p, 'triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=3)')
    l1 = level([], [], PROPERTIES["L1"], 0, "Step-wise rectangular recurrence: q_composition, fixed_restart missing.")
    l2 = level([cite(epi_a, epi_b, "batched_fused_gemm", source=p), cite(step, step, "batched_fused_gemm", source=p),
                cite(norm, norm + 1, "fp32_only_in_norm", source=p)], ["batched_fused_gemm", "fp32_only_in_norm"],
               ["x_fixed_in_segment"], 35,
               "Fused scale-add epilogues in batched launches; FP32 only in the norm; X is rewritten every step.")
    bad = level([cite(1, 6, "tuned_tiles", code="Autotuned GEMM tiles")], ["tuned_tiles"], ["symmetric_triangle"],
                25, "Autotuned tiles only.")
    good = level([cite(tune - 1, tune + 3, "tuned_tiles", source=p,
                       code='triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_warps=8, num_stages=3)')],
                 ["tuned_tiles"], ["symmetric_triangle"], 25, "Autotuned tiles with grouped order; no symmetric products.")
    return verdict(l1, l2, bad, "A competent direct port."), verdict(l1, l2, good, "A competent direct port.")


def design_verdict() -> dict:
    return verdict(
        level([quote("apply Q to X once per segment", "q_composition"),
               quote("After the first two coefficient triples commit X <- Q X in FP16", "fixed_restart")],
              PROPERTIES["L1"], [], 85, "Both L1 properties are stated with their causal chains."),
        level([quote("the rectangular X is only read to build R and at the two commits", "x_fixed_in_segment"),
               quote("adding gamma only where row equals column", "batched_fused_gemm")],
              ["x_fixed_in_segment", "batched_fused_gemm"], ["fp32_only_in_norm"], 60,
              "Segment dataflow and fused epilogues; the norm fusion is asserted but thin."),
        level([quote("Symmetric products computed over the upper-triangular tile list", "symmetric_triangle"),
               quote("Tile shapes and stages chosen per registered shape or by autotuning", "tuned_tiles")],
              PROPERTIES["L3"], [], 70, "Both mechanisms, tied to their benefits."),
        "A design close to the expert's.")


def digest(rec, requests: int) -> dict:
    """What the golden file keeps of a verdict."""
    return {"status": rec.status, "js": round(rec.js, 6), "requests": requests,
            "prompt_version": rec.judge["prompt_version"], "rubric_version": rec.judge["rubric_version"],
            "verifier_version": rec.judge["verifier_version"],
            "attempt_problems": [a.problems for a in rec.attempts],
            "levels": {k: {"raw_score": v.raw_score, "score": v.score, "verified": v.verified, "repaired": v.repaired,
                           "realised": v.realised, "missing": v.missing, "errors": v.errors,
                           "evidence": len(v.evidence)} for k, v in rec.levels.items()}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("golden")
    store = Store(tmp / "judge.sqlite")
    design_path = tmp / "model_design.json"
    design_path.write_text((GOLDEN / "judge_muon_design.json").read_text())
    first, repaired = straightforward_verdicts()
    out = {}
    try:
        for name, steps, subject in [
            ("expert", [{"json": expert_verdict()}], impl_from_solution("muon_newton_schulz", "expert", store)),
            ("straightforward", [{"json": first}, {"json": repaired}],
             impl_from_solution("muon_newton_schulz", "straightforward", store)),
            ("design", [{"json": design_verdict()}], design_from_file("muon_newton_schulz", design_path)),
        ]:
            with FakeProvider({"steps": steps}) as fp:
                cfg = JudgeConfig(backend="openai", model="fake-judge", base_url=fp.base_url + "/v1",
                                  options={"api": "responses"})
                rec = judge(subject, cfg, store=store)
                out[name] = digest(rec, len(fp.model_requests()))
                assert subject.eligible if name != "design" else True
    finally:
        store.close()
    return out


def test_golden_judge_run(results):
    if os.environ.get("D2K_UPDATE_GOLDEN"):
        GOLDEN_FILE.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    assert GOLDEN_FILE.is_file(), "run with D2K_UPDATE_GOLDEN=1 once"
    assert results == json.loads(GOLDEN_FILE.read_text())


def test_expert_real_lines_pass_verification_for_every_rubric_property(results):
    exp = results["expert"]
    assert exp["requests"] == 1 and exp["attempt_problems"] == [[]]
    for lvl, props in PROPERTIES.items():
        assert exp["levels"][lvl]["verified"] and exp["levels"][lvl]["realised"] == props
    assert exp["js"] == 85.0


def test_straightforward_is_repaired_and_scores_below_the_expert(results):
    sf = results["straightforward"]
    assert sf["requests"] == 2 and sf["levels"]["L3"]["repaired"] and sf["levels"]["L3"]["score"] == 25
    assert "line 1 is a docstring" in sf["attempt_problems"][0][0]
    assert sf["js"] < results["expert"]["js"]


def test_expert_property_lines_show_the_expected_code():
    """The located lines are the code the rubric describes (guards the locator itself)."""
    from test_judge_support import expert_property_lines

    src = expert_path().read_text().split("\n")
    lines = expert_property_lines()
    text = {p: "\n".join("\n".join(src[a - 1:b]) for a, b in spans) for p, spans in lines.items()}
    assert "_accumulate_state(P, Q" in text["q_composition"]
    assert "RESTART_BEFORE_STEP" in text["fixed_restart"] and "_gemm(Q, X" in text["fixed_restart"]
    assert "tl.where(offs_m[:, None] == offs_n[None, :], gamma" in text["batched_fused_gemm"]
    assert "tl.float16" in text["fp32_only_in_norm"]
    assert "tl.trans(res)" in text["symmetric_triangle"] and "min(j + 1, r1)" in text["symmetric_triangle"]
    assert "_CONFIG_TABLE" in text["tuned_tiles"] and "GROUP_M" in text["tuned_tiles"]
