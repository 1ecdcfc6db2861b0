"""Tolerance probes for sliding_window_prefill: implementations the tolerance must accept or reject.

``d2k calibrate sliding_window_prefill`` measures every probe's error against the task's checks
(GPU: the registered workloads, bf16; CPU: the smoke workloads, fp16) and reports whether the
thresholds separate them. The probes are trusted PyTorch code run in the harness's own process:
the windowed map evaluated per batch entry with one numerical or semantic choice made the way a
kernel would make it.
"""

from __future__ import annotations

import torch

from d2kbench.suite.sliding_window_prefill.reference import run as reference_run

#: Relative error of an approximate hardware tanh (PTX tanh.approx.f32: about 2^-11).
APPROX_TANH_REL = 2.0 ** -11


def _swa(q, k, v, sinks, scale, window, softcap, *, p_round=True, score_round=False, dw=0, use_sinks=True,
         use_cap=True, approx_tanh=False, sink_max=False):
    """Windowed attention with the listed deviations: ``p_round`` rounds the un-normalised
    probabilities to the input dtype before P V (tensor-core kernels); ``score_round`` rounds the
    scores to bfloat16; ``dw`` widens (+1) or narrows (-1, never below one key) the window;
    ``use_sinks=False`` drops the sinks; ``use_cap=False`` drops the soft-cap; ``approx_tanh``
    perturbs tanh by its approximate instruction's relative error (alternating signs);
    ``sink_max`` takes the sink into the running max before P is rounded (the sink as the initial
    softmax state): where the sink dominates a row, every rounded probability is a fraction."""
    B, S, Hq, D = q.shape
    G = Hq // k.shape[2]
    W = max(1, int(window) + dw)
    o, lse = torch.empty_like(q), torch.empty((B, Hq, S), dtype=torch.float32, device=q.device)
    i = torch.arange(S, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    band = (j <= i) & (j > i - W)
    sink = sinks.float().view(Hq, 1, 1) if use_sinks else torch.full((Hq, 1, 1), float("-inf"), device=q.device)
    for b in range(B):
        kk = k[b].float().repeat_interleave(G, dim=1).transpose(0, 1)         # [Hq, S, D]
        vv = v[b].float().repeat_interleave(G, dim=1).transpose(0, 1)
        x = torch.matmul(q[b].float().transpose(0, 1), kk.transpose(1, 2)) * scale
        if softcap > 0 and use_cap:
            t = torch.tanh(x / softcap)
            if approx_tanh:
                sign = 1.0 - 2.0 * (torch.arange(t.numel(), device=q.device).view_as(t) % 2)
                t = t * (1.0 + APPROX_TANH_REL * sign)
            x = softcap * t
        if score_round:
            x = x.to(torch.bfloat16).float()
        x = x.masked_fill(~band, float("-inf"))
        m = x.amax(-1, keepdim=True)                                             # every row has a key
        if sink_max:
            m = torch.maximum(m, sink)
        p = torch.exp(x - m)
        pv = p.to(q.dtype).float() if p_round else p
        big = torch.maximum(m, sink)
        l = p.sum(-1, keepdim=True) * torch.exp(m - big) + torch.exp(sink - big)
        o[b] = (torch.matmul(pv, vv) * torch.exp(m - big) / l).transpose(0, 1).to(q.dtype)
        lse[b] = (big + l.log()).squeeze(-1)
    return o, lse


#: (name, function of the run arguments -> (o, lse), "accept" | "reject").
PROBES = [
    ("reference_fp32", reference_run, "accept"),
    ("flash_p_rounded", _swa, "accept"),
    ("flash_sink_in_running_max", lambda *a: _swa(*a, sink_max=True), "accept"),
    ("scores_rounded_bf16", lambda *a: _swa(*a, score_round=True), "reject"),
    ("window_one_key_wider", lambda *a: _swa(*a, dw=1), "reject"),
    ("window_one_key_narrower", lambda *a: _swa(*a, dw=-1), "reject"),
    ("sinks_dropped", lambda *a: _swa(*a, use_sinks=False), "reject"),
    ("softcap_dropped", lambda *a: _swa(*a, use_cap=False), "reject"),
    ("approximate_tanh", lambda *a: _swa(*a, approx_tanh=True), "reject"),
]
