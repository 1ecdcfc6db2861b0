"""Solution template for gated_deltanet_chunk_prefill. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with fresh
inputs on every call; the registered workloads are timed with CUDA events.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_indices: torch.Tensor,
        has_initial_state: torch.Tensor, scale: float) -> torch.Tensor:
    """Gated DeltaNet prefill over packed sequences; updates ``state_pool`` in place.

    Args:
        q, k: [T, HK, K] bfloat16 (float16 on CPU smoke workloads), un-normalised.
        v: [T, HV, V], q's dtype; value head h reads query/key head h // (HV // HK).
        g: [T, HV] float32 log decays (<= 0).
        beta: [T, HV], q's dtype, in (0, 1).
        cu_seqlens: [N + 1] int32 device tensor; sequence i is tokens [cu_seqlens[i], cu_seqlens[i+1]).
        state_pool: [NS, HV, K, V] float32; read slot state_indices[i] when has_initial_state[i]
            (otherwise it holds NaN and the sequence starts from zero), and write every slot in
            state_indices with its sequence's final state. Other slots must keep their bits.
        state_indices: [N] int32 device tensor, distinct slots.
        has_initial_state: [N] bool device tensor.
        scale: output scale (K ** -0.5).

    Returns:
        o: [T, HV, V] in v's dtype, a new tensor. Never modify the other inputs; never read the
        device metadata on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
