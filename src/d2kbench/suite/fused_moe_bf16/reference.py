"""Fused MoE (BF16): inputs and PyTorch reference.

The operator (a Mixtral / Qwen3-MoE expert layer after routing). For each token ``t`` and
each of its ``k`` routed experts ``e = topk_ids[t, j]`` with weight ``w = topk_weights[t, j]``:

    h      = x[t] @ w13[e]^T                      [2I]  (w13 = [W_gate; W_up] stacked: [E, 2I, H])
    a      = act_dtype( silu(h[:I]) * h[I:] )     [I]   (computed in FP32, rounded to x's dtype)
    y      = a @ w2[e]^T                          [H]   (w2: [E, H, I])
    out[t] = sum_j  w * y                               (accumulated in FP32, rounded to x's dtype)

``x`` and the weights are bf16 on the registered workloads (float16 on the CPU smoke
workloads: the Triton CPU interpreter has no bf16 arithmetic). GEMMs take the 16-bit operands
and accumulate in FP32; the reference keeps ``h`` and ``y`` in FP32 (on the GPU through
``torch.mm(..., out_dtype=float32)``, so that no cuBLAS reduced-precision split-K reduction
enters the expected values). Implementations may round ``h`` and ``y`` to the input dtype as
vLLM and SGLang do; the tolerance covers both.

The reference runs every expert densely on all tokens and masks with the combine weight (the
route matrix ``R[t, e] = sum_j w [topk_ids[t, j] == e]``): static shapes and no host
synchronisation, so that it can be captured in a CUDA graph. It is a semantic baseline, not
an efficient one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Whether this torch build has the 16-bit x 16-bit -> FP32 ``torch.mm(..., out_dtype=...)`` on CUDA
#: (decided once, on the first GPU call: never inside a CUDA-graph capture of a later call).
_MM_OUT_DTYPE: bool | None = None


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` for 16-bit ``a [M, K]``, ``b [N, K]``: FP32 accumulation and FP32 output."""
    global _MM_OUT_DTYPE
    if a.is_cuda and _MM_OUT_DTYPE is not False:
        try:
            out = torch.mm(a, b.T, out_dtype=torch.float32)
            _MM_OUT_DTYPE = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_OUT_DTYPE = False
    return a.float() @ b.float().T  # TF32 is off by default: a true FP32 product


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``T`` (tokens), ``H`` (hidden size), ``I`` (expert intermediate size),
            ``E`` (experts), ``k`` (experts per token); params ``dtype`` (``"bfloat16"``
            default, ``"float16"`` for CPU smoke runs) and ``routing``: ``"softmax"``
            (default: softmax of Gaussian router logits, top-k, renormalised to sum 1 as
            Qwen3-MoE's norm_topk_prob and Mixtral do) or ``"skewed"`` (Zipf-biased logits with
            ``empty`` experts, default ``E // 3``, never chosen).
        seed: seed of a ``torch.Generator`` on ``device``.
        device: where the tensors are created.

    Returns:
        ``{"x": [T, H], "w13": [E, 2I, H], "w2": [E, H, I]`` (dtype as above, contiguous,
        weights scaled by 1/sqrt(fan_in) so that activations stay O(1)),
        ``"topk_weights": [T, k] float32, "topk_ids": [T, k] int32}``.
    """
    T, H, I, E, k = (int(workload[a]) for a in ("T", "H", "I", "E", "k"))
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    routing = workload.get("routing", "softmax")
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(T, H, generator=gen, device=device).to(dtype)
    w13 = (torch.randn(E, 2 * I, H, generator=gen, device=device) * H ** -0.5).to(dtype)
    w2 = (torch.randn(E, H, I, generator=gen, device=device) * I ** -0.5).to(dtype)
    logits = torch.randn(T, E, generator=gen, device=device)
    if routing == "skewed":
        empty = int(workload.get("empty", E // 3))
        perm = torch.randperm(E, generator=gen, device=device)
        bias = torch.empty(E, device=device)
        bias[perm] = -1.5 * torch.log(torch.arange(1, E + 1, device=device, dtype=torch.float32))
        bias[perm[E - empty:]] = float("-inf")
        logits = logits + bias
    elif routing != "softmax":
        raise ValueError(f"unknown routing {routing!r}")
    probs = torch.softmax(logits, dim=-1)
    w, ids = probs.topk(k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return {"x": x.contiguous(), "w13": w13.contiguous(), "w2": w2.contiguous(),
            "topk_weights": w.to(torch.float32).contiguous(), "topk_ids": ids.to(torch.int32).contiguous()}


def run(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
        topk_ids: torch.Tensor) -> torch.Tensor:
    """Reference fused MoE (dense over experts, masked by the route weights).

    Args:
        x: ``[T, H]`` bf16 (or fp16). w13: ``[E, 2I, H]`` (gate rows first, then up rows).
        w2: ``[E, H, I]``. topk_weights: ``[T, k]`` float32. topk_ids: ``[T, k]`` int32.

    Returns:
        ``[T, H]`` in x's dtype, a new tensor.
    """
    T, H = x.shape
    E, I2, _ = w13.shape
    I = I2 // 2
    route = torch.zeros(T, E, dtype=torch.float32, device=x.device)
    route.scatter_add_(1, topk_ids.to(torch.int64), topk_weights.to(torch.float32))
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    for e in range(E):
        h = _mm_f32(x, w13[e])
        a = (F.silu(h[:, :I]) * h[:, I:]).to(x.dtype)
        out += route[:, e:e + 1] * _mm_f32(a, w2[e])
    return out.to(x.dtype)
