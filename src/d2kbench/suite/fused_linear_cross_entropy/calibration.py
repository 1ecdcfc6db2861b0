"""Tolerance probes for fused_linear_cross_entropy: implementations the tolerance must accept or
reject.

``d2k calibrate fused_linear_cross_entropy`` runs every probe through the task's checks (GPU: the
registered bf16 workloads) and reports whether the thresholds separate them; the numbers are in
the tolerance rationale of task.yaml. Each probe is the reference map with one numerical or
semantic choice made the way a kernel might make it (trusted PyTorch, run in the harness's own
process, float32 arithmetic with the named roundings to x's dtype).
"""

from __future__ import annotations

import torch

from d2kbench.suite.fused_linear_cross_entropy.reference import run as reference_run


def _flce(x, weight, labels, ignore_index, *, logits_round=False, p_round=True, tile_exp=0, max_sub=True,
          count_ignored=False, mask_ignored=True, reduce="mean", onehot=True, dw_chunks=0):
    """The loss and gradients with one deviation: ``logits_round`` rounds the logits to x's
    dtype before the softmax (Liger, and the eager bf16 training step); ``p_round`` rounds P to
    x's dtype before the two gradient products (every tensor-core kernel does); ``tile_exp`` >
    0 stores exp(s - m) with m the max of each ``tile_exp``-column tile in x's dtype and forms P
    from it (the expert's storage); ``max_sub=False`` exponentiates the raw logits (overflow past
    88); ``count_ignored`` divides by BT instead of N; ``mask_ignored=False`` lets ignored rows
    contribute softmax (no target) to loss and gradients; ``reduce="sum"``; ``onehot=False``
    drops the -1 at the label from P; ``dw_chunks`` > 0 accumulates dW in x's dtype over row
    chunks of that size (a low-precision accumulator)."""
    dt = x.dtype
    BT = x.shape[0]
    valid = labels != ignore_index
    used = valid if mask_ignored else torch.ones_like(valid)
    n = (torch.tensor(float(BT)) if count_ignored else valid.sum().clamp_min(1).to(torch.float32))
    if reduce == "sum":
        n = torch.tensor(1.0)
    wf = weight.float()
    s = x.float() @ wf.t()
    if logits_round:
        s = s.to(dt).float()
    safe = torch.where(valid, labels, 0)
    if tile_exp:
        V = s.shape[1]
        pad = (-V) % tile_exp
        sp = torch.nn.functional.pad(s, (0, pad), value=float("-inf")).view(BT, -1, tile_exp)
        m = sp.amax(dim=2, keepdim=True)
        e = (sp - m).exp().to(dt).float()
        lse = (m[..., 0] + e.sum(dim=2).log()).logsumexp(dim=1)
        p = (e * (m - lse[:, None, None]).exp()).view(BT, -1)[:, :V]
    else:
        if max_sub:
            lse = torch.logsumexp(s, dim=1)
        else:
            lse = s.exp().sum(dim=1).log()
        p = (s - lse[:, None]).exp() if max_sub else s.exp() / s.exp().sum(dim=1, keepdim=True)
    tgt = s.gather(1, safe[:, None])[:, 0] * valid
    loss = torch.where(used, lse - tgt, 0.0).sum() / n
    if onehot:
        p = p.scatter_add(1, safe[:, None], -valid.to(torch.float32)[:, None])
    p = p * (used.to(torch.float32) / n)[:, None]
    pm = p.to(dt).float() if p_round else p
    dx = (pm @ wf).to(dt)
    if dw_chunks:
        dw = torch.zeros(weight.shape, dtype=dt)
        for r in range(0, BT, dw_chunks):
            dw = (dw.float() + pm[r:r + dw_chunks].t() @ x[r:r + dw_chunks].float()).to(dt)
        dw = dw.float()
    else:
        dw = pm.t() @ x.float()
    return loss, dx, dw


#: (name, function of the run arguments -> (loss, dX, dW), "accept" | "reject").
PROBES = [
    ("reference", reference_run, "accept"),
    ("p_rounded", _flce, "accept"),
    ("exp_tiles_stored_16bit", lambda *a: _flce(*a, tile_exp=256), "accept"),
    ("logits_rounded", lambda *a: _flce(*a, logits_round=True), "accept"),
    ("dw_16bit_accumulator_128_rows", lambda *a: _flce(*a, dw_chunks=128), "accept"),
    ("no_max_subtraction", lambda *a: _flce(*a, max_sub=False), "reject"),
    ("mean_over_all_rows", lambda *a: _flce(*a, count_ignored=True), "reject"),
    ("ignore_index_ignored", lambda *a: _flce(*a, mask_ignored=False), "reject"),
    ("sum_not_mean", lambda *a: _flce(*a, reduce="sum"), "reject"),
    ("target_term_dropped", lambda *a: _flce(*a, onehot=False), "reject"),
]
