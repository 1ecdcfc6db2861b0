"""The judge end to end against the offline fake provider: caching, incorrect submissions,
the repair round, samples, every provider API, runs from the store, runtime kept out."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
from agents_fakes.fake_provider import FakeProvider
from test_judge_support import (
    PROPERTIES,
    cite,
    design_fixture,
    expert_path,
    expert_verdict,
    level,
    quote,
    straightforward_path,
    text_line,
    verdict,
    zero_verdict,
)

from d2kbench.judge.runner import JudgeConfig, JudgeError, judge, judge_samples
from d2kbench.judge.targets import (
    TargetError,
    design_from_file,
    impl_from_run,
    impl_from_solution,
)
from d2kbench.store import Store

TASK = "muon_newton_schulz"


def cfg_for(fp: FakeProvider, api: str = "chat", **kw) -> JudgeConfig:
    if api == "anthropic":
        return JudgeConfig(backend="anthropic", model="fake-model", base_url=fp.base_url, **kw)
    return JudgeConfig(backend="openai", model="fake-model", base_url=fp.base_url + "/v1",
                       options={"api": api} if api != "chat" else {}, **kw)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "judge.sqlite")
    yield s
    s.close()


@pytest.fixture(scope="module")
def expert_subject():
    return impl_from_solution(TASK, "expert", check="trust")


def add_candidate(store: Store, tmp_path, run_id: str, source, n: int, ms: float, eligible: bool = True,
                  speedup: float = 1.2345) -> int:
    """One candidate of a run: a snapshot copy of ``source`` and a complete evaluation of it
    (one workload, ``ms`` per call; failed when not ``eligible``)."""
    from d2kbench.harness.timing import summarize
    from d2kbench.judge.cache import sha256_text
    from d2kbench.results import SolutionRun, Status, WorkloadResult

    snap = tmp_path / f"{run_id}-{n:03d}.py"
    shutil.copy(source, snap)
    sha = sha256_text(snap.read_bytes())
    ev = f"ev-{run_id}-{n}"
    sol = SolutionRun(solution=str(snap), path=str(snap), sha256=sha, role="candidate")
    res = WorkloadResult(workload="w1", status=Status.OK if eligible else Status.INCORRECT,
                         timing=summarize([ms] * 3, "events") if eligible else None)
    store.record(ev, TASK, sol, res, "cpu", {"device": "cpu"}, "2026-11-29T12:00:00+00:00")
    store.finish_evaluation(ev)
    return store.add_candidate(run_id, turn=3 + n, solution_sha256=sha, path=str(snap), eval_id=ev, eligible=eligible,
                               geomean_speedup=speedup if eligible else None)


def add_run(store: Store, tmp_path, run_id: str, source, eligible: bool = True, speedup: float = 1.2345) -> None:
    """A finished run with one candidate (a snapshot copy of ``source``) at turn 3."""
    store.start_run(run_id, task=TASK, model="agent-model", backend="openai", guidance="L1+L2+L3", seed=0,
                    budget_turns=10, config={})
    cid = add_candidate(store, tmp_path, run_id, source, 0, 1.0, eligible, speedup)
    store.finish_run(run_id, status="finished", final_candidate=cid if eligible else None, exit_reason="completed")


def test_second_call_is_served_from_the_cache(store, expert_subject):
    with FakeProvider({"steps": [{"json": expert_verdict()}, {"json": zero_verdict()}]}) as fp:
        cfg = cfg_for(fp)
        first = judge(expert_subject, cfg, store=store)
        assert not first.cached and len(fp.model_requests()) == 1
        again = judge(expert_subject, cfg, store=store)
        assert again.cached and len(fp.model_requests()) == 1, "a cached verdict must not reach the provider"
        assert again.scores() == first.scores() == {"L1": 90.0, "L2": 85.0, "L3": 80.0, "JS": 85.0}
        assert len(store.verdict_rows()) == 1
        # another sample index is an independent answer: a new request
        other = judge(expert_subject, cfg, store=store, sample=1)
        assert not other.cached and len(fp.model_requests()) == 2 and other.js == 0.0
    row = store.verdict_rows()[0]
    assert (row["kind"], row["target"], row["model"], row["backend"], row["status"]) == (
        "impl", expert_subject.target, "fake-model", "openai", "judged")
    assert row["prompt_version"] == "judge_system@1+judge_impl@2+judge_repair@1" and row["rubric_version"] == "1"
    assert row["input_hash"] == first.input_hash and (row["l1"], row["l2"], row["l3"], row["js"]) == (90, 85, 80, 85)


def test_cache_key_covers_the_candidate_source_and_the_model(store, expert_subject, tmp_path):
    edited = tmp_path / "expert_edited.py"
    edited.write_text(expert_path().read_text() + "\n# an edit\n")
    subject2 = impl_from_solution(TASK, str(edited), check="trust")
    with FakeProvider({"steps": [{"json": expert_verdict()}] * 3}) as fp:
        a = judge(expert_subject, cfg_for(fp), store=store)
        b = judge(subject2, cfg_for(fp), store=store)
        c = judge(expert_subject, cfg_for(fp).model_copy(update={"model": "other-model"}), store=store)
    assert len({a.input_hash, b.input_hash, c.input_hash}) == 3


def test_incorrect_submission_scores_zero_without_a_model_call(store, tmp_path):
    add_run(store, tmp_path, "run-bad", straightforward_path(), eligible=False)
    subject = impl_from_run(store, "run-bad")
    assert not subject.eligible and "none of the run's 1 candidates is fully correct" in subject.reason
    with FakeProvider({"steps": [{"json": expert_verdict()}]}) as fp:
        rec = judge(subject, cfg_for(fp), store=store)
        assert fp.requests == []
    assert rec.status == "ineligible" and rec.scores() == {"L1": 0, "L2": 0, "L3": 0, "JS": 0}
    row = store.verdict_rows()[0]
    assert (row["target"], row["status"], row["js"]) == ("run-bad", "ineligible", 0.0)


def test_run_target_and_runtime_never_reaches_the_judge(store, tmp_path):
    add_run(store, tmp_path, "run-good", expert_path(), speedup=1.2345)
    add_run(store, tmp_path, "run-twin", expert_path(), speedup=1.2345)
    subject = impl_from_run(store, "run-go")  # unique prefix
    from d2kbench.judge.cache import sha256_text

    expert_sha = sha256_text(expert_path().read_bytes())
    assert subject.target == expert_sha and subject.meta["turn"] == 3 and subject.meta["run_id"] == "run-good"
    with FakeProvider({"steps": [{"json": expert_verdict()}]}) as fp:
        rec = judge(subject, cfg_for(fp), store=store)
        body = json.dumps(fp.requests[0].body)
        twin = judge(impl_from_run(store, "run-twin"), cfg_for(fp), store=store)
        assert len(fp.model_requests()) == 1, "the same candidate of another run reuses the cached verdict"
    assert rec.js == 85.0 and twin.cached and twin.target == expert_sha
    assert [r["target"] for r in store.verdict_rows()] == [expert_sha]  # one verdict of one content hash
    user = fp.requests[0].body["messages"][1]["content"]
    assert "1.2345" not in body and "speedup" not in user.lower() and "geomean" not in user.lower()
    first_code = text_line(expert_path(), "POLAR_EXPRESS_COEFFS: tuple")
    assert f"{first_code:>4}\tPOLAR_EXPRESS_COEFFS: tuple" in user, "the candidate is numbered"
    assert "Compose the polynomial steps on the small Gram side" in user, "the guidance is given"
    assert "`q_composition`" in user and "Credit requires the code to show" in user, "rubric and judge notes"
    with pytest.raises(TargetError, match="no run 'nope'"):
        impl_from_run(store, "nope")
    with pytest.raises(TargetError, match="ambiguous"):
        impl_from_run(store, "run-")


def test_the_judge_targets_the_scoring_rules_final_candidate(store, tmp_path):
    """Own-evaluation speedups 1.30 vs 1.28, latencies 1.00 vs 0.98 ms: the final candidate is
    the 0.98 ms one, whatever the speedups say, and the judge assesses exactly that source."""
    from d2kbench.judge.cache import sha256_text

    store.start_run("run-two", task=TASK, model="agent-model", backend="openai", guidance="none", seed=0,
                    budget_turns=10, config={})
    add_candidate(store, tmp_path, "run-two", straightforward_path(), 1, 1.00, speedup=1.30)
    fast = add_candidate(store, tmp_path, "run-two", expert_path(), 2, 0.98, speedup=1.28)
    store.finish_run("run-two", status="finished", final_candidate=fast, exit_reason="completed")
    subject = impl_from_run(store, "run-two")
    assert subject.meta["candidate_id"] == fast and subject.target == sha256_text(expert_path().read_bytes())
    # a store that records the other candidate (the old rule: highest own-evaluation speedup) is an error
    store.conn.execute("UPDATE runs SET final_candidate = ? WHERE run_id = 'run-two'", (fast - 1,))
    store.conn.commit()
    with pytest.raises(TargetError, match=f"records candidate {fast - 1} as the final answer, but the "
                                          f"final-selection rule .* selects {fast}"):
        impl_from_run(store, "run-two")


def test_repair_round_replaces_only_failed_levels(store, expert_subject):
    doc = text_line(expert_path(), "L3 -- tiling for sm_90")
    first = expert_verdict()
    first["L3"]["evidence"][0] = cite(doc, doc + 2, "symmetric_triangle")  # a docstring
    second = expert_verdict({"L1": 100.0, "L2": 100.0, "L3": 70.0})  # tries to raise L1/L2 too
    with FakeProvider({"steps": [{"json": first}, {"json": second}]}) as fp:
        rec = judge(expert_subject, cfg_for(fp), store=store)
        repair_req = fp.model_requests()[1].body["messages"]
    assert len(rec.attempts) == 2 and rec.attempts[0].problems == [
        f"L3 evidence 1: lines {doc}-{doc + 2} of solution.py: line {doc} is a docstring, not executable code"]
    assert repair_req[-2]["role"] == "assistant" and json.loads(repair_req[-2]["content"])["L3"]["score"] == 80
    assert "is a docstring" in repair_req[-1]["content"]
    assert rec.scores() == {"L1": 90.0, "L2": 85.0, "L3": 70.0, "JS": pytest.approx(245 / 3)}
    assert rec.levels["L3"].repaired and not rec.levels["L1"].repaired


def test_a_level_that_fails_after_repair_scores_zero(store, expert_subject):
    comment = text_line(expert_path(), "# P = a I + b A + c A^2")
    bad = expert_verdict()
    bad["L1"]["evidence"][0] = cite(comment, comment, "q_composition")
    with FakeProvider({"steps": [{"json": bad}, {"json": bad}]}) as fp:
        rec = judge(expert_subject, cfg_for(fp), store=store)
    assert rec.levels["L1"].score == 0 and rec.levels["L1"].raw_score == 90 and not rec.levels["L1"].verified
    assert "is a comment" in rec.levels["L1"].errors[0]
    assert rec.js == pytest.approx((0 + 85 + 80) / 3)
    with FakeProvider({"steps": [{"json": bad}]}) as fp:
        norepair = judge(expert_subject, cfg_for(fp, repair=False), store=store)
        assert len(fp.model_requests()) == 1
    assert norepair.levels["L1"].score == 0 and len(norepair.attempts) == 1


def test_malformed_answers(store, expert_subject):
    broken = expert_verdict()
    broken["L2"]["score"] = 180
    with FakeProvider({"steps": [{"text": "I think it is good."}, {"json": expert_verdict()}]}) as fp:
        rec = judge(expert_subject, cfg_for(fp), store=store)
    assert rec.js == 85.0 and all(rec.levels[lvl].repaired for lvl in ("L1", "L2", "L3"))
    assert "not valid JSON" in rec.attempts[0].problems[0]
    with FakeProvider({"steps": [{"json": broken}, {"json": broken}]}) as fp:
        with pytest.raises(JudgeError, match=r"no valid impl verdict after the repair round: /L2/score: Input should "
                                             r"be less than or equal to 100"):
            judge(expert_subject, cfg_for(fp).model_copy(update={"model": "m2"}), store=store)
    assert [r["model"] for r in store.verdict_rows()] == ["fake-model"], "a failed judgement stores nothing"


def test_samples_report_median_and_spread(store, expert_subject):
    scores = [{"L1": 90.0, "L2": 85.0, "L3": 80.0}, {"L1": 60.0, "L2": 85.0, "L3": 40.0},
              {"L1": 75.0, "L2": 70.0, "L3": 80.0}]
    with FakeProvider({"steps": [{"json": expert_verdict(s)} for s in scores]}) as fp:
        summary = judge_samples(expert_subject, cfg_for(fp), 3, store=store)
        assert len(fp.model_requests()) == 3
        again = judge_samples(expert_subject, cfg_for(fp), 3, store=store)
        assert len(fp.model_requests()) == 3 and all(r.cached for r in again.records)
    st = summary.stats
    assert (st["L1"].median, st["L1"].spread) == (75.0, 30.0)
    assert (st["L3"].median, st["L3"].low, st["L3"].high) == (80.0, 40.0, 80.0)
    assert st["JS"].median == pytest.approx(75.0) and st["JS"].spread == pytest.approx(85.0 - 185 / 3)
    assert [r["sample"] for r in store.verdict_rows()] == [0, 1, 2]


@pytest.mark.parametrize("api", ["chat", "responses", "anthropic"])
def test_every_provider_api_gets_the_strict_schema(store, expert_subject, api):
    with FakeProvider({"steps": [{"json": expert_verdict()}]}) as fp:
        rec = judge(expert_subject, cfg_for(fp, api), store=store)
        body = fp.requests[0].body
    assert rec.js == 85.0
    if api == "chat":
        assert body["response_format"]["json_schema"]["strict"] is True
    elif api == "responses":
        assert body["text"]["format"]["type"] == "json_schema"
    else:
        assert body["tool_choice"] == {"type": "tool", "name": "structured_output"}
        assert body["tools"][0]["input_schema"]["additionalProperties"] is False


def test_design_judge_verifies_quotes_against_the_design_only(store, tmp_path):
    path = tmp_path / "model_design.json"
    path.write_text(json.dumps(design_fixture()))
    subject = design_from_file(TASK, path)
    good = verdict(
        level([quote("apply Q to X once per segment", "q_composition"),
               quote("After the first two coefficient triples commit X <- Q X in FP16", "fixed_restart")],
              PROPERTIES["L1"], [], 85),
        level([quote("the rectangular X is only read to build R and at the two commits", "x_fixed_in_segment"),
               quote("Compute alpha A B + beta C + gamma I in the epilogue of one batched GEMM launch",
                     "batched_fused_gemm"),
               quote("FP16 operands with FP32 accumulation; FP32 only in the norm.", "fp32_only_in_norm")],
              PROPERTIES["L2"], [], 75),
        level([quote("each off-diagonal tile stored at (i, j) and transposed at (j, i)", "symmetric_triangle")],
              ["symmetric_triangle"], ["tuned_tiles"], 50))
    from_guidance = copy.deepcopy(good)
    from_guidance["L3"]["evidence"][0] = quote("write each diagonal tile once, and write every off-diagonal tile both "
                                               "at (i, j) and transposed at (j, i)", "symmetric_triangle")
    with FakeProvider({"steps": [{"json": from_guidance}, {"json": from_guidance}]}) as fp:
        rec = judge(subject, cfg_for(fp), store=store)
        user = fp.requests[0].body["messages"][1]["content"]
    assert rec.levels["L3"].score == 0 and "taken from the guidance" in rec.levels["L3"].errors[0]
    assert rec.scores()["JS"] == pytest.approx(160 / 3)
    assert "/L1/1/causal_chain/change: After the first two coefficient triples" in user
    assert "Compose the polynomial steps" not in user, "the design judge does not see the guidance"
    with FakeProvider({"steps": [{"json": good}]}) as fp:
        ok = judge(subject, cfg_for(fp).model_copy(update={"model": "m3"}), store=store)
    assert ok.scores() == {"L1": 85, "L2": 75, "L3": 50, "JS": pytest.approx(70)}
    assert ok.levels["L2"].located == ["/L2/0/causal_chain/change", "/L2/1/causal_chain/change", "/L2/1/layout"]
    row = store.verdict_rows()[-1]
    assert (row["kind"], row["target"]) == ("design", subject.target)


def _record_eval(store: Store, path, statuses: dict[str, str], eval_id: str) -> None:
    from d2kbench.judge.cache import sha256_text
    from d2kbench.results import SolutionRun, Status, WorkloadResult

    run = SolutionRun(solution=str(path), path=str(path), sha256=sha256_text(path.read_bytes()), role="candidate")
    for wl, status in statuses.items():
        store.record(eval_id, TASK, run, WorkloadResult(workload=wl, status=Status(status)), "cpu", {}, "2026-11-29")


def test_solution_eligibility_from_the_store(store, tmp_path):
    cand = tmp_path / "cand.py"
    cand.write_text(straightforward_path().read_text())
    with pytest.raises(TargetError, match="no evaluation of .* in the store"):
        impl_from_solution(TASK, str(cand), store, check="store")
    _record_eval(store, cand, {"smoke_wide_2x32x96": "ok", "smoke_tall_1x64x48": "incorrect"}, "ev-old")
    subject = impl_from_solution(TASK, str(cand), store, check="auto")
    assert not subject.eligible and "smoke_tall_1x64x48: incorrect" in subject.reason
    with FakeProvider({"steps": [{"json": expert_verdict()}]}) as fp:
        rec = judge(subject, cfg_for(fp), store=store)
        assert fp.requests == [] and rec.status == "ineligible" and rec.js == 0
    _record_eval(store, cand, {"smoke_wide_2x32x96": "ok", "smoke_tall_1x64x48": "ok"}, "ev-new")
    fixed = impl_from_solution(TASK, str(cand), store, check="store")
    assert fixed.eligible and "ev-new" in fixed.reason and fixed.target == subject.target


def test_solution_eligibility_by_evaluating(monkeypatch, tmp_path):
    """``--check evaluate`` asks the harness (stubbed here: a real CPU evaluation takes ~40 s)."""
    import d2kbench.harness.evaluate as harness
    from d2kbench.results import Evaluation, SolutionRun, Status, WorkloadResult

    cand = tmp_path / "cand.py"
    cand.write_text("def run(G, steps=5):\n    return G\n")
    calls = []

    def fake_evaluate(task, path, workloads, device, baseline, *, store=None, options=None, progress=None):
        calls.append((path, device, baseline))
        run = SolutionRun(solution=str(path), path=str(path), sha256="x", role="candidate",
                          results=[WorkloadResult(workload="smoke_wide_2x32x96", status=Status.INCORRECT)])
        return Evaluation(id="ev-now", task=task.id, device="cpu", created_at="now", candidate=run)

    monkeypatch.setattr(harness, "evaluate", fake_evaluate)
    subject = impl_from_solution(TASK, str(cand), None, check="auto", device="cpu")
    assert calls == [(cand.resolve(), "cpu", None)]
    assert not subject.eligible and subject.reason == "evaluated now (ev-now, cpu): smoke_wide_2x32x96: incorrect"
