"""Correctness checks run by the trusted parent (docs/tasks.md, "`task.yaml`": the checks).

All comparisons happen in float64 on the device the tensors live on. Each function returns
:class:`~d2kbench.results.CheckResult` records; none of them raises on bad solution
output (a wrong type or shape is a failed check, not an exception).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from d2kbench.checking.inputs import output_shape, torch_dtype
from d2kbench.results import CheckResult
from d2kbench.tasks.schema import OutputSpec, Tolerance, Workload


def structure(call: int, spec: OutputSpec, value: Any, workload: Workload,
              strides: list[int] | None = None) -> CheckResult:
    """Type (exactly ``torch.Tensor``), shape, dtype and, where the task declares one, the memory
    layout (element strides) of one output (dimensions of size 1 and empty tensors exempt).

    ``strides`` are the strides the solution returned, as the worker reported them (a copy sent
    across processes may be re-laid out); default: ``value.stride()``.
    """
    name = f"{spec.name}:structure"
    if not isinstance(value, torch.Tensor):
        return CheckResult(call=call, name=name, passed=False,
                           detail=f"{spec.name} is {type(value).__name__}, expected torch.Tensor")
    want = output_shape(spec.shape, workload)
    if list(value.shape) != want:
        return CheckResult(call=call, name=name, passed=False,
                           detail=f"{spec.name} has shape {list(value.shape)}, expected {want}")
    want_dtype = spec.dtype_for(workload)
    if value.dtype != torch_dtype(want_dtype):
        return CheckResult(call=call, name=name, passed=False,
                           detail=f"{spec.name} has dtype {value.dtype}, expected {want_dtype}")
    declared = workload.strides.get(spec.name, spec.strides)
    if declared is not None and value.numel():  # an empty tensor has no layout to check
        got = list(strides) if strides is not None else list(value.stride())
        need = output_shape(declared, workload)
        bad = [d for d, n in enumerate(want) if n > 1 and got[d] != need[d]]
        if bad:
            return CheckResult(call=call, name=name, passed=False,
                               detail=f"{spec.name} has strides {got}, the task requires {need} (dimensions of size 1 exempt)")
    return CheckResult(call=call, name=name, passed=True)


def finite(call: int, name: str, value: torch.Tensor) -> CheckResult:
    """NaN and Inf always fail (also where the poison of unwritten memory shows)."""
    if not value.is_floating_point():
        return CheckResult(call=call, name=f"{name}:finite", passed=True)
    bad = ~isfinite(value)
    n = int(bad.sum())
    if n == 0:
        return CheckResult(call=call, name=f"{name}:finite", passed=True, error=0.0, threshold=0.0)
    first = tuple(int(i) for i in bad.nonzero()[0].tolist())
    return CheckResult(
        call=call, name=f"{name}:finite", passed=False, error=n / value.numel(), threshold=0.0,
        detail=f"{n} of {value.numel()} elements are NaN/Inf (first at {first})",
    )


def isfinite(value: torch.Tensor) -> torch.Tensor:
    """``torch.isfinite`` for every floating dtype (FP8 formats have no kernel: upcast first)."""
    if value.is_floating_point() and value.element_size() == 1:
        value = value.to(torch.float32)
    return torch.isfinite(value)


def ulp_distance(out: torch.Tensor, exp: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in representable values (int64) between two tensors of one dtype.

    Floats: sign-magnitude bit patterns mapped to a monotonic integer line, so adjacent values
    are 1 apart and +0/-0 coincide; integers and bool: the plain difference.
    """
    if not out.is_floating_point():
        return (out.to(torch.int64) - exp.to(torch.int64)).abs()
    bits = out.element_size() * 8

    def line(x: torch.Tensor) -> torch.Tensor:
        b = bit_pattern(x).to(torch.int64)
        if bits < 64:
            b = b & ((1 << bits) - 1)
        mag = b & ((1 << (bits - 1)) - 1)
        return torch.where((b >> (bits - 1)) & 1 == 1, -mag, mag)

    return (line(out) - line(exp)).abs()


