"""Alternative ``sdpa_flash``: PyTorch SDPA's FLASH_ATTENTION backend (FlashAttention-2).

What a user would run instead of writing the kernel. ``F.scaled_dot_product_attention`` returns
``o`` only, and the task also returns the log-sum-exp, so this calls the ATen entry point of
the flash backend, which returns both:
``torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, is_causal=True, scale=scale)``.

* Layout: ``[B, S, H, D] -> [B, H, S, D]`` are transposed views (no copy); the flash kernel
  reads the BSHD memory as it is and writes ``o`` in BSHD memory, so ``o.transpose(1, 2)`` is
  already contiguous and ``.contiguous()`` costs nothing.
* GQA: FlashAttention-2 maps query head ``h`` to KV head ``h // (Hq / Hkv)`` itself (it is the
  backend behind ``enable_gqa=True``), so K and V are passed unexpanded: no extra traffic.
* LSE: FlashAttention-2's ``softmax_lse``, float32 ``[B, Hq, S]``, natural log: the task's
  unit and shape (see :func:`_task_lse`).

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only (the backend exists
there only). On a CPU tensor :func:`_flash` runs PyTorch's CPU flash kernel
(``_scaled_dot_product_flash_attention_for_cpu``: same arguments, same ``(o, lse)`` contract)
instead, so that the tests check the layout and LSE conversions against the reference on the
CPU (with a copy of the task that declares ``cpu``).
"""

from __future__ import annotations

import torch


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention on ``[B, H, S, D]`` views: ``(o [B, Hq, S, D], lse)``, ``lse`` float32,
    natural log, ``[B, Hq, S]`` (possibly padded along S, see :func:`_task_lse`)."""
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
    else:  # the CPU stand-in (see the module docstring)
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    return out[0], out[1]


def _task_lse(lse: torch.Tensor, B: int, Hq: int, S: int) -> torch.Tensor:
    """A backend's LSE as the task declares it: ``[B, Hq, S]`` float32, contiguous (drops a
    trailing singleton dimension or padding along S; no copy when the layout already fits)."""
    return lse.reshape(B, Hq, -1)[:, :, :S].contiguous()


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal GQA attention with SDPA's flash backend.

    Args:
        q: ``[B, S, Hq, D]`` bfloat16 (float16 on smoke workloads), contiguous BSHD.
        k, v: ``[B, S, Hkv, D]``, q's dtype, ``Hq`` a multiple of ``Hkv``.
        scale: softmax scale.

    Returns:
        ``(o, lse)``: ``o`` ``[B, S, Hq, D]`` in q's dtype, contiguous; ``lse`` ``[B, Hq, S]``
        float32 (natural log), contiguous.

    Raises:
        RuntimeError: the flash backend rejects the inputs (dtype, head dim, GPU).
    """
    B, S, Hq, _ = q.shape
    o, lse = _flash(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale)
    return o.transpose(1, 2).contiguous(), _task_lse(lse, B, Hq, S)
