"""The sensitivity call (``integrity.parent.sensitivity_check``) on real task code: which
answers pass it and which must fail it.

The call's inputs equal the previous call's except a secret change grown until the reference
output moves beyond ``SENSITIVITY_STRENGTH`` x a tolerance; its answer is checked with
tolerances ``SENSITIVITY_SLACK`` x wider, because one element at up to 8x an argument's largest
magnitude lies off the workload's distribution.
"""

from __future__ import annotations

import pytest
import torch

from d2kbench.checking.inputs import make_args
from d2kbench.checking.verdict import Checker
from d2kbench.integrity import parent
from d2kbench.tasks import load_task
from d2kbench.tasks.schema import Tolerance

TASK = "muon_newton_schulz"


@pytest.fixture(scope="module")
def setup():
    task = load_task(TASK)
    ref = task.reference_module()
    wl = task.spec.smoke_workloads[0]
    pristine = make_args(ref, task.spec, wl, 7, "cpu")
    checker = Checker(task, ref, wl)
    outputs = [ref.run(*[a.clone() if isinstance(a, torch.Tensor) else a for a in pristine])]
    return task, ref, wl, pristine, checker, outputs


def _reply(out: torch.Tensor) -> dict:
    return {"outputs": [out], "types": ["torch.Tensor"], "subclass": [False], "container": "Tensor",
            "aliases": []}


def _with_rel_error(x: torch.Tensor, rel: float, seed: int = 0) -> torch.Tensor:
    """``x`` plus noise whose Frobenius norm is ``rel`` x that of each [M, N] matrix of ``x``."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape, generator=g, dtype=torch.float64)
    xd = x.double()
    scale = xd.flatten(1).norm(dim=1) / noise.flatten(1).norm(dim=1)
    return (xd + noise * (rel * scale).view(-1, 1, 1)).to(x.dtype)


def _oracle_tol(wl, task) -> float:
    (tol,) = [t for t in wl.checks_for("out", task.spec.outputs[0].checks) if t.against == "oracle"]
    return tol.max


def test_widened_tolerances():
    t = Tolerance(metric="rel_fro", max=1e-3, rationale="r")
    assert t.widened(2).max == pytest.approx(2e-3) and t.widened(1) is t
    a = Tolerance(metric="allclose", atol=1e-2, rtol=1e-3, max_mismatch=0.6, rationale="r").widened(2)
    assert (a.atol, a.rtol, a.max_mismatch) == (pytest.approx(2e-2), pytest.approx(2e-3), 1.0)
    assert Tolerance(metric="ulp", max=1, max_mismatch=1e-3, rationale="r").widened(2.5).max == 3.0
    exact = Tolerance(metric="exact", rationale="r")
    assert exact.widened(4) is exact
    with pytest.raises(ValueError, match="only widened"):
        t.widened(0.5)


def test_an_honest_answer_off_the_distribution_passes(setup):
    """An answer 1.5x the oracle tolerance away from the FP64 value on the changed inputs (it
    would fail a correctness call) passes: the call's tolerances are twice as wide."""
    task, ref, wl, pristine, checker, outputs = setup
    tol = _oracle_tol(wl, task)

    def request(args):
        return _reply(_with_rel_error(ref.oracle(*args).to(outputs[0].dtype), 1.5 * tol))

    results, violations = parent.sensitivity_check(request, checker, pristine, outputs)
    assert violations == []
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    assert any(r.name == "sensitivity:out:oracle:rel_fro" and r.threshold == pytest.approx(2 * tol) for r in results)


def test_the_previous_output_is_stale(setup):
    task, ref, wl, pristine, checker, outputs = setup
    results, violations = parent.sensitivity_check(lambda args: _reply(outputs[0].clone()), checker, pristine, outputs)
    assert [v.rule for v in violations] == ["stale_output"]
    assert "beyond 4x its tolerance" in violations[0].evidence
    assert not [r for r in results if r.name == "sensitivity"][0].passed


def test_the_previous_output_with_noise_fails_the_widened_checks(setup):
    """Not bit-identical (no stale_output), but the reference moved beyond 4x the tolerance, so
    the old answer with noise of 0.5x the tolerance is beyond 2x and fails."""
    task, ref, wl, pristine, checker, outputs = setup
    tol = _oracle_tol(wl, task)
    results, violations = parent.sensitivity_check(
        lambda args: _reply(_with_rel_error(outputs[0], 0.5 * tol, seed=3)), checker, pristine, outputs)
    assert violations == []
    failed = [r for r in results if not r.passed]
    assert failed and failed[0].name.startswith("sensitivity:out:") and failed[0].error > 2 * tol


