"""Format and harness extensions made for the MoE / quantisation tasks, each with its rules:

* ``ScalarArg.axis``: an int scalar bound to a workload axis (usable in shapes and formulas);
* shape entries that are formulas of the axes (``"T * k + E * (B - 1)"``);
* ``OutputSpec.strides`` / ``Workload.strides``: a required output layout, checked in
  ``checks.structure`` on the strides the worker reports (a cross-process copy re-lays out);
* ``Workload.timing``: a per-workload timing mode;
* the ``ulp`` metric (distance in representable values; FP8 codes, integers);
* ``reference.check(inputs, outputs, output=...)``: custom checks told which output they check;
* FP8 outputs in the finiteness check; ``validate`` checking the reference's layout and its
  own custom checks.
"""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml

from d2kbench.checking import checks
from d2kbench.checking.expected import Expected
from d2kbench.checking.inputs import check_args, dim_size, make_args, output_shape
from d2kbench.checking.verdict import check_reply
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import validate_task
from d2kbench.tasks import TaskFileError, load_task
from d2kbench.tasks.schema import OutputSpec, ScalarArg, TaskSpec, Tolerance, Workload


def _tol(**kw):
    return Tolerance(rationale="test", **kw)


def _spec(**over) -> dict:
    base = {
        "id": "toy", "title": "t", "category": "moe", "origin": ["o"], "description": "d",
        "args": [{"name": "ids", "kind": "tensor", "shape": ["T", "k"], "dtype": "int32"},
                 {"name": "block", "kind": "int", "axis": "B"}],
        "outputs": [{"name": "out", "shape": ["T * k + B"], "dtype": "int32",
                     "checks": [{"metric": "exact", "rationale": "r"}]}],
        "workloads": [{"id": "w", "axes": {"T": 4, "k": 2, "B": 3}}],
        "smoke_workloads": [{"id": "s", "axes": {"T": 2, "k": 2, "B": 1}}],
        "timing": {"mode": "events"},
        "sol": {"reference": {"bytes": "4 * T * k + B"}},
    }
    base.update(over)
    return base


# ---- ScalarArg.axis and shape formulas ----------------------------------------------------------
def test_scalar_axis_is_an_axis_of_every_workload():
    spec = TaskSpec.model_validate(_spec())
    assert spec.axis_names() == {"T", "k", "B"}
    assert output_shape(spec.outputs[0].shape, spec.workloads[0]) == [4 * 2 + 3]
    bad = _spec(workloads=[{"id": "w", "axes": {"T": 4, "k": 2}}])
    with pytest.raises(ValueError, match="gives axes"):
        TaskSpec.model_validate(bad)


def test_scalar_axis_needs_an_int_scalar():
    with pytest.raises(ValueError, match="needs kind int"):
        ScalarArg(name="f", kind="float", axis="F")


def test_bound_scalar_must_equal_its_axis():
    spec = TaskSpec.model_validate(_spec())
    wl = spec.workloads[0]
    ids = torch.zeros(4, 2, dtype=torch.int32)
    assert check_args(spec, wl, [ids, 3]) == []
    problems = check_args(spec, wl, [ids, 5])
    assert problems and "bound to axis B = 3" in problems[0]


def test_shape_formula_with_unknown_axis_is_rejected():
    bad = _spec(outputs=[{"name": "out", "shape": ["T * Q"], "dtype": "int32",
                          "checks": [{"metric": "exact", "rationale": "r"}]}])
    with pytest.raises(ValueError, match=r"unknown axes \['Q'\]"):
        TaskSpec.model_validate(bad)


def test_dim_size_rejects_fractional_or_negative_sizes():
    wl = Workload(id="w", axes={"T": 3, "k": 2})
    assert dim_size("(T * k + 3) // 4", wl) == 2 and dim_size("T", wl) == 3 and dim_size(7, wl) == 7
    with pytest.raises(ValueError, match="not a whole number"):
        dim_size("T / 2", wl)
    with pytest.raises(ValueError, match="not a whole number"):
        dim_size("k - T", wl)


