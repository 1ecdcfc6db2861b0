"""Tolerance probes for flash_decode_splitkv: implementations the tolerance must accept or reject.

``d2k calibrate flash_decode_splitkv`` measures every probe's error against the task's checks
(GPU: the registered workloads, bf16) and reports whether the thresholds separate them; the
numbers go into the tolerance rationale in task.yaml. The probes are trusted PyTorch code run
in the harness's own process, not solutions. Each is the decode map evaluated per sequence with
one numerical choice made the way a kernel would make it.
"""

from __future__ import annotations

import torch

from d2kbench.suite.flash_decode_splitkv.reference import run as reference_run


def _decode(q, k_cache, v_cache, cache_seqlens, scale, *, p_round=True, score_round=False, drop_tail=0,
            head_map="group", mask_values=True):
    """Decode attention with the listed deviations: ``p_round`` rounds the un-normalised
    probabilities to the input dtype before P V (what a tensor-core kernel does); ``score_round``
    rounds the scores to bfloat16 whatever the input dtype (a kernel that keeps its scores in
    bf16; float16 rounding is too fine to show on the short smoke contexts); ``drop_tail`` ignores
    the last keys of every sequence;
    ``head_map="modulo"`` reads KV head ``h % Hkv`` instead of ``h // G``; ``mask_values=False``
    masks only the scores, so the NaN rows past the length reach P V as 0 x NaN."""
    B, Hq, D = q.shape
    _, LMAX, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    heads = torch.arange(Hq, device=q.device)
    kvh = heads // G if head_map == "group" else heads % Hkv
    o, lse = torch.empty_like(q), torch.empty((B, Hq), dtype=torch.float32, device=q.device)
    for b in range(B):
        n = max(1, int(cache_seqlens[b]) - drop_tail)
        rows = LMAX if not mask_values else n
        k = k_cache[b, :rows].float()[:, kvh]                      # [rows, Hq, D]
        v = v_cache[b, :rows].float()[:, kvh]
        s = torch.einsum("hd,thd->ht", q[b].float(), k) * scale    # [Hq, rows]
        if score_round:
            s = s.to(torch.bfloat16).float()
        s[:, n:] = float("-inf")
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        pv = p.to(q.dtype).float() if p_round else p
        o[b] = (torch.einsum("ht,thd->hd", pv, v) / l).to(q.dtype)
        lse[b] = (m + l.log()).squeeze(-1)
    return o, lse


#: (name, function of the run arguments -> (o, lse), "accept" | "reject").
PROBES = [
    ("reference_fp32", reference_run, "accept"),
    ("flash_p_rounded", _decode, "accept"),
    ("scores_rounded", lambda *a: _decode(*a, score_round=True), "reject"),
    ("last_16_keys_dropped", lambda *a: _decode(*a, drop_tail=16), "reject"),
    ("kv_head_modulo", lambda *a: _decode(*a, head_map="modulo"), "reject"),
    ("scores_masked_only", lambda *a: _decode(*a, mask_values=False), "reject"),
]
