"""Tolerance probes for fused_qkv_norm_rope_cache: implementations the tolerance must accept or
reject.

``d2k calibrate fused_qkv_norm_rope_cache`` runs every probe through the task's checks (GPU: the
registered bf16 workloads) and reports whether the thresholds separate them; the numbers are in
the tolerance rationale of task.yaml. Each probe is the reference map with one numerical or
semantic choice made the way a kernel might make it (trusted PyTorch, run in the harness's own
process).
"""

from __future__ import annotations

import torch

from d2kbench.suite.fused_qkv_norm_rope_cache.reference import run as reference_run
from d2kbench.suite.fused_qkv_norm_rope_cache.reference import store_rows


def _prologue(qkv, q_w, k_w, cos_sin_cache, positions, key_cache, value_cache, slot_mapping, num_q_heads, eps, *,
              round_normed=False, table_dtype=None, fp32_angles=False, interleaved=False, weight=True,
              norm_over="head", eps_on=True, use_positions=True, swap_weights=False, rope_k=True, rsqrt_ulps=0):
    """The prologue with one deviation: ``round_normed`` rounds the normalised heads to the input
    dtype before the rotation (the unfused model's two steps); ``table_dtype`` rounds the cos/sin
    table (bf16: vLLM's unfused rotary module keeps it in the model dtype); ``fp32_angles``
    computes cos/sin in float32 from ``position * inv_freq`` instead of reading the table;
    ``interleaved`` rotates GPT-J pairs (2i, 2i+1) instead of NeoX halves; ``weight=False`` drops
    the norm gain; ``norm_over="all"`` normalises each token's q (and k) heads together;
    ``eps_on=False`` drops eps; ``use_positions=False`` rotates by the token index;
    ``swap_weights`` uses k_norm on q and q_norm on k; ``rope_k=False`` stores the unrotated k;
    ``rsqrt_ulps`` perturbs rstd by that many float32 ulps (an approximate rsqrt)."""
    T = qkv.shape[0]
    Hkv, D = key_cache.shape[2], key_cache.shape[3]
    Hq = num_q_heads
    x = qkv.view(T, Hq + 2 * Hkv, D).float()
    table = cos_sin_cache if table_dtype is None else cos_sin_cache.to(table_dtype).float()
    pos = positions if use_positions else torch.arange(T, device=qkv.device)
    if fp32_angles:
        inv = (1.0e6 ** (-torch.arange(0, D, 2, dtype=torch.float32, device=qkv.device) / D))
        ang = pos.to(torch.float32)[:, None] * inv[None, :]
        cs = torch.cat([ang.cos(), ang.sin()], dim=1)
    else:
        cs = table.index_select(0, pos)
    cos, sin = cs[:, None, :D // 2], cs[:, None, D // 2:]
    if swap_weights:
        q_w, k_w = k_w, q_w

    def norm(h, w):
        ms = h.square().mean(dim=-1, keepdim=True)
        if norm_over == "all":
            ms = ms.mean(dim=1, keepdim=True).expand_as(ms)
        rstd = torch.rsqrt(ms + (eps if eps_on else 0.0))
        if rsqrt_ulps:
            rstd = rstd * (1.0 + rsqrt_ulps * 2.0 ** -23)
        n = h * rstd * (w.float() if weight else 1.0)
        return n.to(qkv.dtype).float() if round_normed else n

    def rope(n):
        if interleaved:
            a, b = n[..., 0::2], n[..., 1::2]
            return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
        half = D // 2
        a, b = n[..., :half], n[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    q_out = rope(norm(x[:, :Hq], q_w)).to(qkv.dtype)
    k_n = norm(x[:, Hq:Hq + Hkv], k_w)
    k_out = (rope(k_n) if rope_k else k_n).to(qkv.dtype)
    store_rows(k_out, key_cache, slot_mapping)
    store_rows(qkv.view(T, Hq + 2 * Hkv, D)[:, Hq + Hkv:], value_cache, slot_mapping)
    return q_out


#: (name, function of the run arguments -> q_out, "accept" | "reject").
PROBES = [
    ("reference", reference_run, "accept"),
    ("normed_heads_rounded", lambda *a: _prologue(*a, round_normed=True), "accept"),
    ("bf16_cos_sin_table", lambda *a: _prologue(*a, round_normed=True, table_dtype=torch.bfloat16), "accept"),
    ("fp32_angles", lambda *a: _prologue(*a, fp32_angles=True), "accept"),
    ("rsqrt_4_ulps", lambda *a: _prologue(*a, rsqrt_ulps=4), "accept"),
    ("gptj_interleaved_pairs", lambda *a: _prologue(*a, interleaved=True), "reject"),
    ("norm_gain_dropped", lambda *a: _prologue(*a, weight=False), "reject"),
    ("norm_over_all_heads", lambda *a: _prologue(*a, norm_over="all"), "reject"),
    ("token_index_as_position", lambda *a: _prologue(*a, use_positions=False), "reject"),
    ("q_and_k_gains_swapped", lambda *a: _prologue(*a, swap_weights=True), "reject"),
    ("unrotated_keys_cached", lambda *a: _prologue(*a, rope_k=False), "reject"),
    ("eps_dropped", lambda *a: _prologue(*a, eps_on=False), "reject"),
]