# ---- strides ------------------------------------------------------------------------------------
def _colmajor(M: int, G: int) -> torch.Tensor:
    return torch.zeros(G, (M + 3) // 4 * 4)[:, :M].T


def test_structure_checks_declared_strides_with_workload_override():
    out = OutputSpec(name="s", shape=["M", "G"], dtype="float32", strides=["G", 1],
                     checks=[_tol(metric="exact")])
    row = Workload(id="r", axes={"M": 5, "G": 3})
    col = Workload(id="c", axes={"M": 5, "G": 3}, strides={"s": [1, "(M + 3) // 4 * 4"]})
    assert checks.structure(0, out, torch.zeros(5, 3), row, None).passed
    assert checks.structure(0, out, _colmajor(5, 3), col, None).passed
    bad = checks.structure(0, out, torch.zeros(5, 3), col, None)
    assert not bad.passed and "strides [3, 1], the task requires [1, 8]" in bad.detail
    # the strides the worker reported win over those of the (re-laid-out) copy
    copy = _colmajor(5, 3).clone()
    assert list(copy.stride()) != [1, 8]
    assert checks.structure(0, out, copy, col, [1, 8]).passed
    assert not checks.structure(0, out, _colmajor(5, 3), col, [3, 1]).passed


def test_strides_of_size_one_dimensions_are_exempt():
    out = OutputSpec(name="s", shape=["M", "G"], dtype="float32", strides=[1, "M"], checks=[_tol(metric="exact")])
    wl = Workload(id="w", axes={"M": 4, "G": 1})
    assert checks.structure(0, out, torch.zeros(4, 1), wl, None).passed  # strides (1, 1): G = 1 exempt


def test_stride_override_must_name_an_output_and_match_its_rank():
    with pytest.raises(ValueError, match="unknown output 'nope'"):
        TaskSpec.model_validate(_spec(workloads=[{"id": "w", "axes": {"T": 4, "k": 2, "B": 3}, "strides": {"nope": [1]}}]))
    with pytest.raises(ValueError, match="2 entries for 1 dimensions"):
        TaskSpec.model_validate(_spec(workloads=[{"id": "w", "axes": {"T": 4, "k": 2, "B": 3}, "strides": {"out": [1, 1]}}]))


def test_worker_reported_strides_reach_the_check(tmp_path):
    """End to end on the CPU: a column-major scale layout survives the process boundary (the
    worker's copy is re-laid out), and a row-major answer to a column-major request fails."""
    task = load_task("per_token_group_quant_fp8")
    wl = [task.spec.workload("smoke_m37_k256_col")]
    good = evaluate(task, "straightforward", wl, "cpu", baseline=None, options=Options(time_solutions=False))
    assert good.candidate.results[0].status.value == "ok", good.candidate.results[0].cause
    src = (task.root / "solutions" / "straightforward.py").read_text()
    bad_src = src.replace("[:, :M].T\n", "[:, :M].T.contiguous()\n")
    assert bad_src != src
    path = tmp_path / "rowmajor.py"
    path.write_text(bad_src)
    bad = evaluate(task, path, wl, "cpu", baseline=None, options=Options(time_solutions=False))
    r = bad.candidate.results[0]
    assert r.status.value == "incorrect" and "x_s:structure" in r.cause and "requires [1, 40]" in r.cause


# ---- per-workload timing ------------------------------------------------------------------------
def test_workload_timing_overrides_the_task_timing():
    spec = TaskSpec.model_validate(_spec(workloads=[{"id": "w", "axes": {"T": 4, "k": 2, "B": 3},
                                                     "timing": {"mode": "graph"}}]))
    assert spec.timing.mode == "events"
    assert spec.timing_for(spec.workloads[0]).mode == "graph"
    assert spec.timing_for(spec.smoke_workloads[0]).mode == "events"
    moe = load_task("fused_moe_bf16").spec
    assert {w.id: moe.timing_for(w).mode for w in moe.workloads if not w.correctness_only} == {
        "qwen3_30b_a3b_t1": "graph", "mixtral_8x7b_t16": "events",
        "qwen3_30b_a3b_t8192": "events", "mixtral_8x7b_t4096": "events"}


# ---- ulp metric ---------------------------------------------------------------------------------
def test_ulp_distance_counts_representable_values():
    a = torch.tensor([0.0, -0.0, 1.0, -1.0, 448.0])
    for dt in (torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32, torch.float64):
        x = a.to(dt)
        assert checks.ulp_distance(x, x).tolist() == [0] * 5
        assert checks.ulp_distance(x[:1], x[1:2]).item() == 0  # +0 and -0 coincide
    one = torch.tensor([1.0])
    nxt = torch.nextafter(one, torch.tensor([2.0]))
    assert checks.ulp_distance(one, nxt).item() == 1 and checks.ulp_distance(-one, -nxt).item() == 1
    tiny = torch.tensor([1.4e-45])
    assert checks.ulp_distance(tiny, -tiny).item() == 2  # across zero
    codes = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn)  # all positive finite codes
    assert checks.ulp_distance(codes[1:], codes[:-1]).tolist() == [1] * 126
    assert checks.ulp_distance(torch.tensor([3], dtype=torch.int32), torch.tensor([7], dtype=torch.int32)).item() == 4


