"""Tolerance probes for varlen_flash_prefill: implementations the tolerance must accept or reject.

``d2k calibrate varlen_flash_prefill`` measures every probe's error against the task's checks
(GPU: the registered workloads, bf16; CPU: the smoke workloads, fp16) and reports whether the
thresholds separate them; the numbers go into the tolerance rationale in task.yaml. The probes
are trusted PyTorch code run in the harness's own process, not solutions: per sequence, causal
attention with one numerical or indexing choice made the way a kernel would make it.
"""

from __future__ import annotations

import torch

from d2kbench.suite.varlen_flash_prefill.reference import run as reference_run


def _varlen(q, k, v, cu_seqlens, max_seqlen, scale, *, p_round=True, score_round=False, shift=0,
            head_map="group", boundaries=True):
    """Varlen causal attention with the listed deviations: ``p_round`` rounds the un-normalised
    probabilities to the input dtype before P V (what a tensor-core kernel does); ``score_round``
    rounds the scores to bfloat16; ``shift`` lets row i see keys up to i + shift (1: one future
    key); ``head_map="modulo"`` reads KV head ``h % Hkv``; ``boundaries=False`` treats the packed
    batch as one sequence (keys of earlier sequences leak in)."""
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    heads = torch.arange(Hq, device=q.device)
    kvh = heads // G if head_map == "group" else heads % Hkv
    o, lse = torch.empty_like(q), torch.empty((Hq, T), dtype=torch.float32, device=q.device)
    cu = cu_seqlens.tolist() if boundaries else [0, T]
    for s in range(len(cu) - 1):
        b0, b1 = cu[s], cu[s + 1]
        L = b1 - b0
        kk = k[b0:b1].float()[:, kvh].transpose(0, 1)                          # [Hq, L, D]
        vv = v[b0:b1].float()[:, kvh].transpose(0, 1)
        x = torch.matmul(q[b0:b1].float().transpose(0, 1), kk.transpose(1, 2)) * scale   # [Hq, L, L]
        if score_round:
            x = x.to(torch.bfloat16).float()
        i = torch.arange(L, device=q.device)[:, None]
        j = torch.arange(L, device=q.device)[None, :]
        x = x.masked_fill(j > i + shift, float("-inf"))
        m = x.amax(-1, keepdim=True)
        p = torch.exp(x - m)
        l = p.sum(-1, keepdim=True)
        pv = p.to(q.dtype).float() if p_round else p
        o[b0:b1] = (torch.matmul(pv, vv) / l).transpose(0, 1).to(q.dtype)
        lse[:, b0:b1] = (m + l.log()).squeeze(-1)
    return o, lse


#: (name, function of the run arguments -> (o, lse), "accept" | "reject").
PROBES = [
    ("reference_fp32", reference_run, "accept"),
    ("flash_p_rounded", _varlen, "accept"),
    ("scores_rounded_bf16", lambda *a: _varlen(*a, score_round=True), "reject"),
    ("one_future_key", lambda *a: _varlen(*a, shift=1), "reject"),
    ("kv_head_modulo", lambda *a: _varlen(*a, head_map="modulo"), "reject"),
    ("sequence_boundaries_ignored", lambda *a: _varlen(*a, boundaries=False), "reject"),
]
