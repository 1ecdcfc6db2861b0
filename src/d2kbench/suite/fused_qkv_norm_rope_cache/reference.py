"""Qwen3 attention prologue: per-head RMSNorm of q and k, NeoX rotary embedding, and the
paged KV-cache write, from the fused QKV projection output. Inputs and the PyTorch reference.

The operator. ``qkv [T, (Hq + 2 Hkv) D]`` holds, per token, Hq query heads, Hkv key heads and
Hkv value heads of D values each (in that order, the output of Qwen3's fused ``qkv_proj``).
For every token ``t`` and head ``h`` (all arithmetic in float32)::

    n[t, h, :]  = x[t, h, :] * rsqrt(mean(x[t, h, :]^2) + eps) * w        (w = q_norm or k_norm)
    c, s        = cos_sin_cache[positions[t], :D/2], cos_sin_cache[positions[t], D/2:]
    rope(n)     = [n[:D/2] * c - n[D/2:] * s,  n[D/2:] * c + n[:D/2] * s]   (NeoX halves)

``q_out[t, h] = dtype(rope(n_q))`` is returned; for every token with ``slot =
slot_mapping[t] != -1``, ``key_cache[slot // BS, slot % BS] = dtype(rope(n_k))`` and
``value_cache[slot // BS, slot % BS] = v[t]`` (a copy), in place. Every other cache slot keeps
its values (canaries). The values are rounded to the output dtype once, at the end; rounding
the normalised heads to bf16 before the rotation (what the unfused model does) is within the
tolerance.

The cos/sin table is Qwen3's (rope_theta 1e6, 40960 positions), computed in float64 and
stored in float32, first half cos, second half sin (vLLM's ``cos_sin_cache`` layout).
"""

from __future__ import annotations

import torch

#: Qwen3 rope_theta (config.json of Qwen3-8B / 32B / 235B-A22B).
ROPE_THETA = 1.0e6
#: Qwen3 rms_norm_eps.
EPS = 1e-6


