"""Multi-LoRA shrink and expand (punica SGMV / BGMV): inputs and the PyTorch reference.

The operator (the LoRA path of one sliced projection of a multi-adapter serving batch, as in
vLLM's ``lora_shrink`` / ``lora_expand`` and S-LoRA / punica). ``x [T, K]`` are the layer's
input rows, ``y [T, N]`` the base layer's output, whose ``N`` columns are ``S`` slices
(q | k | v, or gate | up) at ``slice_offsets [S + 1]``. Token ``t`` uses adapter
``l = token_lora_mapping[t]`` (``-1``: no adapter). For every token with ``l >= 0``, every slice
``s`` and every column ``n`` of that slice (``slice_offsets[s] <= n < slice_offsets[s + 1]``)::

    h[s, t, :] = x[t, :] @ lora_a[s, l, :, :]^T                          (shrink, rank R, FP32)
    y[t, n]    = dtype( float32(y[t, n]) + scale * (h[s, t, :] @ lora_b[l, n, :]) )

``scale`` is the LoRA scaling alpha / r (one value for the call, as in punica and vLLM).

in place (the expand adds into y: the base output is kept). Rows of tokens with ``l = -1``
are left bit-identical. The reference keeps ``h`` in FP32 (no TF32); implementations may round
``h`` to the weights' dtype before the expand product, as vLLM's Triton expand does.

The reference is a semantic baseline: for every adapter it multiplies every token densely and
selects that adapter's rows with a mask (static shapes, no host synchronisation, so that it can
be captured in a CUDA graph), then one read-modify-write of y.
"""

from __future__ import annotations

import torch

#: Fraction of the tokens of a registered workload that use no adapter (exactly T // 16 tokens).
NO_ADAPTER_DIV = 16


def parse_slices(spec: str | int, N: int) -> list[int]:
    """The slice widths of a workload's ``slices`` parameter (``"4096,1024,1024"``; one int for a
    single slice).

    Raises:
        ValueError: the widths do not sum to ``N`` or one is < 1.
    """
    widths = [int(v) for v in str(spec).split(",")]
    if sum(widths) != N or min(widths) < 1:
        raise ValueError(f"slices {spec!r} must be widths >= 1 that sum to N = {N}")
    return widths


