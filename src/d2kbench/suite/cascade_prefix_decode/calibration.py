"""Tolerance probes for cascade_prefix_decode: implementations the tolerance must accept or reject.

``d2k calibrate cascade_prefix_decode`` measures every probe's error against the task's checks
(GPU: the registered workloads, bf16) and reports whether the thresholds separate them; the
numbers go into the tolerance rationale in task.yaml. The probes are trusted PyTorch code run
in the harness's own process, not solutions: the cascade algebra (prefix through table row 0,
suffix through each request's row, LSE merge) with one numerical or logical choice each.
"""

from __future__ import annotations

import torch

from d2kbench.suite.cascade_prefix_decode.reference import run as reference_run


def _part(q, k_cache, v_cache, row, lo, hi, scale, p_round, score_round):
    """``(o [Hq, D] fp32 normalised, lse [Hq])`` of one request's query over tokens [lo, hi) of the
    block-table ``row``; ``lse = -inf`` for an empty range. ``p_round``: P in the input dtype for
    P V; ``score_round``: scores rounded to bfloat16 (whatever the input dtype)."""
    Hq, D = q.shape
    BS, Hkv = k_cache.shape[1], k_cache.shape[2]
    if hi <= lo:
        return torch.zeros((Hq, D), device=q.device), torch.full((Hq,), float("-inf"), device=q.device)
    t = torch.arange(lo, hi, device=q.device)
    pages = row[t // BS].long()
    heads = torch.arange(Hq, device=q.device) // (Hq // Hkv)
    k = k_cache[pages, t % BS].float()[:, heads]               # [n, Hq, D]
    v = v_cache[pages, t % BS].float()[:, heads]
    s = torch.einsum("hd,thd->ht", q.float(), k) * scale
    if score_round:
        s = s.to(torch.bfloat16).float()
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    pv = p.to(q.dtype).float() if p_round else p
    return torch.einsum("ht,thd->hd", pv, v) / l, (m + l.log()).squeeze(-1)


def _cascade(q, k_cache, v_cache, block_tables, seq_lens, common_prefix_len, scale, *, p_round=True,
             score_round=False, prefix_end=None, use_suffix=True, prefix_weight=1.0, partial_round=False):
    """Prefix part (tokens below ``prefix_end``, default the shared pages' ``P // BS * BS``,
    through row 0) merged with the suffix part (from ``prefix_end`` to the length, through the
    request's row). ``prefix_weight`` scales the prefix's merge weight (2.0: the prefix counted
    twice); ``partial_round`` rounds both partial outputs to q's dtype before the merge (LSEs
    stay float32), as a cascade built from attention kernels that return q's dtype does
    (FlashInfer's cascade wrapper merging its levels' outputs, the ``sdpa_cascade``
    alternative)."""
    BS = k_cache.shape[1]
    P = common_prefix_len // BS * BS if prefix_end is None else prefix_end
    o = torch.empty_like(q)
    for i in range(q.shape[0]):
        o_a, lse_a = _part(q[i], k_cache, v_cache, block_tables[0], 0, P, scale, p_round, score_round)
        hi = int(seq_lens[i]) if use_suffix else P
        o_b, lse_b = _part(q[i], k_cache, v_cache, block_tables[i], P, hi, scale, p_round, score_round)
        if partial_round:
            o_a, o_b = o_a.to(q.dtype).float(), o_b.to(q.dtype).float()
        m = torch.maximum(lse_a, lse_b)
        w_a, w_b = prefix_weight * torch.exp(lse_a - m), torch.exp(lse_b - m)
        o[i] = ((w_a[:, None] * o_a + w_b[:, None] * o_b) / (w_a + w_b)[:, None]).to(q.dtype)
    return o


def _page_up(q, k, v, bt, sl, P, scale):
    """The prefix rounded up to whole pages and read through row 0 (wrong when P ends mid-page:
    request 0's own page, its own tokens or its NaN slots, stand in for every request's)."""
    BS = k.shape[1]
    return _cascade(q, k, v, bt, sl, P, scale, prefix_end=(P + BS - 1) // BS * BS)


#: (name, function of the run arguments -> o, "accept" | "reject").
PROBES = [
    ("reference_fp32", reference_run, "accept"),
    ("cascade_p_rounded", _cascade, "accept"),
    ("partials_rounded", lambda *a: _cascade(*a, partial_round=True), "accept"),
    ("scores_rounded", lambda *a: _cascade(*a, score_round=True), "reject"),
    ("suffix_dropped", lambda *a: _cascade(*a, use_suffix=False), "reject"),
    ("prefix_counted_twice", lambda *a: _cascade(*a, prefix_weight=2.0), "reject"),
    ("prefix_rounded_up_to_page", _page_up, "reject"),
]