def cos_sin_table(max_pos: int, head_dim: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """``[max_pos, head_dim]`` float32: cos of ``p * theta^(-2i/D)`` in columns ``i < D/2``, sin
    in the second half (NeoX rotary embedding, as vLLM's ``RotaryEmbedding`` builds it), the
    angles taken in float64 so that large positions keep their phase."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=1).to(torch.float32)


def _sequences(T: int, gen: torch.Generator) -> list[int]:
    """Lengths of the sequences of a prefill batch of T tokens (chunks of T/16 .. T/4)."""
    out, t = [], 0
    while t < T:
        n = min(T - t, int(torch.randint(max(1, T // 16), max(2, T // 4) + 1, (1,), generator=gen)))
        out.append(n)
        t += n
    return out


def make_metadata(workload: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU part of :func:`make_inputs`: ``(positions [T], slot_mapping [T])`` int64.

    ``mode`` ``prefill``: sequences of consecutive positions from a random offset, each in
    consecutive slots of its own random pages (the first page partly filled, as in chunked
    prefill); ``decode``: one token per sequence at a random position, in a random slot of its
    own page. 2% of the tokens (at least one) are padding (slot -1); ``pad: many`` makes it a
    quarter. Positions lie in ``[0, MAXPOS)``.

    Raises:
        ValueError: an unknown mode or pad kind, or a page pool too small.
    """
    T, NB, BS, MAXPOS = (int(workload[a]) for a in ("T", "NB", "BS", "MAXPOS"))
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(NB, generator=gen)
    mode = str(workload.get("mode", "prefill"))
    if mode == "prefill":
        pos, slots, used = [], [], 0
        for n in _sequences(T, gen):
            start = int(torch.randint(0, max(1, MAXPOS - n), (1,), generator=gen))
            ctx = int(torch.randint(0, BS, (1,), generator=gen))   # tokens already in its first page
            need = (ctx + n + BS - 1) // BS
            if used + need > NB:
                raise ValueError(f"page pool too small (NB={NB}) for T={T}")
            off = ctx + torch.arange(n)
            slots.append(perm[used:used + need][off // BS] * BS + off % BS)
            pos.append(torch.arange(start, start + n) % MAXPOS)
            used += need
        positions, slot_mapping = torch.cat(pos), torch.cat(slots)
    elif mode == "decode":
        if T > NB:
            raise ValueError(f"page pool too small (NB={NB}) for {T} decode tokens")
        positions = torch.randint(0, MAXPOS, (T,), generator=gen)
        slot_mapping = perm[:T] * BS + torch.randint(0, BS, (T,), generator=gen)
    else:
        raise ValueError(f"unknown mode {mode!r} (prefill, decode)")
    pad = str(workload.get("pad", "some"))
    if pad not in ("some", "many"):
        raise ValueError(f"unknown pad kind {pad!r} (some, many)")
    n_pad = max(1, T // 4) if pad == "many" else max(1, T // 50)
    slot_mapping[torch.randperm(T, generator=gen)[:min(T, n_pad)]] = -1
    if str(workload.get("edges", "")) == "positions":    # the first and the last position occur
        positions[0], positions[-1] = 0, MAXPOS - 1
    return positions.to(torch.int64), slot_mapping.to(torch.int64)


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T, Hq, Hkv, D, NB, BS, MAXPOS``; params ``dtype`` (``bfloat16``
            default; float16/float32 on the CPU smoke workloads), ``mode`` (``prefill`` or
            ``decode``, :func:`make_metadata`), ``pad`` and ``zero_tokens`` (bool: the padding
            tokens' qkv rows are all zero, as a padded batch holds, so eps decides their norm).
        seed: seed of the generators (metadata on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``qkv [T, (Hq + 2 Hkv) D]`` (gaussian; each head index has its own magnitude over
        1e-1 .. 1e1 and each channel a log-normal gain, so a norm over the wrong set of values
        is visible), ``q_norm_weight``/``k_norm_weight [D]`` (log-normal gains around 1),
        ``cos_sin_cache [MAXPOS, D]`` float32 (:func:`cos_sin_table`), ``positions [T]`` and
        ``slot_mapping [T]`` int64, ``key_cache``/``value_cache [NB, BS, Hkv, D]`` filled with
        finite random canaries (magnitudes 1e-2 .. 1e2), ``num_q_heads = Hq``, ``eps = 1e-6``.
    """
    T, Hq, Hkv, D, NB, BS, MAXPOS = (int(workload[a]) for a in ("T", "Hq", "Hkv", "D", "NB", "BS", "MAXPOS"))
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    positions, slot_mapping = make_metadata(workload, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    H = Hq + 2 * Hkv
    head_scale = 10.0 ** (2.0 * torch.rand(H, 1, generator=gen, device=device) - 1.0)
    chan = torch.exp(0.5 * torch.randn(H, D, generator=gen, device=device))
    qkv = torch.randn(T, H, D, generator=gen, device=device) * head_scale * chan
    if workload.get("zero_tokens", False):
        qkv[(slot_mapping < 0).to(device)] = 0.0
    q_w = torch.exp(0.4 * torch.randn(D, generator=gen, device=device))
    k_w = torch.exp(0.4 * torch.randn(D, generator=gen, device=device))

    def canaries():
        mag = 10.0 ** (4.0 * torch.rand(NB, BS, Hkv, 1, generator=gen, device=device) - 2.0)
        return (torch.randn(NB, BS, Hkv, D, generator=gen, device=device) * mag).to(dtype)

    return {
        "qkv": qkv.reshape(T, H * D).to(dtype).contiguous(),
        "q_norm_weight": q_w.to(dtype), "k_norm_weight": k_w.to(dtype),
        "cos_sin_cache": cos_sin_table(MAXPOS, D).to(device),
        "positions": positions.to(device), "slot_mapping": slot_mapping.to(device),
        "key_cache": canaries(), "value_cache": canaries(),
        "num_q_heads": Hq, "eps": EPS,
    }


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """float32 ``rope(x * rsqrt(mean(x^2) + eps) * weight)`` over the last axis (D) of ``x [T, H, D]``;
    ``cos``/``sin [T, 1, D/2]`` float32."""
    xf = x.float()
    n = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps) * weight.float()
    half = n.shape[-1] // 2
    n1, n2 = n[..., :half], n[..., half:]
    return torch.cat([n1 * cos - n2 * sin, n2 * cos + n1 * sin], dim=-1)


def store_rows(rows: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """``cache[slot // BS, slot % BS] = rows[t]`` for every token with ``slot >= 0``, without a host
    synchronisation: padding tokens rewrite the first valid token's slot with that token's own
    row (nothing is written when no token is valid)."""
    NB, BS, Hkv, D = cache.shape
    T = rows.shape[0]
    flat = cache.view(NB * BS, Hkv * D)
    valid = slot_mapping >= 0
    first = torch.argmax(valid.to(torch.int32))
    src = torch.where(valid, torch.arange(T, device=rows.device), first)
    dst = slot_mapping[src].clamp_min(0)
    new = rows.reshape(T, Hkv * D)[src]
    new = torch.where(valid.any(), new, flat[dst])
    flat.index_put_((dst,), new)


def run(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, cos_sin_cache: torch.Tensor,
        positions: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
        num_q_heads: int, eps: float) -> torch.Tensor:
    """Reference prologue (updates the caches in place).

    Args:
        qkv: ``[T, (Hq + 2 Hkv) D]`` bfloat16 (float16/float32 on smoke runs).
        q_norm_weight, k_norm_weight: ``[D]``, same dtype.
        cos_sin_cache: ``[MAXPOS, D]`` float32 (cos | sin).
        positions: ``[T]`` int64, each in ``[0, MAXPOS)``.
        key_cache, value_cache: ``[NB, BS, Hkv, D]``, qkv's dtype (NHD pages), written in place.
        slot_mapping: ``[T]`` int64, ``page * BS + offset`` or -1 (skip).
        num_q_heads: Hq.
        eps: RMSNorm epsilon.

    Returns:
        ``q_out [T, Hq, D]`` in qkv's dtype.
    """
    T = qkv.shape[0]
    Hkv, D = key_cache.shape[2], key_cache.shape[3]
    Hq = num_q_heads
    x = qkv.view(T, Hq + 2 * Hkv, D)
    cs = cos_sin_cache.index_select(0, positions)
    cos, sin = cs[:, None, :D // 2], cs[:, None, D // 2:]
    q_out = rms_norm_rope(x[:, :Hq], q_norm_weight, cos, sin, eps).to(qkv.dtype)
    k_out = rms_norm_rope(x[:, Hq:Hq + Hkv], k_norm_weight, cos, sin, eps).to(qkv.dtype)
    store_rows(k_out, key_cache, slot_mapping)
    store_rows(x[:, Hq + Hkv:], value_cache, slot_mapping)
    return q_out

