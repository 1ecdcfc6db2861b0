"""Tolerance probes for chunked_prefill_paged: implementations the tolerance must accept or reject.

``d2k calibrate chunked_prefill_paged`` measures every probe's error against the task's checks
(GPU: the registered workloads, bf16; CPU: the smoke workloads, fp16) and reports whether the
thresholds separate them; the numbers go into the tolerance rationale in task.yaml. The probes
are trusted PyTorch code run in the harness's own process, not solutions: per request, extend
attention with one numerical or indexing choice made the way a kernel would make it; every
probe writes the cache correctly (the state checks are exact and not what is probed here).
"""

from __future__ import annotations

import torch

from d2kbench.suite.chunked_prefill_paged.reference import run as reference_run
from d2kbench.suite.chunked_prefill_paged.reference import write_cache


def _extend(q, k_new, v_new, cu_seqlens_q, k_cache, v_cache, block_tables, context_lens, slot_mapping,
            max_seqlen_q, max_context_len, scale, *, p_round=True, score_round=False, shift=0, ctx_delta=0,
            head_map="group", diagonal="shifted"):
    """Extend attention with the listed deviations: ``p_round`` rounds the un-normalised
    probabilities to the input dtype before P V (what a tensor-core kernel does);
    ``score_round`` rounds the scores to bfloat16; ``shift`` lets new token r see up to
    ``r + shift`` chunk keys (1: one future key); ``ctx_delta`` reads ``ctx_i + ctx_delta`` context
    tokens (-1: the last cached token dropped); ``head_map="modulo"`` reads KV head ``h % Hkv``;
    ``diagonal="local"`` applies the causal mask at local positions over the whole key range (the
    diagonal not shifted by the context: the prefix is cut short)."""
    write_cache(k_new, v_new, k_cache, v_cache, slot_mapping)
    T, Hq, D = q.shape
    NB, BS, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    heads = torch.arange(Hq, device=q.device)
    kvh = heads // G if head_map == "group" else heads % Hkv
    o = torch.empty_like(q)
    cu, ctxs = cu_seqlens_q.tolist(), context_lens.tolist()
    for i, ctx in enumerate(ctxs):
        b0, b1 = cu[i], cu[i + 1]
        n = b1 - b0
        c = max(0, ctx + ctx_delta)
        pages = block_tables[i, :(c + BS - 1) // BS].long()
        kc = k_cache[pages].reshape(-1, Hkv, D)[:c]
        vc = v_cache[pages].reshape(-1, Hkv, D)[:c]
        kk = torch.cat([kc, k_new[b0:b1]]).float()[:, kvh].transpose(0, 1)      # [Hq, c + n, D]
        vv = torch.cat([vc, v_new[b0:b1]]).float()[:, kvh].transpose(0, 1)
        x = torch.matmul(q[b0:b1].float().transpose(0, 1), kk.transpose(1, 2)) * scale
        if score_round:
            x = x.to(torch.bfloat16).float()
        r = torch.arange(n, device=q.device)[:, None]
        j = torch.arange(c + n, device=q.device)[None, :]
        visible = j <= (r + shift if diagonal == "local" else c + r + shift)
        x = x.masked_fill(~visible, float("-inf"))
        m = x.amax(-1, keepdim=True)
        p = torch.exp(x - m)
        l_ = p.sum(-1, keepdim=True)
        pv = p.to(q.dtype).float() if p_round else p
        o[b0:b1] = (torch.matmul(pv, vv) / l_).transpose(0, 1).to(q.dtype)
    return o


#: (name, function of the run arguments -> o, "accept" | "reject").
PROBES = [
    ("reference_fp32", reference_run, "accept"),
    ("flash_p_rounded", _extend, "accept"),
    ("scores_rounded_bf16", lambda *a: _extend(*a, score_round=True), "reject"),
    ("one_future_key", lambda *a: _extend(*a, shift=1), "reject"),
    ("last_context_token_dropped", lambda *a: _extend(*a, ctx_delta=-1), "reject"),
    ("diagonal_not_shifted", lambda *a: _extend(*a, diagonal="local"), "reject"),
    ("kv_head_modulo", lambda *a: _extend(*a, head_map="modulo"), "reject"),
]
