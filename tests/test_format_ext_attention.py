"""Format extensions added with the attention tasks, tested on small synthetic tasks:

* ``dtype_param`` on tensor arguments and outputs: a workload parameter that overrides the
  declared dtype on that workload (float16 smoke workloads of bfloat16 tasks, because the CPU
  interpreter has no bfloat16 arithmetic);
* ``outputs: []`` for in-place operators (mutable arguments, ``run`` returns None or ``()``).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import yaml
from pydantic import ValidationError

from d2kbench.checking import checks
from d2kbench.checking.expected import Expected
from d2kbench.checking.inputs import check_args, make_args
from d2kbench.checking.verdict import check_reply
from d2kbench.harness.evaluate import Options, evaluate
from d2kbench.harness.validate import _run_smoke
from d2kbench.tasks import load_task
from d2kbench.tasks.schema import TaskSpec

_BASE = {
    "title": "t", "category": "attention", "origin": ["test"], "description": "d",
    "timing": {"mode": "events"}, "sol": {"reference": {"bytes": "4 * N"}},
}


def _scale_spec(**over) -> dict:
    spec = {
        **_BASE, "id": "scale_copy",
        "args": [{"name": "x", "kind": "tensor", "shape": ["N"], "dtype": "bfloat16", "dtype_param": "dtype"}],
        "outputs": [{"name": "out", "shape": ["N"], "dtype": "bfloat16", "dtype_param": "dtype",
                     "checks": [{"metric": "rel_fro", "max": 1e-2, "rationale": "r"}]}],
        "workloads": [{"id": "big", "axes": {"N": 64}}],
        "smoke_workloads": [{"id": "smoke", "axes": {"N": 8}, "params": {"dtype": "float16"}}],
    }
    spec.update(over)
    return spec


_SCALE_REF = textwrap.dedent('''
    import torch

    def make_inputs(w, seed, device):
        g = torch.Generator(device=device).manual_seed(seed)
        dt = getattr(torch, w.get("dtype", "bfloat16"))
        return {"x": torch.randn(w["N"], generator=g, device=device).to(dt)}

    def run(x):
        return (x.float() * 2).to(x.dtype)
''')

_INPLACE_REF = textwrap.dedent('''
    import torch

    def make_inputs(w, seed, device):
        g = torch.Generator(device=device).manual_seed(seed)
        return {"x": torch.randn(w["N"], generator=g, device=device),
                "y": torch.randn(w["N"], generator=g, device=device), "a": 0.5}

    def run(x, y, a):
        x.mul_(2.0).add_(y, alpha=a)
''')

_INPLACE_TRITON = textwrap.dedent('''
    import triton
    import triton.language as tl

    @triton.jit
    def _axpy(X, Y, a, N, BLOCK: tl.constexpr, WRONG: tl.constexpr):
        o = tl.arange(0, BLOCK)
        m = o < N
        x = tl.load(X + o, mask=m)
        y = tl.load(Y + o, mask=m)
        tl.store(X + o, 2.0 * x + a * y + (1.0 if WRONG else 0.0), mask=m)

    def run(x, y, a):
        _axpy[(1,)](x, y, a, x.numel(), BLOCK=triton.next_power_of_2(x.numel()), WRONG=WRONG)
        return RESULT
''')


def _inplace_spec() -> dict:
    return {
        **_BASE, "id": "axpy_inplace",
        "args": [{"name": "x", "kind": "tensor", "shape": ["N"], "dtype": "float32", "mutable": True},
                 {"name": "y", "kind": "tensor", "shape": ["N"], "dtype": "float32"},
                 {"name": "a", "kind": "float"}],
        "outputs": [],
        "state_checks": {"x": [{"metric": "allclose", "atol": 1e-6, "rtol": 1e-6, "rationale": "fp32 axpy"}]},
        "workloads": [{"id": "w", "axes": {"N": 40}}],
        "smoke_workloads": [{"id": "smoke", "axes": {"N": 37}}],
    }


def _task_dir(tmp_path, spec: dict, reference: str):
    root = tmp_path / spec["id"]
    root.mkdir()
    (root / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / "reference.py").write_text(reference)
    return root


# --- dtype_param ---------------------------------------------------------------------------------
def test_dtype_param_overrides_per_workload():
    spec = TaskSpec.model_validate(_scale_spec())
    big, smoke = spec.workload("big"), spec.workload("smoke")
    assert spec.args[0].dtype_for(big) == "bfloat16" and spec.args[0].dtype_for(smoke) == "float16"
    assert spec.outputs[0].dtype_for(smoke) == "float16" and spec.outputs[0].dtype_for(None) == "bfloat16"
    assert check_args(spec, smoke, [torch.zeros(8, dtype=torch.float16)]) == []
    assert check_args(spec, smoke, [torch.zeros(8, dtype=torch.bfloat16)]) == [
        "x has dtype torch.bfloat16, expected float16"]
    assert check_args(spec, big, [torch.zeros(64, dtype=torch.bfloat16)]) == []
    st = checks.structure(0, spec.outputs[0], torch.zeros(8, dtype=torch.bfloat16), smoke)
    assert not st.passed and "expected float16" in st.detail
    assert checks.structure(0, spec.outputs[0], torch.zeros(8, dtype=torch.float16), smoke).passed


def test_dtype_param_value_must_be_a_dtype():
    bad = _scale_spec(smoke_workloads=[{"id": "smoke", "axes": {"N": 8}, "params": {"dtype": "half"}}])
    with pytest.raises(ValidationError, match="sets dtype='half'"):
        TaskSpec.model_validate(bad)


def test_dtype_param_end_to_end(tmp_path):
    task = load_task(_task_dir(tmp_path, _scale_spec(), _SCALE_REF))
    assert _run_smoke(task) == []
    ev = evaluate(task, "reference", device="cpu", baseline=None, options=Options(integrity=False))
    assert [r.status.value for r in ev.candidate.results] == ["ok"]
    wrong = tmp_path / "wrong_dtype.py"
    wrong.write_text("import torch\ndef run(x):\n    return (x.float() * 2)\n")
    ev = evaluate(task, wrong, device="cpu", baseline=None, options=Options(integrity=False))
    r = ev.candidate.results[0]
    assert r.status.value == "incorrect" and "expected float16" in r.cause


# --- in-place operators (no outputs) --------------------------------------------------------------
def test_empty_outputs_need_a_mutable_argument():
    spec = _inplace_spec()
    assert TaskSpec.model_validate(spec).outputs == []
    spec["args"][0]["mutable"] = False
    spec.pop("state_checks")
    with pytest.raises(ValidationError, match="needs outputs, or mutable arguments"):
        TaskSpec.model_validate(spec)


@pytest.mark.parametrize("container", ["NoneType", "tuple"])
def test_check_reply_accepts_none_or_empty_tuple(tmp_path, container):
    task = load_task(_task_dir(tmp_path, _inplace_spec(), _INPLACE_REF))
    ref = task.reference_module()
    wl = task.spec.workload("smoke")
    pristine = make_args(ref, task.spec, wl, 1, "cpu")
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in pristine]
    ref.run(*args)
    outs = [None] if container == "NoneType" else []
    reply = {"outputs": outs, "types": ["builtins.NoneType"] * len(outs), "subclass": [False] * len(outs),
             "container": container, "aliases": []}
    results, violations = check_reply(0, task.spec, wl, ref, args, Expected(task, ref, wl, pristine), reply)
    assert violations == [] and results and all(r.passed for r in results), results
    assert {r.name for r in results} >= {"state:x:reference:allclose", "y:untouched"}
    # returning a tensor from an in-place operator is a count mismatch
    bad = dict(reply, outputs=[torch.zeros(1)], types=["torch.Tensor"], subclass=[False], container="Tensor")
    results, _ = check_reply(0, task.spec, wl, ref, args, Expected(task, ref, wl, pristine), bad)
    assert not results[0].passed and results[0].name == "outputs:count"


def test_validate_smoke_accepts_reference_returning_none(tmp_path):
    task = load_task(_task_dir(tmp_path, _inplace_spec(), _INPLACE_REF))
    assert _run_smoke(task) == []


@pytest.mark.parametrize("result,wrong,status", [("None", False, "ok"), ("()", False, "ok"), ("None", True, "incorrect")])
def test_inplace_triton_solution_end_to_end(tmp_path, result, wrong, status):
    task = load_task(_task_dir(tmp_path, _inplace_spec(), _INPLACE_REF))
    sol = tmp_path / "sol.py"
    sol.write_text(_INPLACE_TRITON.replace("RESULT", result).replace("WRONG=WRONG", f"WRONG={wrong}"))
    ev = evaluate(task, sol, device="cpu", baseline=None, options=Options(integrity=False, cpu_samples=1))
    r = ev.candidate.results[0]
    assert r.status.value == status, r.cause
    if wrong:
        assert "state:x" in r.cause