def _per_slice(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """View ``x`` as [slices, elements] with ``dims`` as the element axes."""
    if not dims:
        return x.reshape(1, -1)
    rest = [d for d in range(x.dim()) if d not in dims]
    n = 1
    for d in dims:
        n *= x.shape[d]
    return x.permute(*rest, *dims).reshape(-1, n)


#: Elements upcast to float64 at a time by the comparisons (about 1 GB per operand).
_CHUNK_ELEMS = 1 << 27


def rel_fro(out: torch.Tensor, exp: torch.Tensor, dims: list[int]) -> tuple[float, int]:
    """Max over slices of ``||out - exp||_F / ||exp||_F`` (float64); returns (error, worst slice).

    A slice whose expected norm is 0 uses the absolute norm of the difference.
    """
    o_all, e_all = _per_slice(out, dims), _per_slice(exp, dims)
    rows, cols = o_all.shape
    rstep, cstep = max(1, _CHUNK_ELEMS // max(1, cols)), max(1, min(cols, _CHUNK_ELEMS))
    num2 = torch.zeros(rows, dtype=torch.float64, device=out.device)
    den2 = torch.zeros(rows, dtype=torch.float64, device=out.device)
    for r0 in range(0, rows, rstep):  # float64 in chunks: a whole [32, 4096, 11008] upcast is 11.5 GB
        for c0 in range(0, cols, cstep):
            o = o_all[r0:r0 + rstep, c0:c0 + cstep].to(torch.float64)
            e = e_all[r0:r0 + rstep, c0:c0 + cstep].to(torch.float64)
            num2[r0:r0 + rstep] += (o - e).square().sum(dim=1)
            den2[r0:r0 + rstep] += e.square().sum(dim=1)
    num, den = num2.sqrt(), den2.sqrt()
    err = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), num)
    err = torch.nan_to_num(err, nan=float("inf"))
    worst = int(err.argmax())
    return float(err[worst]), worst


def compare(call: int, name: str, tol: Tolerance, out: torch.Tensor, exp: torch.Tensor,
            dim_of: Callable[[str], int], custom: Callable[[], tuple[bool, float | None, str]] | None = None,
            before: torch.Tensor | None = None) -> CheckResult:
    """Apply one :class:`Tolerance` to ``out`` against ``exp``.

    ``dim_of`` maps an axis name to its dimension index in ``out``. ``before``: the value of an
    in-place argument at the call's start (metric ``unchanged`` only).
    """
    base: dict[str, Any] = dict(call=call, name=f"{name}:{tol.against}:{tol.metric}", against=tol.against,
                                metric=tol.metric)
    # the task schema requires the bounds each metric uses (Tolerance's validator)
    bound, atol, rtol = cast(float, tol.max), cast(float, tol.atol), cast(float, tol.rtol)
    if tol.metric == "custom":
        ok, err, detail = custom() if custom else (False, None, "task reference defines no check()")
        return CheckResult(**base, passed=bool(ok), error=err, detail=detail)
    if out.shape != exp.shape:
        return CheckResult(**base, passed=False, detail=f"shape {list(out.shape)} vs expected {list(exp.shape)}")
    if tol.metric == "unchanged":
        return unchanged(base, out, exp, before, [dim_of(d) for d in tol.slice_dims])
    if tol.metric == "rel_fro":
        err, worst = rel_fro(out, exp, [dim_of(d) for d in tol.slice_dims])
        detail = f"worst slice {worst}" if tol.slice_dims else ""
        return CheckResult(**base, passed=err <= bound, error=err, threshold=bound, detail=detail)
    if tol.metric == "allclose":
        n_bad, max_err = 0, 0.0
        o_flat, e_flat = out.reshape(-1), exp.reshape(-1)
        for lo in range(0, o_flat.numel(), _CHUNK_ELEMS):
            o = o_flat[lo:lo + _CHUNK_ELEMS].to(torch.float64)
            e = e_flat[lo:lo + _CHUNK_ELEMS].to(torch.float64)
            diff = (o - e).abs()
            n_bad += int((~(diff <= atol + rtol * e.abs())).sum())
            if diff.numel():
                max_err = max(max_err, float(torch.nan_to_num(diff, nan=float("inf")).max()))
        frac = n_bad / max(1, out.numel())
        detail = f"max abs err {max_err:.3e}"
        return CheckResult(**base, passed=frac <= tol.max_mismatch, error=frac, threshold=tol.max_mismatch, detail=detail)
    if tol.metric == "ulp":
        if out.dtype != exp.dtype:
            return CheckResult(**base, passed=False, detail=f"dtype {out.dtype} vs expected {exp.dtype}")
        worst, n_diff = 0, 0
        o_flat, e_flat = out.reshape(-1), exp.reshape(-1)
        for lo in range(0, o_flat.numel(), _CHUNK_ELEMS):  # int64 distances in chunks
            dist = ulp_distance(o_flat[lo:lo + _CHUNK_ELEMS], e_flat[lo:lo + _CHUNK_ELEMS])
            worst, n_diff = max(worst, int(dist.max())), n_diff + int((dist != 0).sum())
        frac = n_diff / max(1, o_flat.numel())
        ok = worst <= bound and frac <= tol.max_mismatch
        return CheckResult(**base, passed=ok, error=frac, threshold=tol.max_mismatch,
                           detail=f"max distance {worst} (allowed {int(bound)}), {frac:.3e} of elements differ")
    # exact: compare bit patterns so that NaN payloads and -0.0 count too
    if out.dtype != exp.dtype:
        return CheckResult(**base, passed=False, detail=f"dtype {out.dtype} vs expected {exp.dtype}")
    neq = (bit_pattern(out) != bit_pattern(exp))
    n = int(neq.sum())
    return CheckResult(**base, passed=n == 0, error=n / max(1, neq.numel()), threshold=0.0,
                       detail=f"{n} elements differ" if n else "")


