"""Solution template for chunked_prefill_paged. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with
fresh inputs on every call; the registered workloads are timed with CUDA events.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, cu_seqlens_q: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
        slot_mapping: torch.Tensor, max_seqlen_q: int, max_context_len: int, scale: float) -> torch.Tensor:
    """Chunked-prefill attention over a paged prefix, with the new tokens written into the cache.

    Args:
        q: [T, Hq, D] bfloat16 (float16 / float32 on CPU smoke workloads), the new tokens of N
            requests packed by cu_seqlens_q.
        k_new, v_new: [T, Hkv, D], q's dtype: the new tokens' keys and values.
        cu_seqlens_q: [N + 1] int32 device offsets of the chunks (every chunk >= 1 token).
        k_cache, v_cache: [NB, BS, Hkv, D], q's dtype, NHD pages: cached position t of request i
            is at page block_tables[i, t // BS], slot t % BS. NaN in every slot that holds no
            context token, the new tokens' slots included. Updated in place: slot
            slot_mapping[t] (flat page * BS + offset) must receive k_new[t] / v_new[t] bit for
            bit; every other byte must stay unchanged.
        block_tables: [N, MAXB] int32 device tensor.
        context_lens: [N] int32 device tensor, ctx_i >= 0 cached tokens per request.
        slot_mapping: [T] int64 device tensor.
        max_seqlen_q, max_context_len: host upper bounds of the chunk and context lengths.
        scale: softmax scale. New token r of request i sees its ctx_i cached tokens and the
            new tokens 0..r of its own chunk; query head h reads KV head h // (Hq // Hkv).

    Returns:
        o: [T, Hq, D] in q's dtype, a new tensor. Never modify q, k_new, v_new or the metadata;
        never read the metadata on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
