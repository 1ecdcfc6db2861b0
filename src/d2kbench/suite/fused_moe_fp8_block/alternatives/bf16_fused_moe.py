"""Alternative: what a deployment without an FP8 kernel runs, the suite's bf16 fused MoE
(``fused_moe_bf16``'s expert Triton kernels) on dequantised operands, computing the task's
function: both activation quantisations are applied, then dequantised for the bf16 GEMMs.

Per call:

1. the weights are dequantised to bf16 (``w_q * w_s`` per 128 x 128 block, in chunks of
   experts so that no FP32 copy of all weights exists);
2. x is quantised in 1 x 128 groups exactly as the reference does (``reference.quant_1x128``)
   and dequantised to bf16 (``bf16(x_q * x_s)``);
3. GEMM1 with the SiLU * up epilogue (the bf16 expert's kernel) writes ``a = bf16(silu(h) * up)``;
4. ``a`` is quantised in 1 x 128 groups and dequantised to bf16 in place (PyTorch ops);
5. GEMM2 with the routing-weight epilogue and the fixed-order combine (the bf16 expert's kernels).

An earlier version skipped steps 2 and 4 (a bf16 layer on the dequantised weights only): a
different function, whose error against the reference (4.3-4.6e-2 on the H200) is the
activation quantisation the task specifies, beyond the 3.2e-2 bound. Dequantising to bf16
rounds ``q * s`` to 8 significant bits (relative 2^-9, far below the FP8 step of 2^-4), and
the expert rounds each expert's weighted output to bf16 before the combine: both are
variations the bound accepts.

Its time includes the dequantisations (reading the FP8 weights, writing 2x their bytes in
bf16, and the activation passes) on top of the bf16 layer: the cost of not having an FP8
kernel. Trusted comparator code (it may use PyTorch compute); declared for CUDA only. On the
CPU (the tests run it under the Triton interpreter, which does not compute bf16 dots) the
dequantised operands are float16 instead of bf16.

Shapes: as ``reference.run``: ``x [T, H]`` bf16, ``w13 [E, 2I, H]`` e4m3 + ``w13_scale``,
``w2 [E, H, I]`` e4m3 + ``w2_scale``, ``topk_weights [T, k]``, ``topk_ids [T, k]`` -> ``[T, H]`` bf16.
"""

from __future__ import annotations

import dataclasses

import torch

from d2kbench.tasks import load_task
from d2kbench.tasks.loader import import_file

_BF16_EXPERT = import_file(load_task("fused_moe_bf16").root / "solutions" / "expert.py")
_REF = load_task("fused_moe_fp8_block").reference_module()
#: Experts dequantised per step (bounds the FP32 temporary to this many experts' weights).
CHUNK = 16


def _dequant_weights(q: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q [E, N, K]`` e4m3 with block scales ``s [E, N/128, K/128]`` -> ``dtype [E, N, K]``."""
    E, N, K = q.shape
    out = torch.empty((E, N, K), dtype=dtype, device=q.device)
    for e0 in range(0, E, CHUNK):
        e1 = min(E, e0 + CHUNK)
        blk = q[e0:e1].float().view(e1 - e0, N // 128, 128, K // 128, 128)
        out[e0:e1] = (blk * s[e0:e1, :, None, :, None]).view(e1 - e0, N, K).to(dtype)
    return out


def quant_dequant(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``v [M, K]`` quantised in 1 x 128 groups as the reference does, dequantised: ``dtype(q * s)``."""
    q, s = _REF.quant_1x128(v)
    return _REF.dequant_1x128(q, s).to(dtype)


class _QuantisedInput:
    """Stands in for one of the bf16 expert's GEMM2 kernels during a ``fused_moe`` call:
    ``kernel[grid](c2, ...)`` first quantises-dequantises its activation operand ``c2`` (the
    first argument, ``[rows, I]`` in the expert's dtype) in place, then launches the real kernel."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches = 0

    def __getitem__(self, grid):
        def launch(c2: torch.Tensor, *args, **kwargs):
            c2.copy_(quant_dequant(c2, c2.dtype))
            self.launches += 1
            return self.kernel[grid](c2, *args, **kwargs)
        return launch


#: The expert's kernels that read the activation (the sorted path's GEMM2, the decode path's GEMV2).
_GEMM2 = ("_gemm2_weighted_kernel", "_decode_gemv2_combine_kernel")


def _layer(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The bf16 expert's ``fused_moe`` (its tiles, no programmatic dependent launch) on dequantised
    ``x``, ``w13``, ``w2``, with step 4 (the quantisation of the activation) before its GEMM2.

    Raises:
        RuntimeError: the expert's flow changed (its GEMM2 was not launched exactly once).
    """
    ex = _BF16_EXPERT                       # this file's own instance of the module (import_file)
    T, H = x.shape
    E, I2, _ = w13.shape
    cfg = ex.config_for(T, H, I2 // 2, E, ids.shape[1], ex._num_sms(x.device))
    hooks = {name: _QuantisedInput(getattr(ex, name)) for name in _GEMM2}
    for name, hook in hooks.items():
        setattr(ex, name, hook)
    try:
        out = ex.fused_moe(x, w13, w2, tw, ids, dataclasses.replace(cfg, pdl=False))
    finally:
        for name, hook in hooks.items():
            setattr(ex, name, hook.kernel)
    if sum(h.launches for h in hooks.values()) != 1:
        raise RuntimeError("the bf16 expert's GEMM2 was not launched exactly once: its flow changed")
    return out


def run(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Dequantise the weights, quantise-dequantise x, then the bf16 fused MoE kernels with the
    activation quantised between its two GEMMs (see the module docstring)."""
    dtype = torch.bfloat16 if x.is_cuda else torch.float16        # the interpreter computes no bf16 dot
    xd = quant_dequant(x, dtype)
    out = _layer(xd, _dequant_weights(w13, w13_scale, dtype), _dequant_weights(w2, w2_scale, dtype),
                 topk_weights.contiguous(), topk_ids.contiguous())
    return out.to(x.dtype)
