"""Expert Triton solution: store new keys and values into a paged FP8 (e4m3fn) KV cache.

Contract (identical to ``reference.run``)
------------------------------------------
``run(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)`` with ``key``/``value
[T, Hkv, D]`` bf16, caches ``[NB, BS, Hkv, D]`` float8_e4m3fn (NHD pages), ``slot_mapping [T]``
int64 (``-1`` = padding) and per-tensor scales ``[1]`` float32. Writes, in place, for every
valid token ``t``: ``cache[slot // BS, slot % BS, h, :] = e4m3fn(clamp(x[t, h, :] / scale,
-448, 448))`` (fp32 IEEE division, round to nearest even). Returns None.

Design
------
L1 -- a bandwidth-bound row scatter.
    In the NHD layout a token's destination is one contiguous row of ``Hkv * D`` FP8 bytes and
    its source one contiguous row of ``Hkv * D`` bf16 values, so the operator is a copy with an
    elementwise convert: 3 bytes per element per tensor, no reuse. The per-tensor scale needs
    no reduction pass.

L2 -- multi-token programs, K and V together.
    One program handles a tile of ``BLOCK_T`` consecutive tokens x the whole row (all heads):
    the slot of each token is loaded once and its page/offset address math is shared by the key
    row and the value row; both scales are loaded once per program. Tile sizes keep about
    32 KB of input per program in flight, so a few thousand programs cover a prefill batch and
    a decode batch is a handful of programs (one launch, latency class).

L3 -- vectorised conversion, masking, 64-bit addresses.
    Rows are contiguous in source and destination, so loads are 16-byte bf16 vectors and stores
    are 16-byte FP8 vectors (a D = 128 FP8 head row is one 128-byte line). Padding tokens and the
    tail of the last tile are masked per token instead of branching per program. Page offsets
    are int64 (``slot * row`` exceeds 2^31 on large pools). The division keeps IEEE rounding
    (a reciprocal multiply agrees except where a quotient lies within an fp32 ulp of an e4m3
    rounding tie, and the state check is bit-exact), then the clamp, then the hardware
    round-to-nearest-even conversion. Under the Triton CPU interpreter, whose
    float32 -> e4m3 cast drops the carry when rounding crosses a binade, values are first
    rounded onto the e4m3 grid in float32 (same RNE result) so the cast is exact.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
FP8_MAX = 448.0
#: Bytes of bf16 input (per tensor) a program should move: enough 16-byte loads in flight.
TARGET_BYTES = 256 if _INTERPRET else 16384


@triton.jit
def _round_to_e4m3_grid(y):
    """Round fp32 ``y`` (|y| <= 448) to the nearest float8 e4m3fn value (ties to even), in fp32.

    The e4m3 spacing at |y| in [2^e, 2^(e+1)) is 2^(e-3) (2^-9 in the subnormal range); adding
    and subtracting 1.5 * 2^(k+23) rounds to a multiple of 2^k in fp32 arithmetic (RNE). The sign
    is restored so that negative values that round to zero stay -0.
    """
    bits = y.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    k = tl.maximum(e, -6) - 3
    magic = (((k + 150) << 23) | (1 << 22)).to(tl.float32, bitcast=True)
    r = (y + magic) - magic
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def _quantize(x, scale, INTERPRET: tl.constexpr):
    """e4m3fn(clamp(x / scale, -448, 448)) as fp8e4nv (x fp32, scale fp32 scalar)."""
    # tl.div_rn, not `x / scale`: Triton lowers fp32 `/` to the approximate div.full.f32 (up to
    # 2 ulp) on the GPU, which can flip an e4m3 code next to a rounding tie against the bit-exact
    # state check (the CPU interpreter divides exactly, so only the GPU would show it).
    y = tl.div_rn(x, scale)
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    if INTERPRET:
        y = _round_to_e4m3_grid(y)
    return y.to(tl.float8e4nv)


@triton.jit
def _store_kv_fp8_kernel(
    K, V, KC, VC, SLOTS, KS, VS, T,
    stride_kt, stride_vt,
    stride_kcp, stride_kcs, stride_vcp, stride_vcs,
    ROW: tl.constexpr, ROW_P2: tl.constexpr, PAGE: tl.constexpr, BLOCK_T: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Grid (cdiv(T, BLOCK_T),): tokens [pid * BLOCK_T, +BLOCK_T) x the whole row (Hkv * D).

    Rows are contiguous (head stride D, element stride 1) in the sources and in the caches.
    """
    pid = tl.program_id(0)
    toks = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = toks < T
    slot = tl.load(SLOTS + toks, mask=tok_ok, other=-1)
    valid = slot >= 0
    slot = tl.where(valid, slot, 0).to(tl.int64)
    page = slot // PAGE
    pos = slot % PAGE
    cols = tl.arange(0, ROW_P2)
    mask = valid[:, None] & (cols < ROW)[None, :]
    k_scale = tl.load(KS)
    v_scale = tl.load(VS)
    t64 = toks.to(tl.int64)

    # both loads issued before either store: two independent streams in flight per program
    k = tl.load(K + t64[:, None] * stride_kt + cols[None, :], mask=mask, other=0.0)
    v = tl.load(V + t64[:, None] * stride_vt + cols[None, :], mask=mask, other=0.0)
    tl.store(KC + (page * stride_kcp + pos * stride_kcs)[:, None] + cols[None, :],
             _quantize(k.to(tl.float32), k_scale, INTERPRET), mask=mask)
    tl.store(VC + (page * stride_vcp + pos * stride_vcs)[:, None] + cols[None, :],
             _quantize(v.to(tl.float32), v_scale, INTERPRET), mask=mask)


def run(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
        slot_mapping: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """FP8 KV-cache store (in place).

    Args:
        key, value: ``[T, Hkv, D]`` bf16 (rows contiguous: head stride D, element stride 1).
        key_cache, value_cache: ``[NB, BS, Hkv, D]`` float8_e4m3fn, rows contiguous; written in place.
        slot_mapping: ``[T]`` int64, ``-1`` = skip.
        k_scale, v_scale: ``[1]`` float32.
    """
    T, Hkv, D = key.shape
    NB, BS = key_cache.shape[:2]
    for x in (key, value, key_cache, value_cache):
        if x.stride(-1) != 1 or x.stride(-2) != D:
            raise ValueError("token rows (Hkv x D) must be contiguous")
    if T == 0:
        return None
    row = Hkv * D
    row_p2 = triton.next_power_of_2(row)
    block_t = max(1, min(128, triton.next_power_of_2(max(1, TARGET_BYTES // (2 * row_p2)))))
    num_warps = 1 if _INTERPRET else (8 if row_p2 * block_t >= 8192 else 4)
    _store_kv_fp8_kernel[(triton.cdiv(T, block_t),)](
        key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, T,
        key.stride(0), value.stride(0),
        key_cache.stride(0), key_cache.stride(1), value_cache.stride(0), value_cache.stride(1),
        ROW=row, ROW_P2=row_p2, PAGE=BS, BLOCK_T=block_t, INTERPRET=_INTERPRET,
        num_warps=num_warps,
    )
    return None
