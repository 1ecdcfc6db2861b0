"""Alternative: the MoE layer a PyTorch user writes with ``torch._scaled_mm`` (cuBLASLt FP8 with
DeepSeek-style 1 x 128 activation and 128 x 128 weight block scales), one pair of GEMMs per
active expert.

Per call: quantise x in 1 x 128 groups (PyTorch ops), group the assignments by expert
(argsort, counts read on the host), then for every expert with tokens: gather its token rows,
``_scaled_mm`` against w13[e] (bf16 output), SiLU * up, re-quantise 1 x 128, ``_scaled_mm``
against w2[e], weight and ``index_add_`` into an FP32 output. Rows are padded to a multiple of
16 (zero rows, unit scales) as cuBLASLt's FP8 path requires. Trusted comparator code; CUDA
only (needs a torch whose ``_scaled_mm`` accepts block-wise scales on sm_90).

The weight scales are passed in cuBLASLt's layout (:func:`weight_scales_for_cublaslt`). An
earlier version passed ``w_s.t()`` (and, when a build rejected it, a contiguous copy): right
when K/128 is a multiple of 4 (Qwen3-235B: K = 4096 and 1536), wrong otherwise (DeepSeek-V3's
GEMM2, K = 256: relative errors 0.82-0.87 and 2.8e3 with activation outliers on the H200).

Shapes: as ``reference.run``; returns ``[T, H]`` bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from d2kbench.tasks import load_task

_REF = load_task("fused_moe_fp8_block").reference_module()


def weight_scales_for_cublaslt(w_s: torch.Tensor) -> torch.Tensor:
    """One expert's 128 x 128 weight scales ``w_s [N/128, K/128]`` in the layout cuBLASLt's
    block-scaled FP8 GEMM reads for the B operand: a ``[K/128, N/128]`` view whose K-blocks are
    contiguous and whose N-block stride is ``L4 = round_up(K/128, 4)`` (a zero-padded
    ``[N/128, L4]`` buffer, transposed). cuBLASLt reads the scales with that leading dimension
    whatever the tensor's strides say (PyTorch pull request 166752 documents the requirement);
    the plain transposed view ``w_s.t()`` has stride ``K/128`` and is read wrongly when K/128 is
    not a multiple of 4 (DeepSeek-V3's GEMM2, K = I = 256: 2 blocks).
    """
    nb, kb = w_s.shape
    buf = torch.zeros((nb, (kb + 3) // 4 * 4), dtype=torch.float32, device=w_s.device)
    buf[:, :kb] = w_s
    return buf[:, :kb].t()


def _mm(a: torch.Tensor, a_s: torch.Tensor, w: torch.Tensor, w_s: torch.Tensor) -> torch.Tensor:
    """``a [M, K]`` e4m3 (1x128 scales ``a_s [M, K/128]``) times ``w [N, K]`` e4m3 (128x128 scales
    ``w_s [N/128, K/128]``) transposed -> bf16 ``[M, N]``. The activation scales are passed
    outer-dimension-major (M contiguous; M is a multiple of 16), the weight scales in the layout
    of :func:`weight_scales_for_cublaslt`: the layouts cuBLASLt's block-scaled FP8 GEMM reads.
    A layout the build rejects raises (no silent retry with another layout)."""
    a_s = a_s.t().contiguous().t()
    return torch._scaled_mm(a, w.t(), scale_a=a_s, scale_b=weight_scales_for_cublaslt(w_s),
                            out_dtype=torch.bfloat16)


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
