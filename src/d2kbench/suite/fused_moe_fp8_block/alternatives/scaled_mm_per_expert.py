"""Alternative: the MoE layer a PyTorch user writes with ``torch._scaled_mm`` (cuBLASLt FP8 with
DeepSeek-style 1 x 128 activation and 128 x 128 weight block scales), one pair of GEMMs per
active expert.

Per call: quantise x in 1 x 128 groups (PyTorch ops), group the assignments by expert
(argsort, counts read on the host), then for every expert with tokens: gather its token rows,
``_scaled_mm`` against w13[e] (bf16 output), SiLU * up, re-quantise 1 x 128, ``_scaled_mm``
against w2[e], weight and ``index_add_`` into an FP32 output. Trusted comparator code; CUDA
only (needs a torch whose ``_scaled_mm`` accepts block-wise scales on sm_90).

Operand layouts (:func:`blockwise_operands`): rows padded to a multiple of 16 (zero rows, unit
scales; cuBLASLt's block-scaled path has no heuristic for other row counts), and the reduction
dimension K padded to a multiple of 4 blocks of 128 (zero codes, unit scales) when K/128 is not
one. The reason for the K padding: cuBLASLt reads the 128 x 128 weight scales of the B operand
with a leading dimension of ``round_up(K/128, 4)`` whatever the strides, while PyTorch 2.11's
check demands the plain ``[K/128, N/128]`` view ``w_s.t()`` (stride K/128) and rejects the
padded layout cuBLASLt reads ("Invalid scaling configuration", the H200 failure of an earlier
version); later PyTorch releases demand the padded stride instead (pull request 166752). With
K/128 a multiple of 4 the two strides coincide, so one layout is accepted by both and read
correctly. DeepSeek-V3 TP-8's down projection (K = I = 256: 2 blocks) is padded to 512 per
call (its FP8 weights copied once more, about 3.7 MB per active expert); Qwen3-235B's
K = 4096 and 1536 (32 and 12 blocks) and DeepSeek-V3's K = 7168 (56 blocks) need no padding.

Shapes: as ``reference.run``; returns ``[T, H]`` bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from d2kbench.tasks import load_task

_REF = load_task("fused_moe_fp8_block").reference_module()
ROW_MULTIPLE = 16         # rows of the A operand
K_BLOCK_MULTIPLE = 4      # 128-wide K blocks: cuBLASLt's leading dimension of the 128 x 128 scales


def blockwise_operands(a: torch.Tensor, a_s: torch.Tensor, w: torch.Tensor, w_s: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four ``torch._scaled_mm`` operands of ``a @ w^T`` with 1 x 128 / 128 x 128 scales, in
    ``_scaled_mm``'s positional order.

    Args:
        a: ``[M, K]`` float8_e4m3fn activation codes (K a multiple of 128).
        a_s: ``[M, K/128]`` float32 activation scales (any strides).
        w: ``[N, K]`` float8_e4m3fn weight codes, K-contiguous (N a multiple of 128).
        w_s: ``[N/128, K/128]`` float32 weight block scales.

    Returns:
        ``(mat_a [Mp, Kp], mat_b [Kp, N], scale_a [Mp, Kp/128], scale_b [Kp/128, N/128])`` with
        ``Mp = round_up(M, 16)`` and ``Kp = round_up(K, 512)``: padding rows and K columns hold
        zero codes and unit scales (they add nothing); ``scale_a`` outer-dimension-major
        (stride ``(1, Mp)``); ``mat_b`` the column-major view ``w^T``; ``scale_b`` the view
        ``w_s^T`` with stride ``(1, Kp/128)``, which PyTorch 2.11's check and later ones accept and
        cuBLASLt reads as laid out. No copy of ``w`` when K is already a multiple of 512.

    Raises:
        ValueError: K not a multiple of 128 or scale shapes that do not match.
    """
    M, K = a.shape
    N = w.shape[0]
    if K % 128 or w.shape[1] != K or a_s.shape != (M, K // 128) or w_s.shape != (N // 128, K // 128):
        raise ValueError(f"block-scaled operands do not match: a {tuple(a.shape)}, a_s {tuple(a_s.shape)}, "
                         f"w {tuple(w.shape)}, w_s {tuple(w_s.shape)}")
    kb = K // 128
    kp = -(-kb // K_BLOCK_MULTIPLE) * K_BLOCK_MULTIPLE
    mp = -(-M // ROW_MULTIPLE) * ROW_MULTIPLE
    if (mp, kp) != (M, kb):
        a_pad = torch.zeros((mp, kp * 128), dtype=torch.uint8, device=a.device)
        a_pad[:M, :K] = a.view(torch.uint8)
        a = a_pad.view(torch.float8_e4m3fn)
        s_pad = torch.ones((mp, kp), dtype=torch.float32, device=a.device)
        s_pad[:M, :kb] = a_s
        a_s = s_pad
    if kp != kb:
        w_pad = torch.zeros((N, kp * 128), dtype=torch.uint8, device=w.device)
        w_pad[:, :K] = w.view(torch.uint8)
        w = w_pad.view(torch.float8_e4m3fn)
        ws_pad = torch.ones((N // 128, kp), dtype=torch.float32, device=w.device)
        ws_pad[:, :kb] = w_s
        w_s = ws_pad
    scale_a = a_s.t().contiguous().t()          # [Mp, Kp/128], M-major
    return a, w.t(), scale_a, w_s.contiguous().t()


def _mm(a: torch.Tensor, a_s: torch.Tensor, w: torch.Tensor, w_s: torch.Tensor) -> torch.Tensor:
    """``a [M, K]`` e4m3 (1x128 scales ``a_s [M, K/128]``) times ``w [N, K]`` e4m3 (128x128 scales
    ``w_s [N/128, K/128]``) transposed -> bf16 ``[M', N]`` (M' = M rounded up to 16; the caller
    slices). A layout the build rejects raises (no silent retry with another layout)."""
    mat_a, mat_b, scale_a, scale_b = blockwise_operands(a, a_s, w, w_s)
    return torch._scaled_mm(mat_a, mat_b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


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
        h = _mm(xq.view(torch.uint8)[tok].view(torch.float8_e4m3fn), xs[tok], w13[e], w13_scale[e])[:c]
        act = (F.silu(h[:, :I].float()) * h[:, I:].float()).to(torch.bfloat16)
        aq, as_ = _REF.quant_1x128(act)
        y = _mm(aq, as_, w2[e], w2_scale[e])[:c]
        out.index_add_(0, tok, y.float() * tw[a_idx, None])
    return out.to(torch.bfloat16)
