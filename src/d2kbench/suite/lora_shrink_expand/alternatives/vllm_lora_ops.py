"""Alternative ``vllm_lora_ops``: vLLM's Triton ``lora_shrink`` and ``lora_expand``.

What a vLLM user runs for the LoRA path of a sliced projection (the successors of punica's
SGMV / BGMV kernels in ``vllm.lora.ops.triton_ops``): the shrink writes the scaled rank-R
intermediate of every slice into an FP32 buffer [S, T, R], the expand adds each slice's
product into y's columns (``add_inputs=True``). Both kernels read vLLM's per-batch metadata
(tokens sorted by adapter, tokens per adapter, start offsets, adapter ids); vLLM computes it
once per step with ``torch.unique`` (a host synchronisation), so here it is built on the
device with ``argsort`` / ``scatter_add_`` / ``cumsum`` in the call (graph-capturable), listing all
L adapters plus the -1 "no adapter" id, which the kernels skip.

The slice widths are read from ``slice_offsets`` once per (S, N) shape (the first, eager
call) and reused, as vLLM holds ``output_slices`` on the host. Without vLLM installed the call
raises ImportError naming the package. vLLM's op signatures changed across releases: the
call passes ``num_active_loras`` (a CPU tensor) where the installed op takes it.
"""

from __future__ import annotations

import inspect

import torch

_WIDTHS: dict[tuple[int, int, str], list[int]] = {}


def _ops():
    try:
        from vllm.lora.ops.triton_ops import lora_expand, lora_shrink
    except ImportError as e:  # the package, or one of its compiled parts, is missing
        raise ImportError(f"alternative vllm_lora_ops needs the vllm package (vllm.lora.ops.triton_ops): {e}") from e
    return lora_shrink, lora_expand


def _takes_num_active(op) -> bool:
    schema = getattr(op, "_schema", None)
    if schema is not None:
        return any(a.name == "num_active_loras" for a in schema.arguments)
    try:
        return "num_active_loras" in inspect.signature(op).parameters
    except (TypeError, ValueError):
        return False


def run(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slice_offsets: torch.Tensor,
        token_lora_mapping: torch.Tensor, scale: float) -> None:
    """vLLM lora_shrink + lora_expand into ``y`` in place; shapes as ``reference.run``.

    Raises:
        ImportError: vLLM (``vllm.lora.ops.triton_ops``) is not installed.
    """
    lora_shrink, lora_expand = _ops()
    T, K = x.shape
    S, L, R, _ = lora_a.shape
    N = y.shape[1]
    key = (slice_offsets.numel(), N, str(slice_offsets.device))
    if key not in _WIDTHS:
        _WIDTHS[key] = [int(v) for v in slice_offsets.tolist()]
    bounds = _WIDTHS[key]
    dev = x.device
    mapping = token_lora_mapping.to(torch.int32)
    sorted_ids = torch.argsort(mapping, stable=True).to(torch.int32)
    counts = torch.zeros(L + 1, dtype=torch.int32, device=dev)            # bincount would sync (its max)
    counts.scatter_add_(0, (mapping + 1).to(torch.int64), torch.ones_like(mapping))
    start_loc = torch.zeros(L + 2, dtype=torch.int32, device=dev)
    start_loc[1:] = torch.cumsum(counts, 0).to(torch.int32)
    lora_ids = torch.arange(-1, L, dtype=torch.int32, device=dev)
    meta = [mapping, sorted_ids, counts, start_loc, lora_ids, torch.tensor([False])]
    if _takes_num_active(lora_shrink):
        meta.append(torch.tensor([L + 1], dtype=torch.int32))
    buf = torch.empty((S, T, R), dtype=torch.float32, device=dev)
    lora_shrink(x, [lora_a[s] for s in range(S)], buf, *meta, scale)
    b_slices = [lora_b[:, bounds[s]:bounds[s + 1]] for s in range(S)]
    lora_expand(buf, b_slices, y, *meta, offset_start=0, add_inputs=True)
