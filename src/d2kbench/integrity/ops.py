"""Which ATen operators a solution's ``run`` may execute, and the dispatch mode that sees them.

Three classes, by the schema name of the operator (``aten::mm``):

* **glue** (allowed): allocation, views and metadata, layout/dtype copies, fills, scalar reads.
  ``TRITON_INTERPRET=1`` itself only uses glue ops (``new_empty``, ``set_``, ``copy_``).
* **forbidden** (rule ``forbidden_op``): operators that reach vendor libraries or do the work
  of a decomposition: matrix products (``@``, ``matmul``, ``einsum`` and ``linear`` decompose
  to ``mm``/``bmm``/``addmm``), SDPA and fused attention, convolution, ``linalg``/``fft``, cuDNN
  and oneDNN ops, plus the task's ``forbidden.aten_ops``.
* everything else is **PyTorch compute** (rule ``torch_compute``): ``requirements.md`` says the
  timed computation runs in the solution's own Triton kernels and PyTorch is glue only.

The monitor is a :class:`torch.utils._python_dispatch.TorchDispatchMode`, so it sees the ATen
ops below autograd and composite decompositions (``torch.matmul`` on 3-D inputs shows up as
``aten::bmm``), whatever Python spelling the solution used.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

# Imports inside functions: torch loads in the worker, when the dispatch monitor is installed.

#: Operators that are glue (schema names without the ``aten::`` prefix).
GLUE_OPS = frozenset({
    # allocation and fills
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "fill_", "zero_", "arange", "scalar_tensor", "lift_fresh", "lift_fresh_copy", "resize_", "set_",
    "_pin_memory", "pin_memory", "is_pinned", "record_stream",
    # copies for layout, dtype or device
    "_to_copy", "copy_", "clone", "contiguous", "_copy_from", "_copy_from_and_resize", "to", "cat", "stack",
    "_reshape_copy",
    # views and metadata
    "detach", "detach_", "alias", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand",
    "transpose", "t", "permute", "squeeze", "unsqueeze", "select", "slice", "split", "split_with_sizes",
    "chunk", "unbind", "narrow", "flatten", "unflatten", "movedim", "view_as", "diagonal", "unfold",
    "expand_as", "_unsafe_index", "numpy_T", "mT", "mH", "adjoint", "view_as_real", "view_as_complex",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "dim", "is_same_size", "item",
    "_local_scalar_dense", "is_nonzero", "_has_compatible_shallow_copy_type", "_nested_tensor_size",
})

#: Forbidden operator names (exact) and patterns.
FORBIDDEN_OPS = frozenset({
    "mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "dot", "vdot", "mv", "addmv", "addr", "ger",
    "outer", "inner", "linear", "bilinear", "einsum", "tensordot", "chain_matmul", "kron", "_addmm_activation",
    "_scaled_mm", "_scaled_grouped_mm", "_grouped_mm", "_int_mm", "_weight_int4pack_mm", "_weight_int8pack_mm",
    "_convert_weight_to_int4pack", "cdist", "_cdist_forward", "convolution", "_convolution",
    "scaled_dot_product_attention", "_fused_sdp_choice", "svd", "qr", "cholesky", "triangular_solve",
    "geqrf", "orgqr", "ormqr", "inverse", "det", "slogdet", "pinverse", "lu_solve", "symeig", "eig",
})
_FORBIDDEN_PATTERN = re.compile(
    r"^(_?scaled_dot_product_|_flash_attention|_efficient_attention|_cudnn|cudnn_|miopen_|mkldnn_|_mkldnn|"
    r"onednn|conv|_linalg_|linalg_|_fft_|fft_|cufft|_sparse_|_fused_|_foreach_|_triton_|native_multi_head|"
    r"_native_multi_head|_transformer_|_masked_softmax|_thnn_|slow_conv|_cslt_|_mixed_dtypes_linear)")


def op_name(schema_name: str) -> str:
    """``aten::mm`` -> ``mm`` (other namespaces keep theirs: ``prims::add``)."""
    return schema_name[6:] if schema_name.startswith("aten::") else schema_name


def classify(schema_name: str, extra_forbidden: frozenset[str] | set[str] = frozenset()) -> str:
    """``glue``, ``forbidden`` or ``compute`` for one operator schema name.

    ``extra_forbidden`` holds the task's ``forbidden.aten_ops`` (full schema names such as
    ``aten::_linalg_svd`` or bare names).
    """
    name = op_name(schema_name)
    if schema_name in extra_forbidden or name in extra_forbidden:
        return "forbidden"
    if name in FORBIDDEN_OPS or _FORBIDDEN_PATTERN.match(name):
        return "forbidden"
    if name in GLUE_OPS:
        return "glue"
    return "compute"


def judge(seen: Counter, extra_forbidden: frozenset[str] | set[str] = frozenset()) -> list[tuple[str, str]]:
    """``(rule, evidence)`` for the operators of one call: one entry per rule, naming the ops."""
    by: dict[str, list[str]] = {"forbidden": [], "compute": []}
    for name, n in sorted(seen.items()):
        kind = classify(name, extra_forbidden)
        if kind in by:
            by[kind].append(f"{name} x{n}")
    out = []
    if by["forbidden"]:
        out.append(("forbidden_op", "run() executed " + ", ".join(by["forbidden"][:8])))
    if by["compute"]:
        out.append(("torch_compute", "run() executed PyTorch compute (not glue): " + ", ".join(by["compute"][:8])))
    return out


#: Host compute (rule ``host_compute``): more scalar reads (``.item()``, ``int(t)``) per call than
#: any launch planning needs, or more bytes copied from the GPU to the host per call.
MAX_SCALAR_READS = 64
MAX_HOST_BYTES = 64 << 10


class OpLog:
    """What one monitor saw: ``ops`` (ATen schema name -> count), ``host_bytes`` (bytes that
    GPU tensors copied to the host) and ``scalar_reads`` (``aten::_local_scalar_dense`` calls)."""

    __slots__ = ("ops", "host_bytes")

    def __init__(self) -> None:
        self.ops: Counter = Counter()
        self.host_bytes = 0

    @property
    def scalar_reads(self) -> int:
        return self.ops.get("aten::_local_scalar_dense", 0)

    def clear(self) -> None:
        self.ops.clear()
        self.host_bytes = 0


def _host_bytes(name: str, args, kwargs, out) -> int:
    """Bytes a copy op moved from a GPU tensor into a host tensor (0 for anything else)."""
    import torch

    if name not in ("aten::_to_copy", "aten::copy_", "aten::to", "aten::_copy_from", "aten::_copy_from_and_resize"):
        return 0
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    src = next((t for t in (tensors[1:] if name == "aten::copy_" else tensors[:1]) if t.device.type == "cuda"), None)
    dst = tensors[0] if name == "aten::copy_" and tensors else out
    if src is None or not isinstance(dst, torch.Tensor) or dst.device.type != "cpu":
        return 0
    return dst.numel() * dst.element_size()


def make_op_monitor():
    """A fresh ``(mode, log)`` pair: entering ``mode`` counts every ATen op into the
    :class:`OpLog` ``log`` (and the bytes GPU tensors copy to the host).

    The log lives in the closure, not on the mode object, so that code holding the mode
    (``_get_current_dispatch_mode()``) finds no attribute to clear; the CPU profiler and, on the
    GPU, the kernel list back it up from outside Python (:mod:`d2kbench.integrity.guard`).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    log = OpLog()

    class _OpMonitor(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # PyTorch wraps a mode's __torch_dispatch__ in torch._disable_dynamo, which imports
            # Dynamo on the first op (2-5 s of each CPU worker's first call, measured on 2 cores)
            # only to keep Dynamo from compiling the monitor. Without Dynamo loaded nothing can
            # compile it; once it is loaded (by anything), the wrapper is kept.
            return "torch._dynamo" in sys.modules

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name
            log.ops[name] += 1
            out = func(*args, **(kwargs or {}))
            moved = _host_bytes(name, args, kwargs, out)
            if moved:
                log.host_bytes += moved
            return out

    return _OpMonitor(), log


def judge_host(log: OpLog, where: str = "run()") -> list[tuple[str, str]]:
    """``host_compute`` when one call read more scalars, or copied more bytes from the GPU to
    the host, than launch planning needs (:data:`MAX_SCALAR_READS`, :data:`MAX_HOST_BYTES`):
    the work ran on the host."""
    out = []
    if log.scalar_reads > MAX_SCALAR_READS:
        out.append(("host_compute", f"{where} read {log.scalar_reads} scalars from tensors (.item(), int(t), "
                                    f"float(t); more than {MAX_SCALAR_READS}): the work ran on the host"))
    if log.host_bytes > MAX_HOST_BYTES:
        out.append(("host_compute", f"{where} copied {log.host_bytes} bytes from the GPU to the host (more than "
                                    f"{MAX_HOST_BYTES}): the work ran on the host"))
    return out


def finite_abs_max(t, sample: int = 1 << 22) -> float:
    """Largest finite |value| among the first ``sample`` elements of ``t`` (1.0 when there is
    none), in float32: FP8 tensors have no abs/max kernels on the GPU, NaN-filled unused slots
    (paged caches) must not turn a perturbation into NaN, and a multi-GB input is not copied."""
    import torch

    x = t.reshape(-1)[:sample].float()
    x = x[torch.isfinite(x)]
    m = float(x.abs().max()) if x.numel() else 0.0
    return m or 1.0
