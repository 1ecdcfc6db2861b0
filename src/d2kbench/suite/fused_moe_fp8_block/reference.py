"""Fused MoE with DeepSeek-V3 block-scaled FP8 (W8A8): inputs and PyTorch reference.

The operator (a DeepSeek-V3 expert layer after routing). Weights are FP8 e4m3 with one FP32
scale per 128 x 128 block (``w[e, n, k] = w_q[e, n, k] * w_s[e, n // 128, k // 128]``);
activations are quantised per token in 1 x 128 groups at run time. For each token ``t`` and
each of its ``k`` routed experts ``e = topk_ids[t, j]`` with weight ``w = topk_weights[t, j]``:

    x_q, x_s = quant(x[t])                                 1 x 128 groups along H
    h   = sum_kb x_s[kb] * w13_s[e, n // 128, kb] * (x_q[kb] . w13_q[e, n, kb])    [2I] FP32
    a   = bf16( silu(h[:I]) * h[I:] )                      [I]  (FP32, rounded to bf16)
    a_q, a_s = quant(a)                                    1 x 128 groups along I
    y   = sum_kb a_s[kb] * w2_s[e, m // 128, kb] * (a_q[kb] . w2_q[e, m, kb])      [H] FP32
    out[t] = bf16( sum_j w * y )                           (FP32 combine)

``quant`` of a group ``v`` (128 FP32 values): ``s = max(max |v|, 1e-10) / 448``,
``q = float8_e4m3fn(clamp(v / s, -448, 448))`` (round to nearest even), the dequantised value
is ``q * s``. The block sums ``x_q[kb] . w_q[kb]`` are exact dot products of FP8 values: the
reference computes the whole layer in FP32 on the dequantised values (TF32 off), which equals
the block-wise formula up to FP32 rounding. Sources: DeepSeek-V3 ``inference/kernel.py``
(``act_quant``, ``fp8_gemm``) and vLLM ``fused_moe.py`` (``use_fp8_w8a8`` with
``block_shape [128, 128]``).

``make_inputs`` builds the weights as a checkpoint is built: Gaussian weights, each 128 x 128
block multiplied by its own log-uniform magnitude (a factor of 16 between blocks), quantised
per block (``s = amax / 448``). Routing: renormalised softmax top-k of random logits
(DeepSeek-V3's routing is task ``moe_grouped_topk``); skewed routing for the adversarial
workloads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_MAX = 448.0
EPS = 1e-10
#: Weight block and activation group size (DeepSeek-V3's weight_block_size [128, 128]).
BLOCK = 128


def quant_1x128(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic 1 x 128 group quantisation of ``v [M, K]`` (any float dtype; K % 128 == 0).

    Returns:
        ``(q [M, K] float8_e4m3fn, s [M, K / 128] float32)`` with ``s = max(amax, 1e-10) / 448``
        and ``q = e4m3(clamp(v / s, -448, 448))`` (round to nearest even).
    """
    M, K = v.shape
    g = v.float().view(M, K // BLOCK, BLOCK)
    s = g.abs().amax(dim=-1).clamp_min(EPS) / FP8_MAX
    q = (g / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(M, K), s


def dequant_1x128(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``q [M, K]`` FP8 and ``s [M, K / 128]`` -> FP32 ``q * s`` (group-wise)."""
    M, K = q.shape
    return (q.float().view(M, K // BLOCK, BLOCK) * s[..., None]).view(M, K)


def dequant_block(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """One expert's weight ``q [N, K]`` FP8 with block scales ``s [N / 128, K / 128]`` -> FP32."""
    N, K = q.shape
    return (q.float().view(N // BLOCK, BLOCK, K // BLOCK, BLOCK) * s[:, None, :, None]).view(N, K)


def _quant_weights(E: int, N: int, K: int, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint-like block-FP8 weights ``[E, N, K]`` and their scales ``[E, N/128, K/128]``.

    Gaussian weights of unit variance per input channel (std ``1 / sqrt(K * E[m^2])``), each
    128 x 128 block times a magnitude ``m = 2**U(-2, 2)`` (so a wrong block's scale is off by up
    to 16x), quantised per block with ``s = amax / 448``. One expert at a time (FP32 temporaries
    of one expert only).
    """
    q = torch.empty(E, N, K, dtype=torch.float8_e4m3fn, device=device)
    s = torch.empty(E, N // BLOCK, K // BLOCK, dtype=torch.float32, device=device)
    std = (K * 2.874) ** -0.5          # E[4**U] for U ~ U(-2, 2) is (16 - 1/16) / ln(256) = 2.874
    for e in range(E):
        mag = torch.exp2(torch.rand(N // BLOCK, K // BLOCK, generator=gen, device=device) * 4 - 2)
        w = torch.randn(N // BLOCK, BLOCK, K // BLOCK, BLOCK, generator=gen, device=device)
        w = w * (std * mag)[:, None, :, None]
        se = w.abs().amax(dim=(1, 3)).clamp_min(EPS) / FP8_MAX
        q[e] = (w / se[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(N, K)
        s[e] = se
    return q, s


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T`` (tokens), ``H`` (hidden size), ``I`` (expert intermediate size; H
            and I multiples of 128), ``E`` (experts), ``k`` (experts per token); params
            ``routing``: ``"softmax"`` (default: softmax top-k of Gaussian logits, renormalised)
            or ``"skewed"`` (Zipf-biased logits with ``empty`` experts, default ``E // 3``, never
            chosen); ``x``: ``"normal"`` (default: Gaussian rows with a log-normal per-token
            magnitude) or ``"outliers"`` (plus 1% of the channels at 30x in half of the
            tokens: 1 x 128 groups of very different scales within a row).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"x": [T, H] bf16, "w13": [E, 2I, H] e4m3, "w13_scale": [E, 2I/128, H/128] fp32,
        "w2": [E, H, I] e4m3, "w2_scale": [E, H/128, I/128] fp32, "topk_weights": [T, k] fp32,
        "topk_ids": [T, k] int32}``, all contiguous.
    """
    T, H, I, E, k = (int(workload[a]) for a in ("T", "H", "I", "E", "k"))
    if H % BLOCK or I % BLOCK:
        raise ValueError(f"H={H} and I={I} must be multiples of {BLOCK}")
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(T, H, generator=gen, device=device) * torch.exp(0.5 * torch.randn(T, 1, generator=gen, device=device))
    xv = workload.get("x", "normal")
    if xv == "outliers":
        ch = torch.randperm(H, generator=gen, device=device)[: max(1, H // 100)]
        rows = torch.rand(T, generator=gen, device=device) < 0.5
        x[:, ch] = torch.where(rows[:, None], 30.0 * x[:, ch], x[:, ch])
    elif xv != "normal":
        raise ValueError(f"unknown x variant {xv!r}")
    w13, w13_s = _quant_weights(E, 2 * I, H, gen, device)
    w2, w2_s = _quant_weights(E, H, I, gen, device)
    logits = torch.randn(T, E, generator=gen, device=device)
    routing = workload.get("routing", "softmax")
    if routing == "skewed":
        empty = int(workload.get("empty", E // 3))
        perm = torch.randperm(E, generator=gen, device=device)
        bias = torch.empty(E, device=device)
        bias[perm] = -1.5 * torch.log(torch.arange(1, E + 1, device=device, dtype=torch.float32))
        bias[perm[E - empty:]] = float("-inf")
        logits = logits + bias
    elif routing != "softmax":
        raise ValueError(f"unknown routing {routing!r}")
    w, ids = torch.softmax(logits, dim=-1).topk(k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return {"x": x.to(torch.bfloat16).contiguous(), "w13": w13, "w13_scale": w13_s, "w2": w2, "w2_scale": w2_s,
            "topk_weights": w.float().contiguous(), "topk_ids": ids.to(torch.int32).contiguous()}


def expert_groups(topk_ids: torch.Tensor, num_experts: int):
    """``(e, assignment indices a = t k + j routed to e)`` for every expert with tokens, in
    expert order (reads the counts on the host: not for CUDA graphs)."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)
    start = 0
    for e, c in enumerate(torch.bincount(flat, minlength=num_experts).tolist()):
        if c:
            yield e, order[start:start + c]
            start += c


def run(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Reference block-FP8 fused MoE: FP32 on dequantised values, one expert at a time.

    Args:
        x: ``[T, H]`` bf16. w13: ``[E, 2I, H]`` e4m3 (gate rows, then up rows); w13_scale:
        ``[E, 2I/128, H/128]`` fp32. w2: ``[E, H, I]`` e4m3; w2_scale: ``[E, H/128, I/128]``
        fp32. topk_weights: ``[T, k]`` fp32. topk_ids: ``[T, k]`` int32.

    Returns:
        ``[T, H]`` bf16, a new tensor. (Reads the per-expert token counts on the host: the
        reference is timed with CUDA events, never inside a graph.)
    """
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    k = topk_ids.shape[1]
    xq, xs = quant_1x128(x)
    xd = dequant_1x128(xq, xs)                                    # [T, H] FP32
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    for e, a_idx in expert_groups(topk_ids, E):
        tok = a_idx // k
        h = xd[tok] @ dequant_block(w13[e], w13_scale[e]).T      # [c, 2I] FP32
        a = (F.silu(h[:, :I]) * h[:, I:]).to(torch.bfloat16)
        aq, as_ = quant_1x128(a)
        y = dequant_1x128(aq, as_) @ dequant_block(w2[e], w2_scale[e]).T
        out.index_add_(0, tok, y * topk_weights.reshape(-1)[a_idx, None])
    return out.to(torch.bfloat16)
