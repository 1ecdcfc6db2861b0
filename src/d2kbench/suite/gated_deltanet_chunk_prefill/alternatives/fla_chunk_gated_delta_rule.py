"""Alternative ``fla_chunk_gated_delta_rule``: flash-linear-attention's chunked gated delta rule,
called the way vLLM's Qwen3-Next layer calls it in prefill.

What a serving engineer runs instead of writing the kernel: ``fla.ops.gated_delta_rule.
chunk_gated_delta_rule`` (the fla-core package, pure Triton) on the packed batch (a leading
batch dimension of 1) with ``cu_seqlens`` (int64), ``use_qk_l2norm_in_kernel=True`` (the same
``x / sqrt(sum(x^2) + 1e-6)`` normalisation), ``initial_state`` gathered from the pool
(``state_pool[state_indices]``, zeroed where ``has_initial_state`` is False: those slots hold
NaN) and ``output_final_state=True``; the final states are scattered back to their slots.
The gather and the scatter are PyTorch indexing inside the timed call (2 x N x HV x K x V x 4
bytes each way), as in vLLM. fla prepares its chunk indices from ``cu_seqlens`` on the host
(a synchronisation): fine under the task's event timing.

Device: ``task.yaml`` declares it for ``cuda`` only; fla is imported inside ``run``, so a machine
without the package gets a clear error instead of an import failure of the task.
"""

from __future__ import annotations

import torch


def _chunk_gated_delta_rule():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:  # the comparator is optional: say what to install
        raise RuntimeError("alternative fla_chunk_gated_delta_rule needs flash-linear-attention's kernels: "
                           "pip install fla-core (Triton >= 3.2)") from e
    return chunk_gated_delta_rule


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_indices: torch.Tensor,
        has_initial_state: torch.Tensor, scale: float) -> torch.Tensor:
    """fla's chunk_gated_delta_rule on the packed batch; updates ``state_pool`` in place.

    Raises:
        RuntimeError: flash-linear-attention (fla-core) is not installed.
    """
    fn = _chunk_gated_delta_rule()
    slots = state_indices.long()
    h0 = torch.where(has_initial_state[:, None, None, None], state_pool[slots], 0.0)
    o, ht = fn(q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=h0,
               output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens.long())
    state_pool[slots] = ht.to(state_pool.dtype)
    return o[0]
