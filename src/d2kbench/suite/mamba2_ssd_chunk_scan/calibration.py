"""Tolerance probes for mamba2_ssd_chunk_scan: implementations the tolerance must accept or reject.

``d2k calibrate mamba2_ssd_chunk_scan`` measures every probe's error against the task's checks
(GPU: the registered bf16 workloads) and reports whether the thresholds separate them; the
numbers go into the tolerance rationale in task.yaml. The probes are trusted PyTorch code: the
SSD block decomposition per sequence and chunk, with one numerical or logical choice each.
``rounded`` is the error model of a tensor-core design: the chunk-entry states, the decayed
intra-chunk weights (C B^T o decay o dt') and the state-update operand (x o dt' o decay)
rounded to the input precision before their products (fp32 accumulation), C B^T and the
carried state in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from d2kbench.suite.mamba2_ssd_chunk_scan.reference import run as reference_run


def chunked(x, dt, dt_bias, A, B, C, D, cu_seqlens, state_pool, state_indices, has_initial_state, chunk_size, *,
            rounded: bool = True, passing: bool = True, skip: bool = True, softplus: bool = True,
            initial: bool = True, slot_shift: int = 0, group_of=None, chunk: int | None = None):
    """The SSD block decomposition (module docstring) with one choice each: ``rounded`` (operand
    roundings); ``passing=False``: every chunk starts from zero (state passing dropped);
    ``skip=False``: no D x term; ``softplus=False``: dt + dt_bias used raw (clamped at 0);
    ``initial=False``: the pool's initial states ignored; ``slot_shift``: sequence i uses the slot
    of sequence i + shift; ``group_of``: head -> group map (default ``h // (H / G)``)."""
    rdt = x.dtype if x.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    rb = (lambda t: t.to(rdt).float()) if rounded else (lambda t: t)
    Q = chunk or chunk_size
    T, H, P = x.shape
    G = B.shape[1]
    heads = torch.arange(H, device=x.device) // (H // G) if group_of is None else group_of(torch.arange(H), H, G)
    raw = dt.float() + dt_bias
    dtp = (F.softplus(raw) if softplus else raw.clamp_min(0)).t()                  # [H, T]
    dA = dtp * A[:, None]
    xf = x.float().transpose(0, 1)                                                 # [H, T, P]
    Bh, Ch = B.float()[:, heads].transpose(0, 1), C.float()[:, heads].transpose(0, 1)   # [H, T, DS]
    y = torch.empty((H, T, P), device=x.device)
    cu = cu_seqlens.tolist()
    N = len(cu) - 1
    slots = state_indices.long()[(torch.arange(N, device=x.device) + slot_shift) % N]
    finals = []
    for i in range(N):
        if initial and bool(has_initial_state[i]):
            S = state_pool[slots[i]].float().clone()                              # [H, P, DS]
        else:
            S = torch.zeros(state_pool.shape[1:], device=x.device)
        for c0 in range(cu[i], cu[i + 1], Q):
            c1 = min(c0 + Q, cu[i + 1])
            L = c1 - c0
            if not passing:
                S = torch.zeros_like(S)
            cs = dA[:, c0:c1].cumsum(-1)                                           # [H, L]
            low = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            dec = torch.exp(torch.where(low, cs[:, :, None] - cs[:, None, :], -torch.inf))
            cb = Ch[:, c0:c1] @ Bh[:, c0:c1].transpose(1, 2)
            wgt = rb(cb * dec * dtp[:, None, c0:c1])
            xc = xf[:, c0:c1]
            yc = wgt @ rb(xc) + torch.exp(cs)[:, :, None] * (rb(Ch[:, c0:c1]) @ rb(S).transpose(1, 2))
            if skip:
                yc = yc + D[:, None, None] * xc
            y[:, c0:c1] = yc
            up = rb(xc * (dtp[:, c0:c1] * torch.exp(cs[:, -1:] - cs))[:, :, None])
            S = torch.exp(cs[:, -1])[:, None, None] * S + up.transpose(1, 2) @ rb(Bh[:, c0:c1])
        finals.append(S)
    for i in range(N):
        state_pool[slots[i]] = finals[i]
    return y.transpose(0, 1).to(x.dtype)


def _modulo_groups(h, H, G):
    """Head h in group h % G (interleaved) instead of h // (H / G) (contiguous)."""
    return h % G


#: (name, function of the run arguments -> y, "accept" | "reject").
PROBES = [
    ("reference_fp32", reference_run, "accept"),
    ("chunked_fp32", lambda *a: chunked(*a, rounded=False), "accept"),
    ("chunked_rounded_operands", chunked, "accept"),
    ("chunked_rounded_q64", lambda *a: chunked(*a, chunk=64), "accept"),
    ("state_passing_dropped", lambda *a: chunked(*a, passing=False), "reject"),
    ("d_skip_dropped", lambda *a: chunked(*a, skip=False), "reject"),
    ("softplus_dropped", lambda *a: chunked(*a, softplus=False), "reject"),
    ("initial_state_ignored", lambda *a: chunked(*a, initial=False), "reject"),
    ("wrong_slot", lambda *a: chunked(*a, slot_shift=1), "reject"),
    ("heads_to_groups_interleaved", lambda *a: chunked(*a, group_of=_modulo_groups), "reject"),
]
