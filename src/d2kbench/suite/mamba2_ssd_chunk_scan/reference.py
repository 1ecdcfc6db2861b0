"""Mamba2 SSD scan over packed variable-length sequences with a recurrent-state pool: inputs and
the PyTorch reference (the sequential scan in float32).

The operator (the selective state-space part of a Mamba2 mixer in prefill, as vLLM's
``MambaMixer2`` runs it: after the input projection and the causal conv, before the gated
RMSNorm). ``N`` sequences are packed along ``T`` (``cu_seqlens``); sequence ``i`` owns tokens
``[cu_seqlens[i], cu_seqlens[i + 1])`` and the pool slot ``state_indices[i]``. Head ``h`` belongs
to group ``h // (H / G)`` (its B and C). With ``dt'_t = softplus(dt[t, h] + dt_bias[h])``
(float32, PyTorch's softplus: the identity above 20) and a state ``S`` of ``P x DS`` per
(sequence, head)::

    S    <- state_pool[state_indices[i], h]  if has_initial_state[i]  else 0
    for each token t of sequence i, in order:
        S    <- exp(dt'_t A[h]) S + dt'_t x[t, h] B[t, g]^T
        y[t, h] = S C[t, g] + D[h] x[t, h]
    state_pool[state_indices[i], h] <- S                          (in place)

Slots not named by ``state_indices`` keep their bits (canaries); a slot whose sequence has no
initial state holds NaN on entry. ``chunk_size`` is the model's SSD chunk length: a scheduling
hint that does not change the result.

``run`` is that loop, all sequences in lockstep (one step per token position; sequences that
have ended keep their state), float32 elementwise products (no TF32, no BLAS threading); it
reads the lengths on the host (it is trusted and timed by CUDA events, not graphs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: ``lens`` kinds (see :func:`seq_lens`); ``init`` kinds.
LENS_KINDS = ("equal", "skewed", "edge")
INIT_KINDS = ("all", "none", "some")


def seq_lens(workload: dict, seed: int) -> torch.Tensor:
    """Sequence lengths (int64, CPU, sum ``T``): ``equal`` (``T / N`` each), ``skewed`` (a random
    partition of ``T``), ``edge`` (1, 2, 17, 63, 64, 65, 127-129, 191, 255-257, the remainder on
    the last sequence), shuffled by the seed.

    Raises:
        ValueError: an unknown kind, ``T`` not divisible for ``equal``, or too few tokens.
    """
    T, N = int(workload["T"]), int(workload["N"])
    kind = str(workload.get("lens", "equal"))
    if N > T:
        raise ValueError(f"N={N} sequences cannot share T={T} tokens")
    gen = torch.Generator().manual_seed(seed)
    if kind == "equal":
        if T % N:
            raise ValueError(f"lens=equal needs T={T} divisible by N={N}")
        return torch.full((N,), T // N, dtype=torch.int64)
    if kind == "skewed":
        cuts = torch.randperm(T - 1, generator=gen)[: N - 1] + 1
        edges = torch.cat([torch.zeros(1, dtype=torch.int64), cuts.sort().values, torch.tensor([T])])
        return edges.diff()
    if kind == "edge":
        base = torch.tensor([1, 63, 64, 65, 127, 129, 2, 255, 257, 17, 128, 191, 256])
        lens = base[torch.arange(N) % len(base)].clone()
        rest = T - int(lens.sum())
        if rest < 0:
            raise ValueError(f"lens=edge needs T >= {int(lens.sum())} for N={N}")
        lens[-1] += rest
        return lens[torch.randperm(N, generator=gen)]
    raise ValueError(f"unknown lens kind {kind!r} ({', '.join(LENS_KINDS)})")


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T, N, H, P, G, DS, NS, Q`` and params ``dtype`` (``bfloat16`` default,
            ``float16`` on CPU smoke workloads), ``lens`` (:func:`seq_lens`), ``init`` (``all``,
            ``none``, ``some``: about 60%, at least one of each when N > 1) and ``dt`` (``mixed``
            default; ``extreme``: raw dt spread over N(0, 3), so dt' runs from 1e-5 to 10 and
            per-token log decays reach -160).
        seed: seed of the generators (lengths and slots on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``x [T, H, P]``, ``B``/``C [T, G, DS]`` (N(0, 1)), ``dt [T, H]`` raw (N(0, 1)), ``dt_bias [H]``
        float32 (inverse softplus of log-uniform [1e-3, 1e-1]), ``A [H]`` float32 in [-16, -1],
        ``D [H]`` float32 N(0, 1), ``cu_seqlens [N + 1]`` int32, ``state_pool [NS, H, P, DS]``
        float32 (N(0, 0.1) canaries, NaN in the slots of sequences without an initial state),
        ``state_indices [N]`` int32, ``has_initial_state [N]`` bool, ``chunk_size = Q``.

    Raises:
        ValueError: unknown parameters, H not a multiple of G, or a pool smaller than N.
    """
    T, N, H, P, G, DS, NS, Q = (int(workload[a]) for a in ("T", "N", "H", "P", "G", "DS", "NS", "Q"))
    if H % G:
        raise ValueError(f"H={H} is not a multiple of G={G}")
    if NS < N:
        raise ValueError(f"the pool has NS={NS} slots for N={N} sequences")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    init = str(workload.get("init", "some"))
    spread = {"mixed": 1.0, "extreme": 3.0}.get(str(workload.get("dt", "mixed")))
    if init not in INIT_KINDS or spread is None:
        raise ValueError(f"unknown init {init!r} or dt {workload.get('dt')!r} kind")
    lens = seq_lens(workload, seed)
    cpu = torch.Generator().manual_seed(seed + 1)
    slots = torch.randperm(NS, generator=cpu)[:N]
    if init == "all":
        has_init = torch.ones(N, dtype=torch.bool)
    elif init == "none":
        has_init = torch.zeros(N, dtype=torch.bool)
    else:
        has_init = torch.rand(N, generator=cpu) < 0.6
        if N > 1:
            has_init[torch.randperm(N, generator=cpu)[:2]] = torch.tensor([True, False])
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn((T, H, P), generator=gen, device=device).to(dtype)
    B = torch.randn((T, G, DS), generator=gen, device=device).to(dtype)
    C = torch.randn((T, G, DS), generator=gen, device=device).to(dtype)
    dt = (spread * torch.randn((T, H), generator=gen, device=device)).to(dtype)
    sp = 10.0 ** (-3.0 + 2.0 * torch.rand(H, generator=gen, device=device))
    dt_bias = torch.log(torch.expm1(sp)).float()
    A = -(1.0 + 15.0 * torch.rand(H, generator=gen, device=device)).float()
    D = torch.randn(H, generator=gen, device=device).float()
    pool = 0.1 * torch.randn((NS, H, P, DS), generator=gen, device=device)
    pool[slots.to(device)[~has_init.to(device)]] = float("nan")
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
    return {"x": x, "dt": dt, "dt_bias": dt_bias, "A": A, "B": B, "C": C, "D": D, "cu_seqlens": cu.to(device),
            "state_pool": pool, "state_indices": slots.to(torch.int32).to(device),
            "has_initial_state": has_init.to(device), "chunk_size": Q}


