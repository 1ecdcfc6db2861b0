"""Alternative ``sdpa_cudnn``: PyTorch SDPA's CUDNN_ATTENTION backend (cuDNN fused attention).

What a user would run instead of writing the kernel. ``F.scaled_dot_product_attention`` returns
``o`` only, and the task also returns the log-sum-exp, so this calls the ATen entry point of
the cuDNN backend with ``compute_log_sumexp=True``:
``torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, is_causal=True, scale=scale)``.

* Layout: ``[B, S, H, D] -> [B, H, S, D]`` are transposed views (no copy); cuDNN takes the
  strides as they are and writes ``o`` in q's layout (BSHD memory), so ``o.transpose(1, 2)``
  is already contiguous.
* GQA: PyTorch's cuDNN path does not take grouped KV heads (``enable_gqa`` works with the flash
  and math backends only), so K and V are expanded to ``Hq`` heads first
  (``repeat_interleave``, head ``h`` gets KV head ``h // G``). Cost, inside the timed call: the
  expanded K and V are written, ``4 * B * S * Hq * D`` bytes in bf16 (268 MB, about 0.06 ms
  at 4.3 TB/s, on the Llama-3.1-8B workload), and the kernel reads G x the K/V bytes a
  GQA-aware kernel reads.
* LSE: cuDNN's softmax statistics, float32 ``[B, Hq, S, 1]``, natural log (max plus the log of
  the sum): reshaped to the task's ``[B, Hq, S]`` (see :func:`_task_lse`).

Device switch: ``task.yaml`` declares this alternative for ``cuda`` only (cuDNN exists there
only). On a CPU tensor :func:`_cudnn` runs PyTorch's CPU flash kernel
(``_scaled_dot_product_flash_attention_for_cpu``: same arguments, same ``(o, lse)`` contract)
instead, so that the tests check the GQA expansion and the layout and LSE conversions against
the reference on the CPU (with a copy of the task that declares ``cpu``).
"""

from __future__ import annotations

import torch


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, S, Hkv, D] -> [B, S, Hkv * groups, D]`` (a copy): head ``h`` holds KV head ``h // groups``."""
    return x.repeat_interleave(groups, dim=2)


def _cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention on ``[B, H, S, D]`` views with equal head counts: ``(o [B, H, S, D], lse)``,
    ``lse`` float32, natural log, ``[B, H, S, 1]`` (``[B, H, S]`` from the CPU stand-in)."""
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=scale)
    else:  # the CPU stand-in (see the module docstring)
        out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    return out[0], out[1]


def _task_lse(lse: torch.Tensor, B: int, Hq: int, S: int) -> torch.Tensor:
    """A backend's LSE as the task declares it: ``[B, Hq, S]`` float32, contiguous (drops a
    trailing singleton dimension or padding along S; no copy when the layout already fits)."""
    return lse.reshape(B, Hq, -1)[:, :, :S].contiguous()


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal GQA attention with SDPA's cuDNN backend (K and V expanded to the query heads).

    Args:
        q: ``[B, S, Hq, D]`` bfloat16 (float16 on smoke workloads), contiguous BSHD.
        k, v: ``[B, S, Hkv, D]``, q's dtype, ``Hq`` a multiple of ``Hkv``.
        scale: softmax scale.

    Returns:
        ``(o, lse)``: ``o`` ``[B, S, Hq, D]`` in q's dtype, contiguous; ``lse`` ``[B, Hq, S]``
        float32 (natural log), contiguous.

    Raises:
        RuntimeError: cuDNN rejects the inputs (dtype, head dim, cuDNN version).
    """
    B, S, Hq, _ = q.shape
    groups = Hq // k.shape[2]
    k, v = _expand_kv(k, groups), _expand_kv(v, groups)
    o, lse = _cudnn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale)
    return o.transpose(1, 2).contiguous(), _task_lse(lse, B, Hq, S)
