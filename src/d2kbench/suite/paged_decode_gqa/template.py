"""Solution template for paged_decode_gqa. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call; the registered workloads are timed by CUDA-graph replay.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Paged-KV GQA decode attention.

    Args:
        q: [B, Hq, D] bfloat16 (float16 on CPU smoke workloads).
        k_cache, v_cache: [NB, BS, Hkv, D], q's dtype, NHD pages; NaN in every slot that holds no
            valid token. Query head h reads KV head h // (Hq // Hkv).
        block_tables: [B, MAXB] int32 device tensor; token t of sequence b is at page
            block_tables[b, t // BS], slot t % BS.
        seq_lens: [B] int32 device tensor, 1 <= seq_lens[b] <= MAXB * BS.
        scale: softmax scale.

    Returns:
        o: [B, Hq, D] in q's dtype, a new tensor. Never modify the inputs; never read
        block_tables or seq_lens on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
