"""The format's distributed extension: tensor-list arguments (``count``), distributed workloads
(``ranks``) and the bitwise identity of outputs across ranks.

A tensor list is R tensors, each its own allocation (the peer buffers of a simulated
tensor-parallel group): the harness checks, clones, perturbs (sensitivity call) and guards
(untouched, aliasing) every element like a tensor argument. A workload of several ranks is
reported not_run by the single-process harness with the GPUs it needs. The rank check fails
on one differing bit.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

import random  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from d2kbench.checking import checks  # noqa: E402
from d2kbench.checking.aliases import find_aliases  # noqa: E402
from d2kbench.checking.inputs import arg_tensors, args_nbytes, check_args, clone_args  # noqa: E402
from d2kbench.checking.ranks import identical_across_ranks  # noqa: E402
from d2kbench.harness.evaluate import Options, default_workloads, evaluate, skipped_by_default, unrunnable  # noqa: E402
from d2kbench.integrity.parent import perturb, redraw  # noqa: E402
from d2kbench.results import Status  # noqa: E402
from d2kbench.tasks import load_task  # noqa: E402
from d2kbench.tasks.schema import TensorArg, Workload  # noqa: E402

TASK = load_task("allreduce_residual_rmsnorm")
WL = TASK.spec.workload("smoke_r4_t7_h384_quant")


def _args(seed: int = 0) -> list:
    i = TASK.reference_module().make_inputs(WL.values(), seed, "cpu")
    return [i[a.name] for a in TASK.spec.args]


def test_schema_tensor_list_and_ranks():
    a = TensorArg(name="p", kind="tensor", count="R", shape=["T", "H"], dtype="bfloat16")
    assert a.count == "R" and "R" in TASK.spec.axis_names()
    with pytest.raises(ValidationError, match="cannot be mutable"):
        TensorArg(name="p", kind="tensor", count="R", shape=["T"], dtype="bfloat16", mutable=True)
    with pytest.raises(ValidationError):
        Workload(id="w", axes={"T": 1}, ranks=0)
    assert Workload(id="w", axes={"T": 1}).ranks == 1


def test_tensor_list_arguments_are_checked_as_separate_allocations():
    args = _args()
    assert check_args(TASK.spec, WL, args) == []
    stacked = torch.stack(args[0])                                 # one allocation, R views
    assert any("share storage" in p for p in check_args(TASK.spec, WL, [list(stacked.unbind(0)), *args[1:]]))
    assert any("holds 3 tensors" in p for p in check_args(TASK.spec, WL, [args[0][:3], *args[1:]]))
    assert any("not a list of tensors" in p for p in check_args(TASK.spec, WL, [stacked, *args[1:]]))
    assert any("partials[2]" in p for p in check_args(TASK.spec, WL, [[*args[0][:2], args[0][2].float(), args[0][3]],
                                                                    *args[1:]]))
    copy = clone_args(args)
    assert [t.data_ptr() for t in copy[0]] != [t.data_ptr() for t in args[0]]
    assert all(torch.equal(a, b) for a, b in zip(copy[0], args[0]))
    assert len(arg_tensors(args)) == 4 + 2 and args_nbytes(args) == sum(t.nbytes for t in arg_tensors(args))
    assert find_aliases([args[0][2].view(-1)], args) and not find_aliases([args[0][2].clone()], args)


def test_sensitivity_changes_single_partials():
    """perturb and redraw pick elements of the list's tensors (weighted by size): every rank is
    drawn, and only the drawn tensor changes."""
    args, rng, seen = _args(), random.SystemRandom(), set()
    for k in range(60):
        got = perturb(args, TASK.spec.args, rng, 1.0) if k % 2 else redraw(args, TASK.spec.args, rng, 8)
        if got is None:  # a redrawn run equal to the old values
            continue
        new, what = got
        if what.startswith("partials["):
            r = int(what[len("partials["):what.index("]")])
            seen.add(r)
            changed = [not torch.equal(a, b) for a, b in zip(new[0], args[0])]
            assert changed == [q == r for q in range(4)], (what, changed)
    assert seen == {0, 1, 2, 3}


def test_identical_across_ranks_fails_on_one_bit():
    y = torch.randn(4, 8).bfloat16()
    same = identical_across_ranks(3, ["y", "s"], [[y, y[:, 0].float()], [y.clone(), y[:, 0].float()]])
    assert [c.passed for c in same] == [True, True] and same[0].name == "y:identical_across_ranks"
    flipped = y.clone()
    flipped.view(torch.int16)[2, 5] ^= 1                       # one bit of one element on rank 2
    res = identical_across_ranks(0, ["y"], [[y], [y.clone()], [flipped]])
    assert not res[0].passed and res[0].error == 1.0 and "rank 2" in res[0].detail and "(2, 5)" in res[0].detail
    assert not identical_across_ranks(0, ["y"], [[y], [y.float()]])[0].passed
    with pytest.raises(ValueError):
        identical_across_ranks(0, ["y"], [[y]])


def test_empty_outputs_have_no_layout_to_check():
    spec = next(o for o in TASK.spec.outputs if o.name == "y_s")
    wl = TASK.spec.workload("smoke_r2_t5_h256")
    assert checks.structure(0, spec, torch.empty((5, 0)), wl).passed
    assert not checks.structure(0, spec, torch.empty((5, 3)), wl).passed


def test_distributed_workloads_are_not_run_here(tmp_path):
    """unrunnable names the GPUs a workload of several ranks needs; a solution that writes into
    one partial fails that partial's untouched check through the harness."""
    assert unrunnable(TASK.spec.workload("smoke_r2_t5_h256"), "cpu") is None
    # the default sets leave it out (agents, evaluations and benches never fail on it), and say so
    assert "llama31_70b_tp8_t128_decode" not in [w.id for w in default_workloads(TASK, "cuda")]
    assert len(default_workloads(TASK, "cuda")) == len(TASK.spec.workloads) - 1
    assert [s.split(":")[0] for s in skipped_by_default(TASK, "cuda")] == ["llama31_70b_tp8_t128_decode"]
    why = unrunnable(TASK.spec.workload("llama31_70b_tp8_t128_decode"), "cpu")
    assert why is not None and "needs 8 GPUs" in why and "has 0" in why
    src = (TASK.root / "solutions" / "expert.py").read_text()
    assert src.count("    return y, s\n") == 1
    bad = tmp_path / "writes_a_partial.py"
    bad.write_text(src.replace("    return y, s\n", "    partials[-1].mul_(2.0)\n    return y, s\n"))
    r = evaluate(TASK, bad, [TASK.spec.workload("smoke_r2_t5_h256")], device="cpu", baseline=None,
                 options=Options(cpu_samples=1, integrity=False)).candidate.results[0]
    failed = {c.name for c in r.checks if not c.passed}
    assert r.status is Status.INCORRECT and "partials[1]:untouched" in failed and "partials[0]:untouched" not in failed
