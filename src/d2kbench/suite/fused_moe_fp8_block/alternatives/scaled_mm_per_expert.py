"""Alternative: the MoE layer a PyTorch user writes with ``torch._scaled_mm`` (cuBLASLt FP8 with
DeepSeek-style 1 x 128 activation and 128 x 128 weight block scales), one pair of GEMMs per
active expert.

Per call: quantise x in 1 x 128 groups (PyTorch ops), group the assignments by expert
(argsort, counts read on the host), then for every expert with tokens: gather its token rows,
``_scaled_mm`` against w13[e] (bf16 output), SiLU * up, re-quantise 1 x 128, ``_scaled_mm``
against w2[e], weight and ``index_add_`` into an FP32 output. Rows are padded to a multiple of
16 (zero rows, unit scales) as cuBLASLt's FP8 path requires. Trusted comparator code; CUDA
only (needs a torch whose ``_scaled_mm`` accepts block-wise scales on sm_90).

Shapes: as ``reference.run``; returns ``[T, H]`` bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from d2kbench.tasks import load_task

_REF = load_task("fused_moe_fp8_block").reference_module()


def _mm(a: torch.Tensor, a_s: torch.Tensor, w: torch.Tensor, w_s: torch.Tensor) -> torch.Tensor:
    """``a [M, K]`` e4m3 (1x128 scales ``a_s [M, K/128]``) times ``w [N, K]`` e4m3 (128x128 scales
    ``w_s [N/128, K/128]``) transposed -> bf16 ``[M, N]``. The activation scales are passed
    outer-dimension-major (M contiguous), as cuBLASLt's block-scaled FP8 GEMM reads them; the
    weight scales as the transposed view, else (builds that want them contiguous) a copy."""
    a_s = a_s.t().contiguous().t()
    try:
        return torch._scaled_mm(a, w.t(), scale_a=a_s, scale_b=w_s.t(), out_dtype=torch.bfloat16)
    except RuntimeError:
        return torch._scaled_mm(a, w.t(), scale_a=a_s, scale_b=w_s.t().contiguous(), out_dtype=torch.bfloat16)


def run(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Per-expert ``torch._scaled_mm`` MoE (host loop over the active experts)."""
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    xq, xs = _REF.quant_1x128(x)
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    tw = topk_weights.reshape(-1)
    for e, a_idx in _REF.expert_groups(topk_ids, E):
        c = a_idx.numel()
        tok = a_idx // k
        m = (c + 15) // 16 * 16
        a = torch.zeros((m, H), dtype=torch.uint8, device=x.device)
        a[:c] = xq.view(torch.uint8)[tok]
        a_s = torch.ones((m, H // 128), dtype=torch.float32, device=x.device)
        a_s[:c] = xs[tok]
        h = _mm(a.view(torch.float8_e4m3fn), a_s, w13[e], w13_scale[e])
        act = (F.silu(h[:, :I].float()) * h[:, I:].float()).to(torch.bfloat16)
        aq, as_ = _REF.quant_1x128(act)
        y = _mm(aq, as_, w2[e], w2_scale[e])[:c]
        out.index_add_(0, tok, y.float() * tw[a_idx, None])
    return out.to(torch.bfloat16)
