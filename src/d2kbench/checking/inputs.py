"""Inputs of one call: secret seeds, generation through the task's ``make_inputs``, and
structural checks of generated arguments against ``task.yaml``.
"""

from __future__ import annotations

import secrets
from typing import Any

import torch

from d2kbench.tasks.formula import evaluate_formula
from d2kbench.tasks.schema import ScalarArg, TaskSpec, TensorArg, Workload


def secret_seed() -> int:
    """A fresh seed from the OS's CSPRNG (63 bits): a solution cannot predict its inputs."""
    return secrets.randbits(63)


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16`` (names as in :data:`d2kbench.tasks.schema.DTYPES`)."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def make_args(reference: Any, spec: TaskSpec, workload: Workload, seed: int, device: str) -> list:
    """Generate the ordered argument list of ``run`` for one call.

    Raises:
        ValueError: ``make_inputs`` returned something that does not match the task's arguments.
    """
    values = reference.make_inputs(workload.values(), seed, device)
    if not isinstance(values, dict):
        raise ValueError(f"make_inputs must return a dict, got {type(values).__name__}")
    missing = [a.name for a in spec.args if a.name not in values]
    extra = sorted(set(values) - {a.name for a in spec.args})
    if missing or extra:
        raise ValueError(f"make_inputs returned wrong names: missing {missing}, unexpected {extra}")
    args = [values[a.name] for a in spec.args]
    problems = check_args(spec, workload, args)
    if problems:
        raise ValueError("make_inputs does not match task.yaml: " + "; ".join(problems))
    return args


def check_args(spec: TaskSpec, workload: Workload, args: list) -> list[str]:
    """Structural problems of ``args`` against the declared arguments (empty if none)."""
    problems = []
    for a, v in zip(spec.args, args):
        if isinstance(a, TensorArg) and a.count is not None:
            problems += _list_problems(a, workload, v)
        elif isinstance(a, TensorArg):
            if not isinstance(v, torch.Tensor):
                problems.append(f"{a.name} is {type(v).__name__}, not a tensor")
                continue
            want = output_shape(a.shape, workload)
            if list(v.shape) != want:
                problems.append(f"{a.name} has shape {list(v.shape)}, expected {want}")
            want_dtype = a.dtype_for(workload)
            if v.dtype != torch_dtype(want_dtype):
                problems.append(f"{a.name} has dtype {v.dtype}, expected {want_dtype}")
            if a.layout == "contiguous" and not v.is_contiguous():
                problems.append(f"{a.name} is not contiguous")
        elif isinstance(a, ScalarArg):
            py = {"int": int, "float": float, "bool": bool}[a.kind]
            if not isinstance(v, py) or (a.kind == "int" and isinstance(v, bool)):
                problems.append(f"{a.name} is {type(v).__name__}, expected {a.kind}")
            elif a.axis is not None and v != workload.axes.get(a.axis):
                problems.append(f"{a.name} is {v}, but it is bound to axis {a.axis} = {workload.axes.get(a.axis)}")
    return problems


def _list_problems(a: TensorArg, workload: Workload, v) -> list[str]:
    """Problems of the value ``v`` of the tensor-list argument ``a``: a list of ``count`` tensors
    of ``a``'s shape, dtype and layout whose storages do not overlap (separate allocations)."""
    want_n = workload.axes.get(str(a.count))
    if not isinstance(v, list) or not all(isinstance(t, torch.Tensor) for t in v):
        return [f"{a.name} is {type(v).__name__}, not a list of tensors"]
    if len(v) != want_n:
        return [f"{a.name} holds {len(v)} tensors, expected {a.count} = {want_n}"]
    problems = []
    want, want_dtype = output_shape(a.shape, workload), a.dtype_for(workload)
    for r, t in enumerate(v):
        if list(t.shape) != want or t.dtype != torch_dtype(want_dtype):
            problems.append(f"{a.name}[{r}] is {list(t.shape)} {t.dtype}, expected {want} {want_dtype}")
        if a.layout == "contiguous" and not t.is_contiguous():
            problems.append(f"{a.name}[{r}] is not contiguous")
    spans = sorted((t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
                   for t in v if t.untyped_storage().nbytes())
    if any(lo < prev_hi for (_, prev_hi), (lo, _) in zip(spans, spans[1:])):
        problems.append(f"{a.name}: the tensors share storage; each must be its own allocation")
    return problems


def arg_tensors(args: list) -> list[torch.Tensor]:
    """The tensors of an argument list, the elements of tensor-list arguments included, in order."""
    out: list[torch.Tensor] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, list):
            out.extend(t for t in a if isinstance(t, torch.Tensor))
    return out


def clone_args(args: list) -> list:
    """Deep copy of an argument list (tensors cloned with their strides, each element of a tensor
    list into its own allocation, scalars kept)."""
    return [a.clone() if isinstance(a, torch.Tensor) else [t.clone() for t in a] if isinstance(a, list) else a
            for a in args]


def dim_size(dim: str | int, workload: Workload) -> int:
    """One declared size (an int, an axis name or a formula of the axes) on ``workload``.

    Raises:
        ValueError: a formula that does not give a whole number >= 0 (or uses unknown names).
    """
    if isinstance(dim, int):
        return dim
    if dim in workload.axes:
        return workload.axes[dim]
    value = evaluate_formula(dim, workload.axes)
    if value < 0 or value != int(value):
        raise ValueError(f"size formula {dim!r} gives {value} on workload {workload.id!r}, not a whole number >= 0")
    return int(value)


def output_shape(shape: list, workload: Workload) -> list[int]:
    """Concrete shape of a declared output (or argument) on ``workload``."""
    return [dim_size(d, workload) for d in shape]


def args_nbytes(args: list) -> int:
    """Bytes held by the tensors of an argument list."""
    return sum(a.numel() * a.element_size() for a in arg_tensors(args))
