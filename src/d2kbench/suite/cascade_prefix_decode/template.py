"""Solution template for cascade_prefix_decode. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call; the registered workloads are timed by CUDA-graph replay.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        seq_lens: torch.Tensor, common_prefix_len: int, scale: float) -> torch.Tensor:
    """Decode attention for requests that share a common prefix, over a paged KV cache.

    Args:
        q: [N, Hq, D] bfloat16 (float16 on CPU smoke workloads).
        k_cache, v_cache: [NB, BS, Hkv, D], q's dtype, NHD pages; NaN in every slot that holds no
            valid token. Query head h reads KV head h // (Hq // Hkv).
        block_tables: [N, MAXB] int32 device tensor; token t of request i is at page
            block_tables[i, t // BS], slot t % BS. The first P // BS columns are the same pages in
            every row; tokens t < P hold the same keys and values in every request.
        seq_lens: [N] int32 device tensor, P <= seq_lens[i] <= MAXB * BS (the suffix may be empty).
        common_prefix_len: P, a host int.
        scale: softmax scale.

    Returns:
        o: [N, Hq, D] in q's dtype, a new tensor: attention over each request's whole context.
        Never modify the inputs; never read block_tables or seq_lens on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