def test_ulp_metric_bounds_distance_and_fraction():
    exp = torch.arange(0, 100, dtype=torch.uint8).view(torch.float8_e4m3fn)
    out = exp.view(torch.uint8).clone()
    out[:2] += 1
    out = out.view(torch.float8_e4m3fn)
    dim = [0].index
    assert checks.compare(0, "q", _tol(metric="ulp", max=1, max_mismatch=0.02), out, exp, dim).passed
    frac = checks.compare(0, "q", _tol(metric="ulp", max=1, max_mismatch=0.01), out, exp, dim)
    assert not frac.passed and frac.error == pytest.approx(0.02)
    far = out.view(torch.uint8).clone()
    far[50] += 2
    r = checks.compare(0, "q", _tol(metric="ulp", max=1, max_mismatch=0.5), far.view(torch.float8_e4m3fn), exp, dim)
    assert not r.passed and "max distance 2" in r.detail
    with pytest.raises(ValueError, match="metric ulp needs 'max'"):
        _tol(metric="ulp")
    with pytest.raises(ValueError, match="whole number"):
        _tol(metric="ulp", max=0.5)


def test_finite_handles_fp8():
    q = torch.tensor([1.0, -2.0, 448.0]).to(torch.float8_e4m3fn)
    assert checks.finite(0, "q", q).passed
    nan = q.view(torch.uint8).clone()
    nan[1] = 0x7F  # e4m3fn NaN
    r = checks.finite(0, "q", nan.view(torch.float8_e4m3fn))
    assert not r.passed and "1 of 3" in r.detail


# ---- custom checks per output -------------------------------------------------------------------
def test_custom_check_is_told_which_output_it_checks():
    task = load_task("moe_align_block_size")
    ref = task.reference_module()
    wl = task.spec.workload("smoke_t5_k2_e4_b4")
    seen = []

    class Recording:
        run = staticmethod(ref.run)

        @staticmethod
        def check(inputs, outputs, output=None):
            seen.append(output)
            return ref.check(inputs, outputs, output)

    pristine = make_args(ref, task.spec, wl, 0, "cpu")
    outs = list(ref.run(*pristine))
    bad = outs[0].clone()
    bad[0] = -3  # neither an assignment nor the sentinel
    reply = {"outputs": [bad, outs[1], outs[2]], "types": ["torch.Tensor"] * 3, "subclass": [False] * 3,
             "container": "tuple"}
    results, _ = check_reply(0, task.spec, wl, Recording, pristine, Expected(task, Recording, wl, pristine), reply)
    assert seen == ["sorted_token_ids", "expert_ids"]
    by = {r.name: r for r in results}
    assert not by["sorted_token_ids:reference:custom"].passed
    assert "neither an assignment nor the sentinel" in by["sorted_token_ids:reference:custom"].detail
    assert by["expert_ids:reference:custom"].passed and by["num_tokens_post_padded:reference:exact"].passed


# ---- validate -----------------------------------------------------------------------------------
@pytest.fixture
def quant_copy(tmp_path):
    src = load_task("per_token_group_quant_fp8").root
    dst = tmp_path / "per_token_group_quant_fp8"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_validate_checks_the_reference_layout(quant_copy):
    # the copy's torch.compile alternative is validated on the shipped task (test_alternatives.py);
    # what this test is about (the reference's layout) runs either way
    assert validate_task(quant_copy, run_alternatives=False) == []
    data = yaml.safe_load((quant_copy / "task.yaml").read_text())
    for w in data["smoke_workloads"]:
        w.pop("strides", None)  # column-major smoke workloads now expect row-major scales
    (quant_copy / "task.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    problems = validate_task(quant_copy)
    assert any("smoke_m37_k256_col" in p and "the task requires [2, 1]" in p for p in problems), problems


def test_validate_runs_the_custom_check_on_the_reference(tmp_path):
    src = load_task("moe_align_block_size").root
    dst = tmp_path / "moe_align_block_size"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    assert validate_task(dst, run_alternatives=False) == []   # its torch.compile alternative: test_task_moe.py
    ref = (dst / "reference.py").read_text()
    (dst / "reference.py").write_text(ref.replace("sorted_ids = torch.full((length,), n,",
                                                  "sorted_ids = torch.full((length,), n + 1,"))
    problems = validate_task(dst)
    assert any("reference outputs fail check() of sorted_token_ids" in p for p in problems), problems


def test_malformed_extension_fields_name_the_field(tmp_path):
    src = load_task("moe_align_block_size").root
    dst = tmp_path / "moe_align_block_size"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    data = yaml.safe_load((dst / "task.yaml").read_text())
    data["outputs"][0]["strides"] = [1, 1]
    (dst / "task.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(TaskFileError, match="output 'sorted_token_ids' strides: 2 entries for 1 dimensions"):
        load_task(dst)
