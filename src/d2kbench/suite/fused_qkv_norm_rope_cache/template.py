"""Solution template for fused_qkv_norm_rope_cache. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with fresh
inputs on every call; the decode workload is timed by CUDA-graph replay.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
        positions: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
        num_q_heads: int, eps: float) -> torch.Tensor:
    """Per-head q/k RMSNorm, NeoX rotary embedding, q returned, k and v written to the paged cache.

    Args:
        qkv: [T, (Hq + 2 Hkv) D] bfloat16: Hq query heads, Hkv key heads, Hkv value heads per token.
        q_norm_weight, k_norm_weight: [D] bfloat16 RMSNorm gains.
        cos_sin_cache: [MAXPOS, D] float32, cos in the first D/2 columns, sin in the second half.
        positions: [T] int64 device tensor.
        key_cache, value_cache: [NB, BS, Hkv, D] bfloat16 NHD pages; write the rotated keys and the
            values at slot = slot_mapping[t] (page slot // BS, offset slot % BS) for every token
            with slot != -1, in place; touch nothing else.
        slot_mapping: [T] int64 device tensor (-1 = padding token).
        num_q_heads: Hq.
        eps: RMSNorm epsilon.

    Returns:
        q_out: a new [T, Hq, D] bfloat16 tensor (contiguous). Never read positions or
        slot_mapping on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