def unchanged(base: dict[str, Any], out: torch.Tensor, exp: torch.Tensor, before: torch.Tensor | None,
              dims: list[int] | None = None) -> CheckResult:
    """Metric ``unchanged``: the elements of an in-place argument that the reference left
    bit-identical to ``before`` (the call's input) must be bit-identical in ``out`` too.

    ``dims`` (the check's ``slice_dims`` as dimension indices): judge whole slices instead of
    elements. A slice (e.g. one slot ``[HV, K, V]`` of a state pool ``[NS, HV, K, V]``) counts as
    left unchanged only when every one of its elements is; a slot the reference rewrote, where a
    few elements of the new state happen to equal the old bits, is then left to the argument's
    other checks instead of failing a solution whose value differs there by one rounding step.
    """
    if before is None or before.shape != out.shape or before.dtype != out.dtype:
        return CheckResult(**base, passed=False, detail="metric 'unchanged' needs the argument's value before the call")
    if dims:
        b = _per_slice(bit_pattern(before), dims)
        kept_slices = (_per_slice(bit_pattern(exp), dims) == b).all(dim=1)
        moved = (_per_slice(bit_pattern(out), dims) != b) & kept_slices[:, None]
        n, total = int(moved.sum()), int(kept_slices.sum()) * b.shape[1]
        first_of = lambda: f"slice {int(moved.any(dim=1).nonzero()[0])}"  # noqa: E731
        what = f"elements of the {int(kept_slices.sum())} slices the reference left unchanged"
    else:
        kept = bit_pattern(exp) == bit_pattern(before)
        moved = kept & (bit_pattern(out) != bit_pattern(before))
        n, total = int(moved.sum()), int(kept.sum())
        first_of = lambda: str(tuple(int(i) for i in moved.nonzero()[0].tolist()))  # noqa: E731
        what = f"the {total} elements the reference left unchanged"
    detail = f"{n} of {what} were modified (first at {first_of()})" if n else ""
    return CheckResult(**base, passed=n == 0, error=n / max(1, total), threshold=0.0, detail=detail)


def bit_pattern(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bits as a same-shaped integer tensor of its element size (bool stays bool), so
    that equality is bitwise: NaNs with the same payload are equal, +0 and -0 are not, and FP8
    tensors (which have no comparison kernels) compare."""
    x = x.contiguous()
    if x.dtype == torch.bool:
        return x
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return x.view(ints[x.element_size()])


def untouched(call: int, name: str, now: torch.Tensor, before: torch.Tensor) -> CheckResult:
    """An input the task does not declare mutable must stay bit-identical."""
    neq = bit_pattern(now) != bit_pattern(before)
    n = int(neq.sum())
    detail = ""
    if n:
        first = tuple(int(i) for i in neq.nonzero()[0].tolist())
        detail = f"{n} elements of input {name} were modified (first at {first})"
    return CheckResult(call=call, name=f"{name}:untouched", passed=n == 0, error=float(n), threshold=0.0, detail=detail)
