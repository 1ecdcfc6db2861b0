"""Alternative: what a bf16 deployment runs instead of an FP8 kernel, the suite's bf16 fused MoE
(``fused_moe_bf16``'s expert Triton kernels) on the dequantised weights.

The weights are dequantised to bf16 inside the call (``w_q * w_s`` per 128 x 128 block, in
chunks of experts so that no FP32 copy of all weights exists), then the bf16 layer runs on the
bf16 x: bf16 GEMMs with FP32 accumulation, no activation quantisation. Its time therefore
includes the dequantisation (reading the FP8 weights, writing 2x their bytes in bf16) on top
of the bf16 layer (reading those again): the cost of not having an FP8 kernel. Trusted
comparator code (it may use PyTorch compute); CUDA only.

Shapes: as ``reference.run``: ``x [T, H]`` bf16, ``w13 [E, 2I, H]`` e4m3 + ``w13_scale``,
``w2 [E, H, I]`` e4m3 + ``w2_scale``, ``topk_weights [T, k]``, ``topk_ids [T, k]`` -> ``[T, H]`` bf16.
"""

from __future__ import annotations

import torch

from d2kbench.tasks import load_task
from d2kbench.tasks.loader import import_file

_BF16_EXPERT = import_file(load_task("fused_moe_bf16").root / "solutions" / "expert.py")
#: Experts dequantised per step (bounds the FP32 temporary to this many experts' weights).
CHUNK = 16


def _dequant_bf16(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``q [E, N, K]`` e4m3 with block scales ``s [E, N/128, K/128]`` -> bf16 ``[E, N, K]``."""
    E, N, K = q.shape
    out = torch.empty((E, N, K), dtype=torch.bfloat16, device=q.device)
    for e0 in range(0, E, CHUNK):
        e1 = min(E, e0 + CHUNK)
        blk = q[e0:e1].float().view(e1 - e0, N // 128, 128, K // 128, 128)
        out[e0:e1] = (blk * s[e0:e1, :, None, :, None]).view(e1 - e0, N, K).to(torch.bfloat16)
    return out


def run(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Dequantise the weights to bf16, then the bf16 fused MoE expert kernels."""
    return _BF16_EXPERT.run(x, _dequant_bf16(w13, w13_scale), _dequant_bf16(w2, w2_scale), topk_weights, topk_ids)
