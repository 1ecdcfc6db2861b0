"""Error model behind the tolerance of fused_moe_fp8_block (CPU, FP32/FP64 emulations).

The error of a valid solution against the FP32 reference is dominated by FP8 codes of the two
dynamic quantisations (x, and the SiLU * up activation) that land one step (12.5%) away from
the reference's at rounding boundaries. :func:`variant` computes the layer as a block-wise
kernel does (per 128-wide K block: an exact product of FP8 codes, scaled and added in FP32),
with one allowed variation or one bug switched on; :func:`study` prints the relative Frobenius
error and the elementwise mismatch fraction of each against the reference, which is where the
bounds in task.yaml come from::

    PYTHONPATH=src python src/d2kbench/suite/fused_moe_fp8_block/calibration.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: Allowed variations (must pass) and bugs (must fail), as keyword sets of :func:`variant`.
ALLOWED = {"blockwise": {}, "h_bf16": {"h_bf16": True}, "reciprocal": {"recip": True},
           "h_bf16+reciprocal": {"h_bf16": True, "recip": True}}
BUGS = {"per_token_scales": {"per_token": True}, "one_scale_per_row_block": {"kb0_scale": True},
        "gate_up_swapped": {"swap": True}, "no_routing_weight": {"no_weight": True}}


def blockwise_gemm(q: torch.Tensor, s: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """FP32 block-wise GEMM as a kernel computes it: ``q [M, K]`` e4m3 with ``s [M, K/128]``,
    ``wq [N, K]`` e4m3 with ``ws [N/128, K/128]`` -> ``[M, N]`` = sum_kb s * ws * (q_kb . wq_kb)."""
    M, K = q.shape
    acc = torch.zeros(M, wq.shape[0])
    for kb in range(K // 128):
        sl = slice(kb * 128, (kb + 1) * 128)
        acc += (q[:, sl].float() @ wq[:, sl].float().T) * s[:, kb:kb + 1] * ws[:, kb].repeat_interleave(128)[None]
    return acc


def quant(v: torch.Tensor, recip: bool = False, per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """1 x 128 quantisation of ``v [M, K]`` (``recip``: v * (1 / s); ``per_token``: one scale per
    row, a bug) -> (e4m3 ``[M, K]``, FP32 ``[M, K/128]``)."""
    M, K = v.shape
    g = v.float().view(M, K // 128, 128)
    amax = v.float().abs().amax(-1, keepdim=True).expand(M, K // 128) if per_token else g.abs().amax(-1)
    s = amax.clamp_min(1e-10) / 448
    y = g * (1 / s)[..., None] if recip else g / s[..., None]
    return y.clamp(-448, 448).to(torch.float8_e4m3fn).view(M, K), s.contiguous()


def variant(args: list, h_bf16: bool = False, recip: bool = False, per_token: bool = False, kb0_scale: bool = False,
            swap: bool = False, no_weight: bool = False) -> torch.Tensor:
    """The block-FP8 MoE on ``args`` (reference.make_inputs order) with one variation: allowed
    (``h_bf16``: the gate/up output rounded to bf16; ``recip``) or a bug (``per_token`` scales,
    ``kb0_scale``: the first K block's weight scale for every block, ``swap``: gate and up
    exchanged, ``no_weight``: routing weights ignored). Returns ``[T, H]`` bf16."""
    x, w13, w13s, w2, w2s, tw, ti = args
    T, H = x.shape
    I = w13.shape[1] // 2
    k = ti.shape[1]
    xq, xs = quant(x, recip, per_token)
    out = torch.zeros(T, H)
    flat = ti.reshape(-1).long()
    for e in range(w13.shape[0]):
        a_idx = (flat == e).nonzero().flatten()
        if not a_idx.numel():
            continue
        tok = a_idx // k
        s13 = w13s[e][:, :1].expand_as(w13s[e]) if kb0_scale else w13s[e]
        h = blockwise_gemm(xq.view(torch.uint8)[tok].view(torch.float8_e4m3fn), xs[tok], w13[e], s13)
        if h_bf16:
            h = h.bfloat16().float()
        g, u = (h[:, I:], h[:, :I]) if swap else (h[:, :I], h[:, I:])
        aq, as_ = quant((F.silu(g) * u).bfloat16(), recip, per_token)
        y = blockwise_gemm(aq, as_, w2[e], w2s[e])
        out.index_add_(0, tok, y * (1.0 if no_weight else tw.reshape(-1)[a_idx, None]))
    return out.bfloat16()


def errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative Frobenius error, fraction of elements with |out - ref| > 0.1 + 0.1 |ref|)."""
    o, r = out.double(), ref.double()
    return float((o - r).norm() / r.norm()), float(((o - r).abs() > 0.1 + 0.1 * r.abs()).double().mean())


def study(shapes: list[dict] | None = None, seeds: tuple[int, ...] = (0, 1)) -> None:
    """Print both errors of every allowed variation and bug on a few CPU shapes."""
    from d2kbench.tasks import load_task

    ref = load_task("fused_moe_fp8_block").reference_module()
    shapes = shapes or [{"T": 64, "H": 512, "I": 256, "E": 8, "k": 4}, {"T": 8, "H": 7168, "I": 256, "E": 4, "k": 2},
                        {"T": 12, "H": 1024, "I": 384, "E": 6, "k": 3, "x": "outliers"}]
    for wl in shapes:
        for seed in seeds:
            args = list(ref.make_inputs(wl, seed, "cpu").values())
            exp = ref.run(*args)
            for name, kw in {**ALLOWED, **BUGS}.items():
                rf, mis = errors(variant(args, **kw), exp)
                print(f"{wl} seed {seed} {name:24s} rel_fro {rf:.3e} mismatch {mis:.2e}")


if __name__ == "__main__":
    study()
