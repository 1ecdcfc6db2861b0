"""Solution template for mamba2_ssd_chunk_scan. Implement ``run`` with your own Triton kernels.

Read task.yaml (the specification), requirements.md (the rules) and reference.py (the
semantics). The harness imports this file in a separate process and calls ``run`` with fresh
inputs on every call; the registered workloads are timed with CUDA events.
"""

import torch
import triton  # noqa: F401
import triton.language as tl  # noqa: F401


def run(x: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
        C: torch.Tensor, D: torch.Tensor, cu_seqlens: torch.Tensor, state_pool: torch.Tensor,
        state_indices: torch.Tensor, has_initial_state: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Mamba2 SSD scan over packed sequences; updates ``state_pool`` in place.

    Args:
        x: [T, H, P] bfloat16 (float16 on CPU smoke workloads).
        dt: [T, H] raw time steps, x's dtype (dt' = softplus(dt + dt_bias), PyTorch's softplus).
        dt_bias, A, D: [H] float32 (A < 0).
        B, C: [T, G, DS], x's dtype; head h uses group h // (H // G).
        cu_seqlens: [N + 1] int32 device tensor; sequence i is tokens [cu_seqlens[i], cu_seqlens[i+1]).
        state_pool: [NS, H, P, DS] float32; read slot state_indices[i] when has_initial_state[i]
            (otherwise it holds NaN and the sequence starts from zero), and write every slot in
            state_indices with its sequence's final state. Other slots must keep their bits.
        state_indices: [N] int32 device tensor, distinct slots.
        has_initial_state: [N] bool device tensor.
        chunk_size: the model's SSD chunk length (host int); the result does not depend on it.

    Returns:
        y: [T, H, P] in x's dtype, a new tensor. Never modify the other inputs; never read the
        device metadata on the host.
    """
    raise NotImplementedError("implement run() with Triton kernels")
