"""Gated DeltaNet prefill over packed variable-length sequences with a recurrent-state pool:
inputs and the PyTorch reference (the token-by-token recurrence in float32).

The operator (the linear-attention layers of Qwen3-Next, as vLLM runs them in prefill). ``N``
sequences are packed along ``T`` (``cu_seqlens``); sequence ``i`` owns tokens
``[cu_seqlens[i], cu_seqlens[i + 1])`` and the state slot ``state_indices[i]`` of the pool.
Value head ``h`` reads key/query head ``h // (HV // HK)``. With the L2 normalisation inside the
operator (``x^ = x / sqrt(sum(x^2) + 1e-6)``, float32) and the state ``S`` (``K x V``, float32)::

    S   <- state_pool[state_indices[i], h]  if has_initial_state[i]  else 0
    for each token t of sequence i, in order:
        S    <- exp(g[t, h]) * S
        S    <- S + beta[t, h] * k^_t (v_t - S^T k^_t)^T          (the delta rule)
        o_t  =  scale * S^T q^_t
    state_pool[state_indices[i], h] <- S                         (in place)

Slots not named by ``state_indices`` keep their bits (canaries); a slot whose sequence has no
initial state holds NaN on entry and must not be read.

``run`` is that loop, all sequences in lockstep (one step per token position, sequences that
have ended keep their state), in float32 (products as elementwise multiply-and-sum: no TF32,
no BLAS threading); it reads the lengths on the host (it is trusted and timed by CUDA events,
not graphs).
"""

from __future__ import annotations

import math

import torch

#: epsilon of the in-operator L2 normalisation of q and k (flash-linear-attention's l2norm).
L2NORM_EPS = 1e-6
#: ``lens`` kinds of :func:`seq_lens`.
LENS_KINDS = ("equal", "skewed", "edge")
#: ``init`` kinds: which sequences continue from a state in the pool.
INIT_KINDS = ("all", "none", "some")


