"""Tolerance probes for gated_deltanet_chunk_prefill: implementations the tolerance must accept
or reject.

``d2k calibrate gated_deltanet_chunk_prefill`` measures every probe's error against the task's
checks (GPU: the registered bf16 workloads) and reports whether the thresholds separate them;
the numbers go into the tolerance rationale in task.yaml. The probes are trusted PyTorch code:
the chunked (WY / UT) form of the recurrence, per sequence and chunk of 64 tokens, with one
numerical or logical choice each. ``rounded`` is the error model of a tensor-core design: the
normalised q and k, the inverse, W, U, the corrected values V' and the chunk-entry states
rounded to bf16 before they enter a product (fp32 accumulation), the state carried in fp32.
"""

from __future__ import annotations

import torch

from d2kbench.suite.gated_deltanet_chunk_prefill.reference import l2norm
from d2kbench.suite.gated_deltanet_chunk_prefill.reference import run as reference_run

#: chunk length of the chunked form
CHUNK = 64


def chunked(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state, scale, *,
            rounded: bool = True, gate: bool = True, inverse: bool = True, exclusive_gate: bool = False,
            initial: bool = True, slot_shift: int = 0, state_bf16: bool = False, chunk: int = CHUNK):
    """The chunked form (module docstring) with one choice each:

    ``rounded``: operands rounded to the input dtype (bf16 on the GPU, fp16 on CPU smoke
    workloads; the tensor-core error model); ``gate=False``: the decays dropped;
    ``inverse=False``: W and U without the triangular inverse (the intra-chunk delta-rule
    correction missing); ``exclusive_gate``: the in-chunk cumulative gate exclusive instead of
    inclusive (off by one token); ``initial=False``: the pool's initial states ignored;
    ``slot_shift``: sequence i reads and writes the slot of sequence i + shift; ``state_bf16``:
    the state carried between chunks in bf16 (not a probe: at the lengths measured it adds
    little to the operand roundings, 4.4-4.8e-3 against 4.0-4.6e-3; the tolerance cannot and
    need not reject it)."""
    rdt = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    rb = (lambda x: x.to(rdt).float()) if rounded else (lambda x: x)
    T, HK, K = q.shape
    HV = v.shape[1]
    rep = HV // HK
    qn = rb(l2norm(q)).repeat_interleave(rep, 1).transpose(0, 1)       # [HV, T, K]
    kn = rb(l2norm(k)).repeat_interleave(rep, 1).transpose(0, 1)
    vf, gf, bf = v.float().transpose(0, 1), g.float().t(), beta.float().t()
    if not gate:
        gf = torch.zeros_like(gf)
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device).transpose(0, 1)
    cu = cu_seqlens.tolist()
    N = len(cu) - 1
    slots = state_indices.long()
    slots = slots[(torch.arange(N, device=slots.device) + slot_shift) % N]
    finals = []
    for i in range(N):
        if initial and bool(has_initial_state[i]):
            S = state_pool[slots[i]].float().clone()                     # [HV, K, V]
        else:
            S = torch.zeros(state_pool.shape[1:], device=v.device)
        for c0 in range(cu[i], cu[i + 1], chunk):
            c1 = min(c0 + chunk, cu[i + 1])
            L = c1 - c0
            qc, kc, vc, bc = qn[:, c0:c1], kn[:, c0:c1], vf[:, c0:c1], bf[:, c0:c1]
            G = gf[:, c0:c1].cumsum(-1)
            if exclusive_gate:
                G = G - gf[:, c0:c1]
            diff = G[:, :, None] - G[:, None, :]
            lower = torch.ones(L, L, dtype=torch.bool, device=v.device).tril()
            gam = torch.exp(torch.where(lower, diff, -torch.inf))      # exp(G_i - G_j), j <= i
            strict = gam * (~torch.eye(L, dtype=torch.bool, device=v.device))
            A = bc[:, :, None] * (kc @ kc.transpose(1, 2)) * strict
            eye = torch.eye(L, device=v.device).expand(HV, L, L)
            Tm = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True) if inverse else eye
            Tm = rb(Tm)
            W = rb(Tm @ rb(bc[:, :, None] * kc * torch.exp(G)[:, :, None]))
            U = rb(Tm @ rb(bc[:, :, None] * vc))
            Sb = rb(S)
            vn = rb(U - W @ Sb)
            att = (qc @ kc.transpose(1, 2)) * gam
            o[:, c0:c1] = scale * (rb(qc * torch.exp(G)[:, :, None]) @ Sb + rb(att) @ vn)
            kd = rb(kc * torch.exp(G[:, -1:] - G)[:, :, None])
            S = torch.exp(G[:, -1])[:, None, None] * S + kd.transpose(1, 2) @ vn
            if state_bf16:
                S = S.to(torch.bfloat16).float()
        finals.append(S)
    for i in range(N):
        state_pool[slots[i]] = finals[i]
    return o.transpose(0, 1).to(v.dtype)


#: (name, function of the run arguments -> o, "accept" | "reject").
PROBES = [
    ("reference_fp32", reference_run, "accept"),
    ("chunked_fp32", lambda *a: chunked(*a, rounded=False), "accept"),
    ("chunked_bf16_operands", chunked, "accept"),
    ("gate_dropped", lambda *a: chunked(*a, gate=False), "reject"),
    ("gate_exclusive_cumsum", lambda *a: chunked(*a, exclusive_gate=True), "reject"),
    ("inverse_missing", lambda *a: chunked(*a, inverse=False), "reject"),
    ("initial_state_ignored", lambda *a: chunked(*a, initial=False), "reject"),
    ("wrong_slot", lambda *a: chunked(*a, slot_shift=1), "reject"),
]
