"""Multi-head latent attention (MLA) decode over a paged latent cache, DeepSeek-V3 / Kimi-K2
style: inputs and the PyTorch reference (the model's own decompress-then-attend definition).

The operator. The cache stores, per token, the compressed KV latent ``c_t`` (``DL`` = 512 values,
after the KV RMSNorm) followed by the shared rotary key ``k_pe_t`` (``DR`` = 64 values, already
rotated) as one row of ``DL + DR`` values; pages of ``PS`` = 64 tokens (FlashMLA's page size):
token ``t`` of request ``b`` is row ``t % PS`` of page ``block_table[b, t // PS]``. Head ``h``
decompresses keys and values with its slices of the up-projection::

    k_nope[t, h] = w_uk[h] @ c_t          ([DN, DL] @ [DL] -> DN = 128)
    v[t, h]      = c_t @ w_uv[h]          ([DL] @ [DL, DV] -> DV = 128)
    s[t, h]      = scale * (q_nope[b, h] . k_nope[t, h] + q_pe[b, h] . k_pe_t)
    o[b, h]      = sum_t softmax_t(s[:, h]) * v[t, h]                     (t < seq_lens[b])

(``o`` is the attention output before the o_proj, which is not part of the task.) Every cache
row that holds no valid token is NaN, and table entries past a request's last page point at
NaN-filled pages.

``run`` is that definition, literally: per request it gathers the pages up to the table's
capacity, zeroes invalid tokens, materialises float32 per-head keys and values from the latents
and runs ordinary multi-head attention in float32 (no host synchronisation: graph-capturable).
``oracle`` is the same in float64, unrounded.
"""

from __future__ import annotations

import math

import torch

#: Elements of the per-head keys and values materialised at once (bounds the reference's memory).
CHUNK_ELEMENTS = 1 << 28
#: YaRN factors of the registered models (rope_scaling.factor with mscale_all_dim 1.0): the
#: softmax scale is (DN + DR)^-0.5 * mscale^2 with mscale = 0.1 ln(factor) + 1.
YARN_FACTOR = {"deepseek_v3": 40.0, "kimi_k2": 32.0}


def softmax_scale(workload: dict) -> float:
    """``(DN + DR)^-0.5 * (0.1 ln(f) + 1)^2`` with the YaRN factor ``f`` of the workload's
    ``model`` parameter (DeepSeek-V3 by default): 0.1352 for DeepSeek-V3, 0.1309 for Kimi-K2 at
    DN + DR = 192 (the softmax_scale of DeepSeek's modelling code)."""
    mscale = 0.1 * math.log(YARN_FACTOR[str(workload.get("model", "deepseek_v3"))]) + 1.0
    return (int(workload["DN"]) + int(workload["DR"])) ** -0.5 * mscale * mscale