def seq_lens(workload: dict, seed: int) -> torch.Tensor:
    """Sequence lengths (int64, CPU, sum ``T``) of one call.

    ``equal``: ``T / N`` each; ``skewed``: a random partition of ``T`` (``N - 1`` distinct cut
    points, shuffled by the seed); ``edge``: lengths around the 64-token chunk (1, 63, 64, 65,
    127, 129, ...) with the remainder added to the last sequence.

    Raises:
        ValueError: an unknown kind, ``T`` not divisible for ``equal``, or ``T < N``.
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
        base = torch.tensor([1, 63, 64, 65, 127, 129, 2, 191, 17, 128])
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
        workload: axes ``T, N, HK, HV, K, V, NS`` and params ``dtype`` (``bfloat16`` default,
            ``float16`` on CPU smoke workloads), ``lens`` (:func:`seq_lens`), ``init``
            (``all``, ``none``, ``some``: about 60% of the sequences, at least one of each when
            N > 1) and ``decay`` (``mixed`` default; ``strong``: per-token log decays down to
            about -20, so in-chunk cumulative gates reach -1000).
        seed: seed of the generators (lengths and slots on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``q``/``k [T, HK, K]``, ``v [T, HV, V]`` (N(0, 1), un-normalised), ``g [T, HV]`` float32
        (``-A_h softplus(a + dt_bias_h)`` with ``A_h ~ U(1, 16)``, ``a ~ N(0, 1)``, ``dt_bias_h``
        the inverse softplus of a log-uniform value in [1e-3, 1e-1]: per-head memories from
        a few tokens to thousands), ``beta [T, HV]`` (sigmoid of N(0, 1)), ``cu_seqlens [N + 1]``
        int32, ``state_pool [NS, HV, K, V]`` float32 (N(0, 0.1) canaries; NaN in the slots of
        sequences without an initial state), ``state_indices [N]`` int32 (distinct random slots),
        ``has_initial_state [N]`` bool, ``scale = K ** -0.5``.

    Raises:
        ValueError: unknown parameters, HV not a multiple of HK, or a pool smaller than N.
    """
    T, N, HK, HV, K, V, NS = (int(workload[a]) for a in ("T", "N", "HK", "HV", "K", "V", "NS"))
    if HV % HK:
        raise ValueError(f"HV={HV} is not a multiple of HK={HK}")
    if NS < N:
        raise ValueError(f"the pool has NS={NS} slots for N={N} sequences")
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    init = str(workload.get("init", "some"))
    decay = str(workload.get("decay", "mixed"))
    if init not in INIT_KINDS:
        raise ValueError(f"unknown init kind {init!r} ({', '.join(INIT_KINDS)})")
    if decay not in ("mixed", "strong"):
        raise ValueError(f"unknown decay kind {decay!r} (mixed, strong)")
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
    q = torch.randn((T, HK, K), generator=gen, device=device).to(dtype)
    k = torch.randn((T, HK, K), generator=gen, device=device).to(dtype)
    v = torch.randn((T, HV, V), generator=gen, device=device).to(dtype)
    if decay == "mixed":
        A = 1.0 + 15.0 * torch.rand(HV, generator=gen, device=device)
        sp = 10.0 ** (-3.0 + 2.0 * torch.rand(HV, generator=gen, device=device))
    else:
        A = 8.0 + 8.0 * torch.rand(HV, generator=gen, device=device)
        sp = 10.0 ** (-1.0 + 1.0 * torch.rand(HV, generator=gen, device=device))
    dt_bias = torch.log(torch.expm1(sp))
    a = torch.randn((T, HV), generator=gen, device=device)
    g = (-A * torch.nn.functional.softplus(a + dt_bias)).float().contiguous()
    beta = torch.sigmoid(torch.randn((T, HV), generator=gen, device=device)).to(dtype)
    pool = 0.1 * torch.randn((NS, HV, K, V), generator=gen, device=device)
    slots_d = slots.to(device)
    pool[slots_d[~has_init.to(device)]] = float("nan")
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": cu.to(device),
            "state_pool": pool, "state_indices": slots.to(torch.int32).to(device),
            "has_initial_state": has_init.to(device), "scale": 1.0 / math.sqrt(K)}


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last dimension, in float32."""
    x = x.float()
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + L2NORM_EPS)


def _recurrence(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state, scale,
                compute: torch.dtype) -> torch.Tensor:
    T, HK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    rep = HV // HK
    N = state_indices.shape[0]
    qn = l2norm(q).to(compute).repeat_interleave(rep, dim=1)          # [T, HV, K]
    kn = l2norm(k).to(compute).repeat_interleave(rep, dim=1)
    vf, gf, bf = v.to(compute), g.to(compute), beta.to(compute)
    starts = cu_seqlens[:-1].long()
    lens = cu_seqlens[1:].long() - starts
    slots = state_indices.long()
    S = torch.where(has_initial_state[:, None, None, None], state_pool[slots].to(compute), 0.0)   # [N, HV, K, V]
    out = torch.zeros((T + 1, HV, V), dtype=compute, device=q.device)  # row T: where ended sequences write
    steps = int(lens.max()) if N else 0                                # host read: the reference is trusted
    for t in range(steps):
        active = t < lens
        tok = torch.where(active, starts + t, T)
        src = tok.clamp(max=T - 1)
        S_new = S * torch.exp(gf[src])[:, :, None, None]
        kt = kn[src]                                                   # [N, HV, K]
        kv = (S_new * kt[:, :, :, None]).sum(-2)                       # S^T k  [N, HV, V]
        delta = (vf[src] - kv) * bf[src][:, :, None]
        S_new = S_new + kt[:, :, :, None] * delta[:, :, None, :]
        out[tok] = (S_new * qn[src][:, :, :, None]).sum(-2) * scale
        S = torch.where(active[:, None, None, None], S_new, S)
    state_pool[slots] = S.to(state_pool.dtype)
    return out[:T].to(v.dtype)


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
        cu_seqlens: torch.Tensor, state_pool: torch.Tensor, state_indices: torch.Tensor,
        has_initial_state: torch.Tensor, scale: float) -> torch.Tensor:
    """Reference Gated DeltaNet prefill (token by token, float32; updates ``state_pool``).

    Args:
        q, k: ``[T, HK, K]`` bf16 (fp16 on smoke workloads), un-normalised.
        v: ``[T, HV, V]``, q's dtype.
        g: ``[T, HV]`` float32 log decays (<= 0).
        beta: ``[T, HV]``, q's dtype, in (0, 1).
        cu_seqlens: ``[N + 1]`` int32 token offsets of the packed sequences.
        state_pool: ``[NS, HV, K, V]`` float32, read at the slots of sequences with an initial
            state and overwritten at every slot in ``state_indices`` with the final state.
        state_indices: ``[N]`` int32 distinct slots.
        has_initial_state: ``[N]`` bool.
        scale: output scale (``K ** -0.5``).

    Returns:
        ``o [T, HV, V]`` in v's dtype (a new tensor).
    """
    with torch.no_grad():
        return _recurrence(q, k, v, g, beta, cu_seqlens, state_pool, state_indices, has_initial_state,
                           scale, torch.float32)
