"""Solution template for mla_decode_absorbed. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call; the registered workloads are timed by CUDA-graph replay.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
        seq_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """MLA decode over a paged latent cache.

    Args:
        q_nope: [B, H, DN] bfloat16 (float16 on CPU smoke workloads); q_pe: [B, H, DR], rotated.
        kv_cache: [NP, PS, DL + DR]; token t of request b is row t % PS of page
            block_table[b, t // PS]: its latent c_t (first DL values) and rotary key k_pe_t (last
            DR values). NaN in every row that holds no valid token.
        block_table: [B, MAXP] int32 device tensor; seq_lens: [B] int32 device tensor,
            1 <= seq_lens[b] <= MAXP * PS.
        w_uk: [H, DN, DL], k_nope[t, h] = w_uk[h] @ c_t; w_uv: [H, DL, DV], v[t, h] = c_t @ w_uv[h].
        scale: softmax scale applied to q_nope . k_nope + q_pe . k_pe.

    Returns:
        o: [B, H, DV] in q_nope's dtype, a new tensor. Never modify the inputs; never read
        block_table or seq_lens on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
