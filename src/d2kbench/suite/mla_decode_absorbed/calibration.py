"""Tolerance probes for mla_decode_absorbed: implementations the tolerance must accept or reject.

``d2k calibrate mla_decode_absorbed`` measures every probe's error against the task's checks
(GPU: the registered workloads, bf16) and reports whether the thresholds separate them; the
numbers go into the tolerance rationale in task.yaml. The probes are trusted PyTorch code run
in the harness's own process, not solutions: the absorbed algebra and the decompress algebra
with the roundings a bf16 kernel makes, and wrong variants.
"""

from __future__ import annotations

import torch

from d2kbench.suite.mla_decode_absorbed.reference import run as reference_run


def _rows(kv_cache, block_table, seq_lens, b):
    """Request ``b``'s valid cache rows, float32: ``[L, DL + DR]``."""
    n = int(seq_lens[b])
    PS = kv_cache.shape[1]
    t = torch.arange(n, device=kv_cache.device)
    return kv_cache[block_table[b, t // PS].long(), t % PS].float()


def _absorbed(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale, *, score_round=False,
              use_rope=True, qlat_round=True):
    """The absorbed design with a tensor-core kernel's roundings: q_lat in the input dtype (unless
    ``qlat_round`` is off), fp32 scores (rounded to the input dtype with ``score_round``), P in the
    input dtype for P c, the merged latent in the input dtype for the w_uv product; ``use_rope=False`` drops
    the rotary part of the scores. ``score_round`` rounds the scores to bfloat16 whatever the
    input dtype (a kernel that keeps its scores in bf16; float16 rounding is too fine to show on
    the short smoke contexts)."""
    DL = w_uv.shape[1]
    dt = q_nope.dtype
    o = torch.empty((q_nope.shape[0], q_nope.shape[1], w_uv.shape[2]), dtype=dt, device=q_nope.device)
    q_lat = torch.einsum("bhn,hnl->bhl", q_nope.float(), w_uk.float())
    if qlat_round:
        q_lat = q_lat.to(dt).float()
    for b in range(q_nope.shape[0]):
        rows = _rows(kv_cache, block_table, seq_lens, b)
        s = q_lat[b] @ rows[:, :DL].T
        if use_rope:
            s = s + q_pe[b].float() @ rows[:, DL:].T
        s = s * scale
        if score_round:
            s = s.to(torch.bfloat16).float()
        p = torch.exp(s - s.amax(-1, keepdim=True))
        o_lat = (p.to(dt).float() @ rows[:, :DL]) / p.sum(-1, keepdim=True)
        o[b] = torch.einsum("hl,hlv->hv", o_lat.to(dt).float(), w_uv.float()).to(dt)
    return o


def _decompressed(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale):
    """The decompress-then-attend port: per-head keys and values rounded to the input dtype, fp32
    scores, P in fp32 (CUDA-core products), output rounded once."""
    DL = w_uv.shape[1]
    dt = q_nope.dtype
    o = torch.empty((q_nope.shape[0], q_nope.shape[1], w_uv.shape[2]), dtype=dt, device=q_nope.device)
    for b in range(q_nope.shape[0]):
        rows = _rows(kv_cache, block_table, seq_lens, b)
        k = torch.einsum("ld,hnd->hln", rows[:, :DL], w_uk.float()).to(dt).float()
        v = torch.einsum("ld,hdv->hlv", rows[:, :DL], w_uv.float()).to(dt).float()
        s = (torch.einsum("hn,hln->hl", q_nope[b].float(), k) + q_pe[b].float() @ rows[:, DL:].T) * scale
        o[b] = torch.einsum("hl,hlv->hv", torch.softmax(s, -1), v).to(dt)
    return o


#: (name, function of the run arguments -> o, "accept" | "reject").
PROBES = [
    ("reference_fp32", reference_run, "accept"),
    ("absorbed_bf16_qlat", _absorbed, "accept"),
    ("absorbed_fp32_qlat", lambda *a: _absorbed(*a, qlat_round=False), "accept"),
    ("decompressed_bf16_kv", _decompressed, "accept"),
    ("scores_rounded", lambda *a: _absorbed(*a, score_round=True), "reject"),
    ("rope_part_dropped", lambda *a: _absorbed(*a, use_rope=False), "reject"),
]
