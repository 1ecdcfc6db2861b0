"""Fused linear cross-entropy (the LM head of a training step, forward and backward): inputs and
the PyTorch reference.

The operator. Hidden states ``x [BT, H]``, the LM-head weight ``W [V, H]`` and the next-token
labels ``y [BT]`` (``ignore_index`` marks tokens that do not count: padding, prompt tokens of an
SFT batch). With ``s = x W^T`` (the logits, ``[BT, V]``), the valid tokens ``T = {t : y_t !=
ignore_index}`` and ``N = |T|``::

    loss = (1 / N) sum_{t in T} (logsumexp_v s[t, v] - s[t, y_t])
    P    = (softmax(s) - onehot(y)) / N      on the rows of T, 0 on the other rows
    dX   = P W            [BT, H]   (x's dtype)
    dW   = P^T x          [V, H]    (float32)

``dX`` and ``dW`` are the gradients of ``loss`` (upstream gradient 1). The reference computes
everything in float32 from the 16-bit inputs (TF32 off): the logits, the softmax, the two
gradient products. It materialises the whole ``[BT, V]`` logits (gigabytes at the registered
shapes) and serves correctness only; a solution must not.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100
#: Target spread of the logits of a random token (their standard deviation), about what LM
#: heads of trained models show.
LOGIT_STD = 3.0


def make_labels(workload: dict, seed: int) -> torch.Tensor:
    """The CPU part of :func:`make_inputs`: ``[BT]`` int64 labels.

    Tokens follow a Zipf-like law over a random ranking of the vocabulary (a few tokens are
    frequent, most are rare); ``ignored`` is the fraction of ignore_index tokens (default 0.1,
    at random positions; ``mask: spans`` puts them in contiguous runs, as the prompt tokens of
    an SFT batch). At least one token is valid.
    """
    BT, V = int(workload["BT"]), int(workload["V"])
    gen = torch.Generator().manual_seed(seed)
    rank_p = 1.0 / (torch.arange(V, dtype=torch.float64) + 10.0)
    ranks = torch.multinomial(rank_p, BT, replacement=True, generator=gen)
    labels = torch.randperm(V, generator=gen)[ranks]
    frac = float(workload.get("ignored", 0.1))
    if str(workload.get("mask", "random")) == "spans":
        ignore = torch.zeros(BT, dtype=torch.bool)
        t = 0
        while t < BT:                                   # prompt span, then answer span
            p = int(torch.randint(1, 64, (1,), generator=gen) * frac / max(1e-9, 1 - frac)) + 1
            a = int(torch.randint(1, 64, (1,), generator=gen))
            ignore[t:t + p] = True
            t += p + a
    else:
        ignore = torch.rand(BT, generator=gen) < frac
    ignore[int(torch.randint(0, BT, (1,), generator=gen))] = False
    return torch.where(ignore, torch.full_like(labels, IGNORE_INDEX), labels)


def make_inputs(workload: dict, seed: int, device: str | torch.device) -> dict:
    """Draw the inputs of one call.

    Args:
        workload: axes ``BT, H, V``; params ``dtype`` (``bfloat16`` default; float16 on the CPU
            smoke workloads), ``ignored`` and ``mask`` (:func:`make_labels`) and ``variant``:
            ``normal`` or ``large_logits`` (a tenth of the rows, rounded up, scaled by 10: logits past 88, where
            exp overflows in float32 without the max subtraction).
        seed: seed of the generators (labels on the CPU, tensors on ``device``).
        device: where the tensors are created.

    Returns:
        ``x [BT, H]`` (gaussian with log-normal channel gains, plus for each valid token a
        push of a random 0-20 logits towards its label, so that the target probability ranges
        from tiny to almost 1, as in a trained model), ``weight [V, H]`` (gaussian rows with
        log-normal norms, logits of spread ~3), ``labels [BT]`` int64, ``ignore_index = -100``.

    Raises:
        ValueError: an unknown variant.
    """
    BT, H, V = (int(workload[a]) for a in ("BT", "H", "V"))
    dtype = getattr(torch, str(workload.get("dtype", "bfloat16")))
    variant = str(workload.get("variant", "normal"))
    if variant not in ("normal", "large_logits"):
        raise ValueError(f"unknown variant {variant!r} (normal, large_logits)")
    labels = make_labels(workload, seed).to(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    gains = torch.exp(0.3 * torch.randn(H, generator=gen, device=device))
    w = torch.randn(V, H, generator=gen, device=device) * (LOGIT_STD / H ** 0.5)
    w *= torch.exp(0.2 * torch.randn(V, 1, generator=gen, device=device))
    w = w.to(dtype)
    x = torch.randn(BT, H, generator=gen, device=device) * gains
    valid = labels != IGNORE_INDEX
    target = w.float()[labels.clamp_min(0)]
    push = 20.0 * torch.rand(BT, 1, generator=gen, device=device) * valid[:, None]
    x = x + push * target / target.square().sum(dim=1, keepdim=True)
    if variant == "large_logits":  # exactly ceil(BT / 10) rows, so that every draw has some (BT 40: 4)
        rows = torch.randperm(BT, generator=gen, device=device)[:(BT + 9) // 10]
        x[rows] *= 10.0
    return {"x": x.to(dtype).contiguous(), "weight": w.contiguous(), "labels": labels, "ignore_index": IGNORE_INDEX}


def run(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int):
    """Reference loss and gradients, float32 throughout.

    Args:
        x: ``[BT, H]`` bfloat16 (float16 on smoke runs).
        weight: ``[V, H]`` same dtype.
        labels: ``[BT]`` int64 in ``[0, V)`` or ``ignore_index``.
        ignore_index: the label of tokens that do not count (-100).

    Returns:
        ``(loss [] float32, dX [BT, H] x.dtype, dW [V, H] float32)`` as in the module docstring
        (N is clamped to 1, so a batch without valid tokens gives zeros).
    """
    valid = labels != ignore_index
    n = valid.sum().clamp_min(1).to(torch.float32)
    wf = weight.float()
    logits = x.float() @ wf.t()
    lse = torch.logsumexp(logits, dim=1)
    safe = torch.where(valid, labels, 0)
    tgt = logits.gather(1, safe[:, None])[:, 0]
    loss = torch.where(valid, lse - tgt, 0.0).sum() / n
    p = logits.sub_(lse[:, None]).exp_()                                   # softmax, in place
    p.scatter_add_(1, safe[:, None], -valid.to(torch.float32)[:, None])
    p.mul_((valid.to(torch.float32) / n)[:, None])
    dx = (p @ wf).to(x.dtype)
    dw = p.t() @ x.float()
    return loss, dx, dw