def _scan(x, dt, dt_bias, A, B, C, D, cu_seqlens, state_pool, state_indices, has_initial_state, compute):
    T, H, P = x.shape
    G = B.shape[1]
    heads = torch.arange(H, device=x.device) // (H // G)
    dtp = F.softplus(dt.to(compute) + dt_bias.to(compute))               # [T, H]
    decay = torch.exp(dtp * A.to(compute))
    xf = x.to(compute)
    Bh, Ch = B.to(compute)[:, heads], C.to(compute)[:, heads]           # [T, H, DS]
    starts = cu_seqlens[:-1].long()
    lens = cu_seqlens[1:].long() - starts
    slots = state_indices.long()
    S = torch.where(has_initial_state[:, None, None, None], state_pool[slots].to(compute), 0.0)  # [N, H, P, DS]
    y = torch.zeros((T + 1, H, P), dtype=compute, device=x.device)       # row T: where ended sequences write
    steps = int(lens.max()) if len(lens) else 0                          # host read: the reference is trusted
    for t in range(steps):
        active = t < lens
        tok = torch.where(active, starts + t, T)
        src = tok.clamp(max=T - 1)
        S_new = S * decay[src][:, :, None, None] + (dtp[src][:, :, None] * xf[src])[:, :, :, None] * Bh[src][:, :, None, :]
        y[tok] = (S_new * Ch[src][:, :, None, :]).sum(-1) + D.to(compute)[None, :, None] * xf[src]
        S = torch.where(active[:, None, None, None], S_new, S)
    state_pool[slots] = S.to(state_pool.dtype)
    return y[:T].to(x.dtype)


def run(x: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
        C: torch.Tensor, D: torch.Tensor, cu_seqlens: torch.Tensor, state_pool: torch.Tensor,
        state_indices: torch.Tensor, has_initial_state: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Reference Mamba2 SSD scan (token by token, float32; updates ``state_pool``).

    Args:
        x: ``[T, H, P]`` bf16 (fp16 on smoke workloads).
        dt: ``[T, H]`` raw time steps, x's dtype.
        dt_bias, A, D: ``[H]`` float32 (A < 0).
        B, C: ``[T, G, DS]``, x's dtype.
        cu_seqlens: ``[N + 1]`` int32 token offsets of the packed sequences.
        state_pool: ``[NS, H, P, DS]`` float32, read at the slots of sequences with an initial
            state, overwritten at every slot in ``state_indices``.
        state_indices: ``[N]`` int32 distinct slots; has_initial_state: ``[N]`` bool.
        chunk_size: the model's chunk length (unused by the sequential scan).

    Returns:
        ``y [T, H, P]`` in x's dtype (a new tensor).
    """
    with torch.no_grad():
        return _scan(x, dt, dt_bias, A, B, C, D, cu_seqlens, state_pool, state_indices, has_initial_state,
                     torch.float32)
