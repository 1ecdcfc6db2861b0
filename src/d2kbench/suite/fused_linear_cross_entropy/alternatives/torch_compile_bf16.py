"""Alternative ``torch_compile_bf16``: ``torch.compile`` of the training step a PyTorch user
writes for the LM head and the loss, run as autograd forward + backward::

    logits = (x @ W.T).float()                    # bf16 tensor-core product, bf16 logits
    loss = F.cross_entropy(logits, labels, ignore_index=-100)
    loss.backward()                               # dX = x.grad (bf16), dW = W.grad (bf16 -> float32)

It materialises the logits (and their float32 gradient) in full: far over the task's memory
bound, but the speed a user gets without a fused kernel. The harness's plain
``compile_reference`` would compile the float32 reference (three float32 products without
tensor cores, TF32 off), which no user runs, so this file compiles the bf16 formulation
instead. Compiled once per shape (``dynamic=False``) on the first call (warm-up).
"""

from __future__ import annotations

from typing import Callable

import torch

from d2kbench.harness.compiled_reference import RECOMPILE_LIMIT

_compiled: Callable | None = None


def _step(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int):
    logits = (x @ weight.t()).float()
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=ignore_index)


def run(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int):
    """Same arguments and results as ``reference.run``: ``(loss, dX, dW float32)``."""
    global _compiled
    if _compiled is None:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _compiled = torch.compile(_step, dynamic=False)
    with torch.enable_grad():
        xl = x.detach().requires_grad_(True)
        wl = weight.detach().requires_grad_(True)
        loss = _compiled(xl, wl, labels, ignore_index)
        dx, dw = torch.autograd.grad(loss, (xl, wl))
    return loss.detach().float(), dx, dw.float()
