"""Straightforward Triton solution: the gated delta rule token by token (a fused recurrent kernel).

Contract identical to ``reference.run`` (see task.yaml).

A competent direct port of the recurrence without the chunked design: one program per
(sequence, value head, block of 32 value columns) keeps its K x 32 slice of the state in
registers (read from the pool slot, or zero) and walks the sequence one token at a time:
normalise q_t and k_t, decay the state, ``v' = beta (v_t - S^T k^_t)``, ``S += k^_t v'^T``,
``o_t = scale S^T q^_t``; at the end the state goes back to the slot. Everything is fp32 on
CUDA cores; the work is the minimum, but the sequence's T steps are serial (each a few dependent
reductions over K), so a long sequence is latency-bound at roughly 0.3-0.5 us per token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: value columns per program
BV = 32


@triton.jit
def _recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, pool_ptr, idx_ptr, init_ptr, o_ptr, scale,
                      s_qt, s_kt, s_vt, s_ot, s_ps, s_ph,
                      HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BV: tl.constexpr):
    iv = tl.program_id(0)
    pid = tl.program_id(1)
    seq = pid // HV
    h = pid % HV
    hk = h // GROUP
    bos = tl.load(cu_ptr + seq).to(tl.int64)
    eos = tl.load(cu_ptr + seq + 1).to(tl.int64)
    slot = tl.load(idx_ptr + seq).to(tl.int64)
    has = tl.load(init_ptr + seq) != 0
    rk = tl.arange(0, K)
    cv = iv * BV + tl.arange(0, BV)
    sp = pool_ptr + slot * s_ps + h * s_ph + rk[:, None] * V + cv[None, :]
    S = tl.load(sp, mask=has & (rk[:, None] >= 0), other=0.0)
    for t in range(bos, eos):
        qv = tl.load(q_ptr + t * s_qt + hk * K + rk).to(tl.float32)
        kv = tl.load(k_ptr + t * s_kt + hk * K + rk).to(tl.float32)
        qv = qv * tl.rsqrt(tl.sum(qv * qv, 0) + 1e-6)
        kv = kv * tl.rsqrt(tl.sum(kv * kv, 0) + 1e-6)
        vv = tl.load(v_ptr + t * s_vt + h * V + cv).to(tl.float32)
        gt = tl.load(g_ptr + t * HV + h)
        bt = tl.load(beta_ptr + t * HV + h).to(tl.float32)
        S = S * tl.exp(gt)
        d = (vv - tl.sum(S * kv[:, None], 0)) * bt
        S = S + kv[:, None] * d[None, :]
        o = tl.sum(S * qv[:, None], 0) * scale
        tl.store(o_ptr + t * s_ot + h * V + cv, o.to(o_ptr.dtype.element_ty))
    tl.store(sp, S)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_indices: torch.Tensor,
        has_initial_state: torch.Tensor, scale: float) -> torch.Tensor:
    """Token-by-token Gated DeltaNet prefill; updates ``state_pool`` in place.

    Raises:
        ValueError: head dims not powers of two >= 32 for V (>= 16 for K), or non-contiguous inputs.
    """
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = state_indices.shape[0]
    if HV % HK or K & (K - 1) or K < 16 or V % BV or not all(
            x.is_contiguous() for x in (q, k, v, g, beta, state_pool)):
        raise ValueError("unsupported head dims, head counts or strides")
    o = torch.empty((T, HV, V), dtype=v.dtype, device=v.device)
    init = has_initial_state.view(torch.uint8) if has_initial_state.dtype == torch.bool else has_initial_state
    _recurrent_kernel[(V // BV, N * HV)](q, k, v, g, beta, cu_seqlens, state_pool, state_indices, init, o, scale,
                                         q.stride(0), k.stride(0), v.stride(0), o.stride(0),
                                         state_pool.stride(0), state_pool.stride(1),
                                         HV=HV, GROUP=HV // HK, K=K, V=V, BV=BV, num_warps=4)
    return o
