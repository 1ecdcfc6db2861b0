"""Correctness checks run by the trusted parent (DESIGN.md section 3).

All comparisons happen in float64 on the device the tensors live on. Each function returns
:class:`~d2kbench.harness.results.CheckResult` records; none of them raises on bad solution
output (a wrong type or shape is a failed check, not an exception).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from d2kbench.harness.inputs import output_shape, torch_dtype
from d2kbench.harness.results import CheckResult
from d2kbench.tasks.schema import OutputSpec, Tolerance, Workload


def structure(call: int, spec: OutputSpec, value: Any, workload: Workload) -> CheckResult:
    """Type (exactly ``torch.Tensor``), shape and dtype of one output."""
    name = f"{spec.name}:structure"
    if not isinstance(value, torch.Tensor):
        return CheckResult(call=call, name=name, passed=False, detail=f"{spec.name} is {type(value).__name__}, expected torch.Tensor")
    want = output_shape(spec.shape, workload)
    if list(value.shape) != want:
        return CheckResult(call=call, name=name, passed=False, detail=f"{spec.name} has shape {list(value.shape)}, expected {want}")
    if value.dtype != torch_dtype(spec.dtype):
        return CheckResult(call=call, name=name, passed=False, detail=f"{spec.name} has dtype {value.dtype}, expected {spec.dtype}")
    return CheckResult(call=call, name=name, passed=True)


def finite(call: int, name: str, value: torch.Tensor) -> CheckResult:
    """NaN and Inf always fail (also where the poison of unwritten memory shows)."""
    if not value.is_floating_point():
        return CheckResult(call=call, name=f"{name}:finite", passed=True)
    bad = ~torch.isfinite(value)
    n = int(bad.sum())
    if n == 0:
        return CheckResult(call=call, name=f"{name}:finite", passed=True, error=0.0, threshold=0.0)
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    return CheckResult(
        call=call, name=f"{name}:finite", passed=False, error=n / value.numel(), threshold=0.0,
        detail=f"{n} of {value.numel()} elements are NaN/Inf (first at {first})",
    )


def _per_slice(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """View ``x`` as [slices, elements] with ``dims`` as the element axes."""
    if not dims:
        return x.reshape(1, -1)
    rest = [d for d in range(x.dim()) if d not in dims]
    n = 1
    for d in dims:
        n *= x.shape[d]
    return x.permute(*rest, *dims).reshape(-1, n)


def rel_fro(out: torch.Tensor, exp: torch.Tensor, dims: list[int]) -> tuple[float, int]:
    """Max over slices of ``||out - exp||_F / ||exp||_F`` (float64); returns (error, worst slice).

    A slice whose expected norm is 0 uses the absolute norm of the difference.
    """
    o = _per_slice(out.to(torch.float64), dims)
    e = _per_slice(exp.to(torch.float64), dims)
    num = torch.linalg.vector_norm(o - e, dim=1)
    den = torch.linalg.vector_norm(e, dim=1)
    err = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), num)
    err = torch.nan_to_num(err, nan=float("inf"))
    worst = int(err.argmax())
    return float(err[worst]), worst


def compare(call: int, name: str, tol: Tolerance, out: torch.Tensor, exp: torch.Tensor,
            dim_of: Callable[[str], int], custom: Callable[[], tuple[bool, float | None, str]] | None = None) -> CheckResult:
    """Apply one :class:`Tolerance` to ``out`` against ``exp``.

    ``dim_of`` maps an axis name to its dimension index in ``out``.
    """
    base = dict(call=call, name=f"{name}:{tol.against}:{tol.metric}", against=tol.against, metric=tol.metric)
    if tol.metric == "custom":
        ok, err, detail = custom() if custom else (False, None, "task reference defines no check()")
        return CheckResult(**base, passed=bool(ok), error=err, detail=detail)
    if out.shape != exp.shape:
        return CheckResult(**base, passed=False, detail=f"shape {list(out.shape)} vs expected {list(exp.shape)}")
    if tol.metric == "rel_fro":
        err, worst = rel_fro(out, exp, [dim_of(d) for d in tol.slice_dims])
        detail = f"worst slice {worst}" if tol.slice_dims else ""
        return CheckResult(**base, passed=err <= tol.max, error=err, threshold=tol.max, detail=detail)
    if tol.metric == "allclose":
        o, e = out.to(torch.float64), exp.to(torch.float64)
        diff = (o - e).abs()
        bad = ~(diff <= tol.atol + tol.rtol * e.abs())
        frac = float(bad.sum()) / max(1, bad.numel())
        detail = f"max abs err {float(torch.nan_to_num(diff, nan=float('inf')).max()) if diff.numel() else 0.0:.3e}"
        return CheckResult(**base, passed=frac <= tol.max_mismatch, error=frac, threshold=tol.max_mismatch, detail=detail)
    # exact: compare bit patterns so that NaN payloads and -0.0 count too
    if out.dtype != exp.dtype:
        return CheckResult(**base, passed=False, detail=f"dtype {out.dtype} vs expected {exp.dtype}")
    neq = (_bits(out) != _bits(exp))
    n = int(neq.sum())
    return CheckResult(**base, passed=n == 0, error=n / max(1, neq.numel()), threshold=0.0,
                       detail=f"{n} elements differ" if n else "")


def _bits(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    if x.dtype == torch.bool:
        return x
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return x.view(ints[x.element_size()])


def untouched(call: int, name: str, now: torch.Tensor, before: torch.Tensor) -> CheckResult:
    """An input the task does not declare mutable must stay bit-identical."""
    neq = _bits(now) != _bits(before)
    n = int(neq.sum())
    detail = ""
    if n:
        first = tuple(int(i) for i in neq.nonzero()[0].tolist())
        detail = f"{n} elements of input {name} were modified (first at {first})"
    return CheckResult(call=call, name=f"{name}:untouched", passed=n == 0, error=float(n), threshold=0.0, detail=detail)