def _lengths(B: int, hi: int, PS: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """Sequence lengths (int64, CPU) in random order. ``uniform``: antithetic pairs from
    U{hi//4 .. hi}, so the total is exactly ``B * (hi//4 + hi) / 2`` for even B (the SOL formula
    uses it); ``edge``: lengths at page boundaries (1, PS-1, PS, PS+1, ...) and the capacity."""
    lo = max(1, hi // 4)
    if kind == "uniform":
        half = torch.randint(lo, hi + 1, ((B + 1) // 2,), generator=gen)
        lens = torch.cat([half, lo + hi - half])[:B]
    elif kind == "edge":
        cands = [1, 2, PS - 1, PS, PS + 1, 2 * PS - 1, 2 * PS + 1, hi - 1, hi, hi // 2 + 1, 3 * PS]
        lens = torch.tensor([min(hi, max(1, cands[i % len(cands)])) for i in range(B)])
    else:
        raise ValueError(f"unknown lens kind {kind!r} (uniform or edge)")
    return lens[torch.randperm(B, generator=gen)]


def make_metadata(workload: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The CPU part of :func:`make_inputs`: ``(seq_lens [B], block_table [B, MAXP], valid [NP * PS])``
    (int64, int64, bool): lengths, a random page permutation with NaN-page padding, and which cache
    rows hold a valid token.

    Raises:
        ValueError: a page pool too small for the drawn lengths (one unused page is required).
    """
    B, NP, PS, MAXP = (int(workload[a]) for a in ("B", "NP", "PS", "MAXP"))
    gen = torch.Generator().manual_seed(seed)
    lens = _lengths(B, MAXP * PS, PS, str(workload.get("lens", "uniform")), gen)
    need = (lens + PS - 1) // PS
    total = int(need.sum())
    if total >= NP:
        raise ValueError(f"page pool too small: {total} pages needed, NP={NP} (one unused page is required)")
    perm = torch.randperm(NP, generator=gen)
    table = perm[total:][torch.randint(0, NP - total, (B, MAXP), generator=gen)]   # padding -> NaN pages
    start = 0
    for b in range(B):
        table[b, :int(need[b])] = perm[start:start + int(need[b])]
        start += int(need[b])
    t = torch.arange(MAXP * PS)
    flat = table[:, t // PS] * PS + (t % PS)[None, :]
    valid = torch.zeros(NP * PS, dtype=torch.bool)
    valid[flat[t[None, :] < lens[:, None]]] = True
    return lens, table, valid


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``B, H, DN, DR, DL, DV, NP, PS, MAXP`` and optional params ``dtype``
            (``bfloat16`` by default, ``float16`` on CPU smoke workloads), ``lens`` (``uniform``
            by default, ``edge``), ``model`` (``deepseek_v3`` or ``kimi_k2``: the softmax scale)
            and ``variant`` (``gaussian``; ``rope_only``: ``q_nope = 0``, so the scores come from
            the rotary part alone).
        seed: seed of the generators (metadata on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``q_nope [B, H, DN]``, ``q_pe [B, H, DR]``, ``kv_cache [NP, PS, DL + DR]`` (latents then
        rotary keys, standard normal; NaN in every row that holds no valid token),
        ``block_table [B, MAXP]`` int32, ``seq_lens [B]`` int32, ``w_uk [H, DN, DL]`` and
        ``w_uv [H, DL, DV]`` (normal with variance 1/DL: decompressed keys and values of unit
        variance), ``scale`` (:func:`softmax_scale`).

    Raises:
        ValueError: unknown parameters or a pool too small.
    """
    B, H, DN, DR, DL, DV, NP, PS = (int(workload[a]) for a in ("B", "H", "DN", "DR", "DL", "DV", "NP", "PS"))
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = workload.get("variant", "gaussian")
    if variant not in ("gaussian", "rope_only"):
        raise ValueError(f"unknown mla_decode_absorbed variant {variant!r}")
    lens, table, valid = make_metadata(workload, seed)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, std: float = 1.0) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device) * std

    cache = randn(NP * PS, DL + DR).masked_fill_((~valid).to(device)[:, None], float("nan"))
    q_nope = randn(B, H, DN)
    if variant == "rope_only":
        q_nope.zero_()
    return {"q_nope": q_nope.to(dtype), "q_pe": randn(B, H, DR).to(dtype),
            "kv_cache": cache.to(dtype).view(NP, PS, DL + DR),
            "block_table": table.to(torch.int32).to(device), "seq_lens": lens.to(torch.int32).to(device),
            "w_uk": randn(H, DN, DL, std=DL ** -0.5).to(dtype), "w_uv": randn(H, DL, DV, std=DL ** -0.5).to(dtype),
            "scale": softmax_scale(workload)}


def _decode(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale, compute, out_dtype):
    B, H, DN = q_nope.shape
    _, PS, DC = kv_cache.shape
    DL, DV = w_uv.shape[1], w_uv.shape[2]
    L = block_table.shape[1] * PS
    o = torch.empty((B, H, DV), dtype=out_dtype, device=q_nope.device)
    t = torch.arange(L, device=q_nope.device)
    wk, wv = w_uk.to(compute), w_uv.to(compute)
    group = max(1, min(B, CHUNK_ELEMENTS // max(1, L * H * (DN + DV))))
    for b0 in range(0, B, group):                         # static loop: graph-capturable
        b1 = min(B, b0 + group)
        ok = t[None, :] < seq_lens[b0:b1, None]           # [n, L]
        rows = torch.where(ok[:, :, None], kv_cache[block_table[b0:b1].long()].flatten(1, 2).to(compute), 0.0)
        c, k_pe = rows[..., :DL], rows[..., DL:]          # [n, L, DL], [n, L, DR]
        k_nope = torch.einsum("nld,hed->nhle", c, wk)     # [n, H, L, DN]  (materialised per-head keys)
        v = torch.einsum("nld,hdv->nhlv", c, wv)          # [n, H, L, DV]  (and values)
        s = torch.einsum("nhe,nhle->nhl", q_nope[b0:b1].to(compute), k_nope)
        s = (s + torch.einsum("nhr,nlr->nhl", q_pe[b0:b1].to(compute), k_pe)) * scale
        p = torch.softmax(s.masked_fill(~ok[:, None, :], float("-inf")), dim=-1)
        o[b0:b1] = torch.einsum("nhl,nhlv->nhv", p, v).to(out_dtype)
    return o


def run(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
        seq_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
    """Reference MLA decode: decompress per-head keys and values, then attend (float32).

    Args:
        q_nope: ``[B, H, DN]`` bf16 (fp16 on smoke workloads); q_pe: ``[B, H, DR]`` (rotated).
        kv_cache: ``[NP, PS, DL + DR]`` pages of latent rows (latent, then rotary key); NaN in
            rows that hold no valid token.
        block_table: ``[B, MAXP]`` int32 page ids (device); seq_lens: ``[B]`` int32 lengths in
            ``[1, MAXP * PS]`` (device).
        w_uk: ``[H, DN, DL]`` key up-projection; w_uv: ``[H, DL, DV]`` value up-projection.
        scale: softmax scale.

    Returns:
        ``o [B, H, DV]`` in q_nope's dtype (a new tensor).
    """
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return _decode(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale, torch.float32, q_nope.dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def oracle(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale) -> torch.Tensor:
    """The same map in float64, unrounded: ``o [B, H, DV]`` float64."""
    return _decode(q_nope, q_pe, kv_cache, block_table, seq_lens, w_uk, w_uv, scale, torch.float64, torch.float64)
