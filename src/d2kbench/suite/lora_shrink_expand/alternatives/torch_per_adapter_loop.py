"""Alternative ``torch_per_adapter_loop``: the loop over adapters a PyTorch user writes.

For every loaded adapter: one cuBLAS GEMM shrinks every token with all slices' A at once
(``x @ A_l^T``, bf16), one GEMM per slice expands into that slice's columns, and the rows of
the adapter's tokens are selected with a mask (``torch.where``) into an FP32 update; at the end
one read-modify-write of y adds the scaled update to the rows of tokens with an adapter.
Selecting the rows with ``nonzero`` / boolean indexing would synchronise with the host, which
CUDA-graph timing forbids, so every adapter multiplies every token: L times the useful FLOPs,
and the FP32 update is rewritten once per adapter and slice.

The slice widths are the model's (q | k | v): the loop reads them from ``slice_offsets`` once
per (S, N) shape, on the first (eager) call, and reuses them, as a model holds them in its
config.
"""

from __future__ import annotations

import torch

_WIDTHS: dict[tuple[int, int, str], list[int]] = {}


def _bounds(slice_offsets: torch.Tensor, N: int) -> list[int]:
    key = (slice_offsets.numel(), N, str(slice_offsets.device))
    if key not in _WIDTHS:
        _WIDTHS[key] = [int(v) for v in slice_offsets.tolist()]
    return _WIDTHS[key]


def run(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slice_offsets: torch.Tensor,
        token_lora_mapping: torch.Tensor, scale: float) -> None:
    """Per-adapter PyTorch loop (module docstring); shapes as ``reference.run``; y updated in place."""
    T, K = x.shape
    S, L, R, _ = lora_a.shape
    N = y.shape[1]
    bounds = _bounds(slice_offsets, N)
    delta = torch.zeros(T, N, dtype=torch.float32, device=x.device)
    for lora in range(L):
        sel = (token_lora_mapping == lora)[:, None]
        h = x @ lora_a[:, lora].reshape(S * R, K).T                       # [T, S R] in x's dtype
        for s in range(S):
            o0, o1 = bounds[s], bounds[s + 1]
            d = h[:, s * R:(s + 1) * R] @ lora_b[lora, o0:o1].T             # [T, N_s]
            delta[:, o0:o1] += torch.where(sel, d.float(), 0.0)
    keep = (token_lora_mapping < 0)[:, None]
    y.copy_(torch.where(keep, y, (y.float() + scale * delta).to(y.dtype)))