def test_runs_of_elements_where_one_cannot_move_the_reference(setup, monkeypatch):
    """A change too small to move the reference grows into a run of consecutive elements."""
    task, ref, wl, pristine, checker, outputs = setup
    monkeypatch.setattr(parent, "SENSITIVITY_FACTORS", (1e-4,))
    monkeypatch.setattr(parent, "SENSITIVITY_RUNS", (64,))
    results, violations = parent.sensitivity_check(lambda args: _reply(outputs[0].clone()), checker, pristine, outputs)
    assert "and the next 63 elements" in violations[0].evidence


def test_no_judgement_when_nothing_moves_the_reference_far_enough(setup, monkeypatch):
    """When no change moves the reference beyond the strength, a bit-identical output cannot be
    told from a correct one (a product rounded away): nothing is flagged and the check says so."""
    task, ref, wl, pristine, checker, outputs = setup
    monkeypatch.setattr(parent, "SENSITIVITY_STRENGTH", 1e9)
    calls = []
    results, violations = parent.sensitivity_check(lambda args: calls.append(1) or _reply(outputs[0].clone()),
                                                   checker, pristine, outputs)
    assert violations == [] and calls == []
    (r,) = results
    assert r.passed and "skipped" in r.detail and "beyond 1e+09x" in r.detail


def test_rejected_changes_release_their_inputs(setup, monkeypatch):
    """Each rejected change is forgotten by the checker: at most the pristine inputs and the
    chosen change stay cached (ten copies of a MoE layer's weights would not fit on the GPU)."""
    task, ref, wl, pristine, checker, outputs = setup
    monkeypatch.setattr(parent, "SENSITIVITY_STRENGTH", 1e9)
    checker = Checker(task, ref, wl)
    parent.sensitivity_check(lambda args: _reply(outputs[0].clone()), checker, pristine, outputs)
    assert [args is pristine for args, _ in checker._cache.values()] == [True]


def _sampling_args(seed: int = 5):
    task = load_task("topk_topp_sampling")
    wl = task.spec.smoke_workloads[0]
    return task, make_args(task.reference_module(), task.spec, wl, seed, "cpu")


def test_perturbations_stay_inside_a_declared_value_range():
    """topk_topp_sampling bounds temperature, top_p and the uniforms (``value_range``): the
    element changed before every CUDA-graph replay and the sensitivity call's element are drawn
    inside those ranges (on the H200 the unbounded draw gave negative temperatures and top-p above
    1, and 15-50% of the rows of a correct sampler failed the last-replay check). The logits,
    unbounded, still move by multiples of their largest magnitude."""
    import random

    from d2kbench.integrity.guard import Guard

    task, args = _sampling_args()
    names = [a.name for a in task.spec.args]
    bounds = {a.name: a.value_range for a in task.spec.args if getattr(a, "value_range", None)}
    assert set(bounds) == {"temperature", "top_p", "uniforms"}
    logits0 = args[0].clone()
    g = Guard("cpu", str(task.resolve_solution("straightforward")), task, task.reference_module(), trusted=False)
    before, _after = g.graph_hooks([args], None, lambda r, a: {})
    random.seed(0)
    for _ in range(400):
        before()
    for name, (lo, hi) in bounds.items():
        t = args[names.index(name)]
        assert lo <= float(t.min()) and float(t.max()) <= hi, name
    assert not torch.equal(args[0], logits0)
    assert float(args[0][args[0].isfinite()].abs().max()) > float(logits0[logits0.isfinite()].abs().max())

    # the sensitivity call's perturbation (only the bounded arguments are candidates here)
    rng = random.Random(1)
    empty = [torch.empty((0, args[0].shape[1]))] + args[1:]
    for _ in range(200):
        new, what = parent.perturb(empty, task.spec.args, rng, 8.0)
        for name, (lo, hi) in bounds.items():
            t = new[names.index(name)]
            assert lo <= float(t.min()) and float(t.max()) <= hi, (name, what)


