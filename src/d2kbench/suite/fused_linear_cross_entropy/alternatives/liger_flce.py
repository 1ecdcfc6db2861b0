"""Alternative ``liger_flce``: Liger-Kernel's fused linear cross-entropy, what a training engineer
plugs in for the LM head and the loss (``liger_kernel.transformers.functional``).

Liger chunks the tokens into ``BT / ceil(V / H)``-row pieces (about 256 rows at these shapes),
computes each chunk's logits with a cuBLAS product, turns them into their gradient in place with
its Triton cross-entropy kernel and runs the dX and dW products on cuBLAS; the weight gradient is
accumulated across chunks in float32 (``accum_dtype``) where the installed version offers it,
so its numerics match the task's float32 dW. It computes the gradients during the forward, so
the call is the forward plus ``backward()``.

Liger is imported inside ``run``: without it (the CPU, or a GPU host without the package) the
call fails with an ImportError that names the package.
"""

from __future__ import annotations

import inspect

import torch


def _liger():
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - depends on the host
        raise ImportError("alternative liger_flce needs the liger-kernel package (pip install liger-kernel)") from e
    return liger_fused_linear_cross_entropy


def run(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int):
    """Same arguments and results as ``reference.run``: ``(loss, dX, dW float32)``.

    Raises:
        ImportError: liger-kernel is not installed.
    """
    flce = _liger()
    kw = {"ignore_index": ignore_index, "reduction": "mean"}
    if "accum_dtype" in inspect.signature(flce).parameters:
        kw["accum_dtype"] = torch.float32
    with torch.enable_grad():
        xl = x.detach().requires_grad_(True)
        wl = weight.detach().requires_grad_(True)
        out = flce(xl, wl, labels, **kw)
        loss = out[0] if isinstance(out, (tuple, list)) else out
        dx, dw = torch.autograd.grad(loss, (xl, wl))
    return loss.detach().float(), dx, dw.float()