def _segments(T: int, gen: torch.Generator) -> list[int]:
    """Lengths of the requests of a prefill batch of T tokens (T/32 .. T/6 each, unaligned)."""
    out, t = [], 0
    while t < T:
        n = min(T - t, int(torch.randint(max(1, T // 32), max(2, T // 6) + 1, (1,), generator=gen)))
        out.append(n)
        t += n
    return out


def make_mapping(workload: dict, seed: int) -> torch.Tensor:
    """``token_lora_mapping [T]`` int32 on the CPU (the metadata part of :func:`make_inputs`).

    ``mapping``:
      * ``segmented``: requests of 1/32 .. 1/6 of the batch (boundaries at no tile multiple),
        each with one adapter drawn at random (an adapter may own several non-adjacent
        requests); one request of ``T // 16`` tokens uses no adapter (-1).
      * ``random``: decode, one adapter drawn per token; ``T // 16`` random tokens use none.
      * ``single``: every token uses adapter ``L - 1`` (one adapter for the whole batch).
      * ``none``: no token uses an adapter (every row of y must stay bit-identical).
    ``segmented`` and ``random`` use every adapter at least once (the SOL counts every adapter's
    weights), unless ``empty`` (int) adapters are left without tokens; ``pad: quarter`` makes a
    quarter of the tokens adapter-less; ``singleton: true`` gives adapter 0 exactly one token
    (``empty`` then counts the other adapters without tokens).

    Raises:
        ValueError: an unknown mapping kind, or too few tokens to use every adapter.
    """
    T, L = int(workload["T"]), int(workload["L"])
    kind = str(workload.get("mapping", "random"))
    gen = torch.Generator().manual_seed(seed)
    if kind == "none":
        return torch.full((T,), -1, dtype=torch.int32)
    if kind == "single":
        return torch.full((T,), L - 1, dtype=torch.int32)
    n_pad = T // 4 if str(workload.get("pad", "some")) == "quarter" else T // NO_ADAPTER_DIV
    empty = int(workload.get("empty", 0))
    singleton = bool(workload.get("singleton", False))
    first = int(singleton)                                        # adapter 0 is the singleton's
    used = first + torch.randperm(L - first, generator=gen)[:L - first - empty]   # adapters with tokens
    if T - n_pad - int(singleton) < used.numel():
        raise ValueError(f"T = {T} too small to use {used.numel()} adapters")
    if kind == "random":
        m = used[torch.randint(0, used.numel(), (T,), generator=gen)]
        perm = torch.randperm(T, generator=gen)
        m[perm[:used.numel()]] = used                               # every used adapter appears
        m[perm[used.numel():used.numel() + n_pad]] = -1
        if singleton:
            m[perm[used.numel() + n_pad]] = 0
    elif kind == "segmented":
        m = torch.empty(T, dtype=torch.int64)
        segs = _segments(T - n_pad, gen)
        while len(segs) < used.numel():                              # one request per used adapter at least
            i = max(range(len(segs)), key=lambda j: segs[j])
            segs[i:i + 1] = [segs[i] // 2, segs[i] - segs[i] // 2]
        owners = torch.cat([used, used[torch.randint(0, used.numel(), (len(segs) - used.numel(),), generator=gen)]])
        owners = owners[torch.randperm(len(segs), generator=gen)]
        pad_at = int(torch.randint(0, len(segs) + 1, (1,), generator=gen))
        t = 0
        for i, (n, o) in enumerate(zip(segs, owners.tolist())):
            if i == pad_at:
                m[t:t + n_pad] = -1
                t += n_pad
            m[t:t + n] = o
            t += n
        if pad_at == len(segs):
            m[t:t + n_pad] = -1
        if singleton:
            m[int(torch.randint(0, T, (1,), generator=gen))] = 0
    else:
        raise ValueError(f"unknown mapping {kind!r} (segmented, random, single, none)")
    return m.to(torch.int32)


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T`` (tokens), ``K`` (input features), ``N`` (output features, all
            slices), ``R`` (LoRA rank), ``L`` (adapters loaded), ``S`` (slices); params
            ``slices`` (the slice widths, :func:`parse_slices`), ``mapping`` and its options
            (:func:`make_mapping`), ``dtype`` (``bfloat16`` default; float16/float32 on the CPU).
        seed: seed of the generators (the mapping on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``x [T, K]`` (standard normal), ``y [T, N]`` (standard normal: the base output),
        ``lora_a [S, L, R, K]`` (scaled by 1/sqrt(K), so h is O(1)), ``lora_b [L, N, R]``
        (scaled by 1/sqrt(R), so the expand is O(1) too: a wrong delta is visible against the
        base), ``slice_offsets [S + 1]`` int32, ``token_lora_mapping [T]`` int32, ``scale``
        (the workload's ``scale`` parameter, alpha / r, default 2.0; never 1, so a dropped
        scaling is visible).
    """
    T, K, N, R, L, S = (int(workload[a]) for a in ("T", "K", "N", "R", "L", "S"))
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    widths = parse_slices(workload.get("slices", N), N)
    if len(widths) != S:
        raise ValueError(f"slices {widths} are not S = {S} slices")
    mapping = make_mapping(workload, seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(T, K, generator=gen, device=device)
    y = torch.randn(T, N, generator=gen, device=device)
    a = torch.randn(S, L, R, K, generator=gen, device=device) * K ** -0.5
    b = torch.randn(L, N, R, generator=gen, device=device) * R ** -0.5
    offsets = torch.tensor([0, *torch.tensor(widths).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "x": x.to(dtype).contiguous(), "y": y.to(dtype).contiguous(),
        "lora_a": a.to(dtype).contiguous(), "lora_b": b.to(dtype).contiguous(),
        "slice_offsets": offsets.to(device), "token_lora_mapping": mapping.to(device),
        "scale": float(workload.get("scale", 2.0)),
    }


def lora_delta(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slice_offsets: torch.Tensor,
               token_lora_mapping: torch.Tensor, scale: float,
               round_h: torch.dtype | None = None) -> torch.Tensor:
    """The FP32 LoRA update ``[T, N]`` (zero rows for tokens without an adapter).

    ``round_h``: round the shrink output ``h`` to this dtype before the expand (the accepted
    vLLM variant; None keeps FP32). Dense over adapters and masked (no host synchronisation):
    ``T R L (S K + S N)`` multiply-adds in FP32 (each slice's product over all N columns,
    masked to the slice's own).
    """
    T = x.shape[0]
    S, L, R, K = lora_a.shape
    N = lora_b.shape[1]
    cols = torch.arange(N, device=x.device)
    col_slice = (cols[:, None] >= slice_offsets[1:].to(cols.dtype)[None, :]).sum(1)     # [N] slice of column
    xf = x.float()
    delta = torch.zeros(T, N, dtype=torch.float32, device=x.device)
    for l in range(L):
        h = torch.einsum("tk,srk->str", xf, lora_a[:, l].float())                     # [S, T, R]
        if round_h is not None:
            h = h.to(round_h).float()
        d = torch.zeros(T, N, dtype=torch.float32, device=x.device)
        for s in range(S):                                                             # each slice's columns
            d += (h[s] @ lora_b[l].float().T) * (col_slice == s).to(torch.float32)[None, :]
        delta += ((token_lora_mapping == l).to(torch.float32) * scale)[:, None] * d
    return delta


def run(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, slice_offsets: torch.Tensor,
        token_lora_mapping: torch.Tensor, scale: float) -> None:
    """Reference multi-LoRA shrink + expand, adding into ``y`` in place.

    Args:
        x: ``[T, K]`` bfloat16 (float16/float32 on smoke runs).
        y: ``[T, N]`` same dtype, updated in place; rows of tokens without an adapter unchanged.
        lora_a: ``[S, L, R, K]`` same dtype (each slice's A of each adapter, K-contiguous).
        lora_b: ``[L, N, R]`` same dtype (B of every slice, concatenated along N in y's column order).
        slice_offsets: ``[S + 1]`` int32, ``0 = o_0 < o_1 < ... < o_S = N``.
        token_lora_mapping: ``[T]`` int32 in ``[-1, L)``.
        scale: the LoRA scaling (alpha / r).

    Returns:
        None (in place).
    """
    delta = lora_delta(x, lora_a, lora_b, slice_offsets, token_lora_mapping, scale)
    keep = (token_lora_mapping < 0)[:, None]
    y.copy_(torch.where(keep, y, (y.float() + delta).to(y.dtype)))