def test_every_floating_point_input_changes_before_every_replay():
    """Each replay changes one element of every floating-point argument of set 0, so the three
    temperatures next to thousands of logits leave a solution's favourite range within a few
    replays (one argument picked per replay could leave them unchanged through a whole timing
    run); integer arguments (top_k) are left alone."""
    from d2kbench.integrity.guard import Guard

    task, args = _sampling_args()
    names = [a.name for a in task.spec.args]
    g = Guard("cpu", str(task.resolve_solution("straightforward")), task, task.reference_module(), trusted=False)
    before, _after = g.graph_hooks([args], None, lambda r, a: {})
    temperature = args[names.index("temperature")]
    left_the_range = 0
    for _ in range(30):
        prev = [a.clone() for a in args]
        before()
        changed = {n: int((a != p).sum()) for n, a, p in zip(names, args, prev)}
        assert changed == {"logits": 1, "temperature": 1, "top_k": 0, "top_p": 1, "uniforms": 1}, changed
        left_the_range += int(bool(((temperature < 0.4) | (temperature > 1.2)).any()))
    # each draw in [0.05, 4] lands inside [0.4, 1.2] with probability 0.2: never outside in 30: 1e-21
    assert left_the_range > 0


def test_without_a_value_range_the_perturbation_leaves_the_contract():
    """The same draws on the same arguments with the ranges removed leave the domain (a
    temperature below 0 or a uniform above 1): what the ranges exist for."""
    import random

    task, args = _sampling_args()
    spec_args = [a.model_copy(update={"value_range": None}) if getattr(a, "value_range", None) else a
                 for a in task.spec.args]
    rng = random.Random(1)
    empty = [torch.empty((0, args[0].shape[1]))] + args[1:]
    outside = 0
    for _ in range(50):
        new, _what = parent.perturb(empty, spec_args, rng, 8.0)
        outside += int(float(new[1].min()) <= 0 or float(new[3].max()) > 1 or float(new[4].max()) >= 1
                       or float(new[3].min()) <= 0 or float(new[4].min()) < 0)
    assert outside >= 40


def _topk_setup(seed: int):
    task = load_task("topk_topp_sampling")
    ref = task.reference_module()
    wl = task.spec.smoke_workloads[0]
    pristine = make_args(ref, task.spec, wl, seed, "cpu")
    outputs = [ref.run(*[a.clone() if isinstance(a, torch.Tensor) else a for a in pristine])]
    return ref, Checker(task, ref, wl), pristine, outputs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_custom_checked_output_is_judged_stale(seed):
    """topk_topp_sampling's ids are checked only by the task's property check (a sample, not a
    value): the call changes the inputs until the previous ids fail that check, so a sampler that
    answers from a memo of earlier calls is stale, and an honest sampler passes."""
    ref, checker, pristine, outputs = _topk_setup(seed)
    stale = outputs[0].clone()
    results, violations = parent.sensitivity_check(lambda args: {**_reply(stale.clone()), "container": "Tensor"},
                                                   checker, pristine, outputs)
    assert [v.rule for v in violations] == ["stale_output"], [r.detail for r in results if r.name == "sensitivity"]
    honest_results, honest_violations = parent.sensitivity_check(
        lambda args: _reply(ref.run(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])),
        checker, pristine, outputs)
    assert honest_violations == [] and all(r.passed for r in honest_results), \
        [r for r in honest_results if not r.passed]
    assert "moved beyond" in [r for r in honest_results if r.name == "sensitivity"][0].detail


def test_without_a_task_check_a_custom_output_never_counts_as_moved():
    ref, checker, pristine, outputs = _topk_setup(1)

    class NoCheck:
        pass

    assert parent._custom_rejects(NoCheck(), pristine, outputs, "ids") is False
    assert parent._custom_rejects(ref, pristine, outputs, "ids") is False  # its own outputs pass


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 5), (1, 1, 9), (4, 1, 3, 2)])
def test_the_description_names_the_element_torch_would(shape):
    """The changed element's index in the description is row-major, as ``torch.unravel_index``
    gives it (computed without torch: its first call imports sympy, seconds per process)."""
    n = 1
    for d in shape:
        n *= d
    for j in range(n):
        assert parent._unravel(j, shape) == [int(k) for k in torch.unravel_index(torch.tensor(j), shape)]
    assert parent._describe("x", shape, n - 1, 2, 1.0, 2.0) == f"x{[d - 1 for d in shape]} and the next 1 elements: 1 -> 2"
