"""Float conversions and tl.fma under the Triton interpreter, bit for bit as on sm_90.

Every check runs a real Triton kernel under TRITON_INTERPRET=1 (with
d2kbench.harness.interpreter_numerics installed, as conftest.py and every CPU worker do) and
compares its bits with an oracle built here from torch's conversions for in-range values plus
the rules of the PTX instructions Triton 3.6 emits for sm_90 (saturation of
cvt.rn.satfinite, canonical NaN), or from exact rational arithmetic (fma). Deliberately wrong
conversions (the stock interpreter, ties away from zero, no saturation, truncation, two
roundings in fma) must be rejected by the same comparisons.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first triton import

from fractions import Fraction  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as ti  # noqa: E402

from d2kbench.harness import interpreter_numerics as inum  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU interpreter only")

BLOCK = 4096
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_UINT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@pytest.fixture(autouse=True)
def _numerics_installed():
    inum.install()
    yield
    inum.install()


@triton.jit
def _cast_kernel(X, Y, N, ROUNDING: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    x = tl.load(X + o, mask=m)
    if ROUNDING == "":
        y = x.to(Y.dtype.element_ty)
    else:
        y = x.to(Y.dtype.element_ty, fp_downcast_rounding=ROUNDING)
    tl.store(Y + o, y, mask=m)


@triton.jit
def _fma_kernel(X, Y, Z, OUT, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    tl.store(OUT + o, tl.fma(tl.load(X + o, mask=m), tl.load(Y + o, mask=m), tl.load(Z + o, mask=m)), mask=m)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of ``t`` as non-negative int64."""
    n = t.element_size()
    b = t.contiguous().view(_UINT[n]).to(torch.int64)
    return b & ((1 << (8 * n)) - 1) if n < 8 else b


def from_bits(codes, dtype) -> torch.Tensor:
    n = torch.empty(0, dtype=dtype).element_size()
    raw = torch.tensor(np.asarray(codes, dtype=np.int64), dtype=torch.int64)
    raw = torch.where(raw >= 1 << (8 * n - 1), raw - (1 << (8 * n)), raw) if n < 8 else raw
    return raw.to(_UINT[n]).view(dtype)


def kernel_cast(x: torch.Tensor, dtype: torch.dtype, rounding: str = "") -> torch.Tensor:
    """``x.to(dtype, fp_downcast_rounding=rounding)`` inside a Triton kernel; the result's bits."""
    y = torch.empty(x.shape, dtype=dtype)
    _cast_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), ROUNDING=rounding, BLOCK=BLOCK)
    return bits(y)


def float32_classes() -> torch.Tensor:
    """float32 inputs of every class: the float8/fp16 grids and their exact ties, one float32
    ulp either side of every tie, binade edges, subnormals, signed zeros, the largest finite
    value, overflow, +-Inf and NaNs with several payloads and both signs."""
    grids = [torch.arange(256, dtype=torch.uint8).view(d).float() for d in FP8]
    grids.append(torch.arange(0, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16).float())
    pts = []
    for g in grids:
        g = g[torch.isfinite(g)].unique()
        mids = (g[1:] + g[:-1]) / 2  # exact in float32
        pts += [g, mids, torch.nextafter(mids, torch.full_like(mids, np.inf)),
                torch.nextafter(mids, torch.full_like(mids, -np.inf))]
    gen = torch.Generator().manual_seed(0)
    pts.append(torch.randn(20000, generator=gen) * torch.exp2(torch.randint(-140, 127, (20000,), generator=gen).float()))
    pts.append(torch.tensor([7.83, 124.6, 15.9, 0.0302, 464.0, 480.0, 492.0, 567.0, 1e4, 57344.0, 61440.0,
                             65504.0, 65519.0, 65520.0, 1e30, 3.4028234663852886e38, 1.1754943508222875e-38,
                             2.0 ** -149, 2.0 ** -140, 2.0 ** -10, 2.0 ** -9 * 0.5, 2.0 ** -17, 0.0]))
    pts.append(torch.nextafter(torch.tensor([464.0, 61440.0, 65520.0, 2.0 ** -10, 2.0 ** -17]),
                               torch.tensor([np.inf] * 5)))
    pts.append(torch.nextafter(torch.tensor([464.0, 61440.0, 65520.0, 2.0 ** -10, 2.0 ** -17]),
                               torch.tensor([0.0] * 5)))
    x = torch.cat(pts)
    x = torch.cat([x, -x])
    special = from_bits([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF,
                         0x7FBFFFFF, 0x80000000], torch.float32)
    return torch.cat([x, special])


# ---- oracles (torch for in-range values, the sm_90 rules for the rest) ---------------------------

def oracle_to_fp8(x: torch.Tensor, dtype: torch.dtype, rounding: str = "rtne") -> torch.Tensor:
    """cvt.rn.satfinite (and for e5m2 the rz path): torch's round-to-nearest-even where |x| <=
    max finite; beyond it and at +-Inf +-max finite (rz: Inf stays Inf); NaN -> 0x7F."""
    x = x.float()
    mx = torch.finfo(dtype).max
    neg = torch.signbit(x).to(torch.int64) << 7
    finite = torch.isfinite(x)
    inside = finite & (x.abs() <= mx)
    near = bits(torch.where(inside, x, 0.0).to(dtype)) | neg
    if rounding == "rtz":
        rounded_up = torch.where(inside, x, 0.0).to(dtype).float().abs() > x.abs()
        near = torch.where(inside & rounded_up, ((near & 0x7F) - 1) | neg, near)
    max_code = bits(torch.tensor([mx]).to(dtype))[0]
    out = torch.where(inside, near, max_code | neg)
    if rounding == "rtz":
        out = torch.where(torch.isinf(x), bits(torch.tensor([np.inf]).to(dtype))[0] | neg, out)
    return torch.where(torch.isnan(x), 0x7F, out)


def oracle_to_half(x: torch.Tensor, dtype: torch.dtype, rounding: str = "rtne") -> torch.Tensor:
    """cvt.rn / cvt.rz to fp16 or bf16: IEEE rounding of torch (rn) or the code next to it
    toward zero when torch rounded away (rz; so finite overflow stops at max finite), NaN ->
    0x7FFF."""
    x = x.float()
    near = torch.where(torch.isnan(x), 0.0, x).to(dtype)
    out = bits(near)
    if rounding == "rtz":
        sign = out & 0x8000
        away = near.float().abs() > x.abs()
        out = torch.where(away, ((out & 0x7FFF) - 1) | sign, out)
    return torch.where(torch.isnan(x), 0x7FFF, out)


def all_codes(dtype: torch.dtype) -> torch.Tensor:
    n = torch.empty(0, dtype=dtype).element_size()
    return from_bits(np.arange(1 << (8 * n)), dtype)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, inputs: torch.Tensor, what: str) -> None:
    bad = torch.nonzero(got != want).flatten()
    if bad.numel():
        show = [(f"{float(inputs[i]):.9g}", hex(int(bits(inputs[i:i + 1])[0])), hex(int(got[i])), hex(int(want[i])))
                for i in bad[:8]]
        raise AssertionError(f"{what}: {bad.numel()} of {got.numel()} differ (input, input bits, got, want): {show}")


def mismatches(got: torch.Tensor, want: torch.Tensor) -> int:
    return int((got != want).sum())


# ---- conversions, bit for bit ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FP8, ids=["e4m3fn", "e5m2"])
def test_float32_to_float8_rounds_to_nearest_even_and_saturates(dtype):
    x = float32_classes()
    assert_same_bits(kernel_cast(x, dtype), oracle_to_fp8(x, dtype), x, f"fp32 -> {dtype}")
    assert_same_bits(kernel_cast(x, dtype, "rtne"), oracle_to_fp8(x, dtype), x, f"fp32 -> {dtype} rtne")


def test_float32_to_e4m3fn_known_values():
    x = torch.tensor([7.83, 124.6, 492.0, 567.0, 464.0, 465.0, np.inf, -np.inf, np.nan, -0.0, 2.0 ** -10,
                      3 * 2.0 ** -11])
    want = [8.0, 128.0, 448.0, 448.0, 448.0, 448.0, 448.0, -448.0]
    got = from_bits(kernel_cast(x, torch.float8_e4m3fn).numpy(), torch.float8_e4m3fn).float()
    assert got[:8].tolist() == want
    assert int(kernel_cast(x, torch.float8_e4m3fn)[8]) == 0x7F
    assert int(kernel_cast(x, torch.float8_e4m3fn)[9]) == 0x80  # -0 keeps its sign
    assert got[10].item() == 0.0 and got[11].item() == 2.0 ** -9  # 2^-10 ties to even 0; 1.5 * 2^-10 up


def test_float32_to_e5m2_toward_zero():
    x = float32_classes()
    assert_same_bits(kernel_cast(x, torch.float8_e5m2, "rtz"), oracle_to_fp8(x, torch.float8_e5m2, "rtz"), x,
                     "fp32 -> e5m2 rtz")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rounding", ["", "rtne", "rtz"])
def test_float32_to_half_precision(dtype, rounding):
    x = float32_classes()
    if dtype == torch.bfloat16:  # ties and neighbours of the bf16 grid as well
        g = all_codes(torch.bfloat16).float()
        g = g[torch.isfinite(g)].unique()
        mids = (g[1:] + g[:-1]) / 2
        x = torch.cat([x, mids, torch.nextafter(mids, mids * 2), torch.nextafter(mids, mids * 0)])
    assert_same_bits(kernel_cast(x, dtype, rounding), oracle_to_half(x, dtype, rounding or "rtne"),
                     x, f"fp32 -> {dtype} {rounding or 'default'}")


def test_bf16_rtz_is_truncation():
    x = float32_classes()
    x = x[~torch.isnan(x)]
    assert torch.equal(kernel_cast(x, torch.bfloat16, "rtz"), bits(x) >> 16)


@pytest.mark.parametrize("src", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("dtype", FP8, ids=["e4m3fn", "e5m2"])
def test_every_half_precision_value_to_float8(src, dtype):
    x = all_codes(src)
    assert_same_bits(kernel_cast(x, dtype), oracle_to_fp8(x.float(), dtype), x.float(), f"{src} -> {dtype}")


@pytest.mark.parametrize("src", FP8, ids=["e4m3fn", "e5m2"])
@pytest.mark.parametrize("dst", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_every_float8_code_widens_exactly(src, dst):
    codes = all_codes(src)
    values = codes.float()
    nan_bits = {torch.float32: 0x7FFFFFFF, torch.float16: 0x7FFF, torch.bfloat16: 0x7FFF}[dst]
    want = torch.where(torch.isnan(values), nan_bits, bits(torch.where(torch.isnan(values), 0.0, values).to(dst)))
    if src == torch.float8_e5m2 and dst == torch.bfloat16:
        # sm_90 shifts the code into a bf16 and multiplies by 2**112: the Inf/NaN codes come
        # out as +-2**16 * (1 + mantissa / 4) (ElementwiseOpToLLVM.cpp Fp8E5M2_to_Bf16)
        c = bits(codes)
        top = (c & 0x7C) == 0x7C
        quirk = torch.tensor([2.0 ** 16]) * (1 + (c & 3).float() / 4) * torch.where(c >= 0x80, -1.0, 1.0)
        want = torch.where(top, bits(quirk.to(torch.bfloat16)), want)
        assert from_bits([int(kernel_cast(from_bits([0x7C], src), dst)[0])], dst).item() == 65536.0
    assert_same_bits(kernel_cast(codes, dst), want, values, f"{src} -> {dst}")


def test_half_precision_to_float32():
    h = all_codes(torch.float16)
    hv = h.float()
    want = torch.where(torch.isnan(hv), 0x7FFFFFFF, bits(torch.where(torch.isnan(hv), 0.0, hv)))
    assert_same_bits(kernel_cast(h, torch.float32), want, hv, "fp16 -> fp32")
    b = all_codes(torch.bfloat16)
    assert torch.equal(kernel_cast(b, torch.float32), bits(b) << 16)  # cvt.f32.bf16: the bits shifted up


def test_float64_rounds_once_to_half_precision():
    # 1 + 2^-8 + 2^-40: via float32 it would become the tie 1 + 2^-8 and round to even (1.0)
    x = torch.tensor([1 + 2.0 ** -8 + 2.0 ** -40, 1 + 2.0 ** -11 + 2.0 ** -40, -(1 + 2.0 ** -8 + 2.0 ** -40),
                      1e300, np.inf, np.nan, 1.5, -0.0, 2.0 ** -130], dtype=torch.float64)
    bf = from_bits(kernel_cast(x, torch.bfloat16).numpy(), torch.bfloat16).double()
    assert bf[:5].tolist() == [1 + 2.0 ** -7, 1.0, -(1 + 2.0 ** -7), np.inf, np.inf]
    assert int(kernel_cast(x, torch.bfloat16)[5]) == 0x7FFF and bf[6] == 1.5
    assert int(kernel_cast(x, torch.bfloat16)[7]) == 0x8000 and bf[8] == 2.0 ** -130
    hf = from_bits(kernel_cast(x, torch.float16).numpy(), torch.float16).double()
    assert hf[1] == 1 + 2.0 ** -10 and hf[0] == 1 + 2.0 ** -8 and hf[3] == np.inf


def test_integers_to_bfloat16_round_once():
    small = torch.arange(-70000, 70000, 7, dtype=torch.int32)
    assert torch.equal(kernel_cast(small, torch.bfloat16), bits(small.float().to(torch.bfloat16)))
    # 2^25 + 2^17 + 1 is above the bf16 tie at 2^25 + 2^17; via float32 it would become that tie
    big = torch.tensor([2 ** 25 + 2 ** 17 + 1], dtype=torch.int32)
    assert from_bits(kernel_cast(big, torch.bfloat16).numpy(), torch.bfloat16).item() == 2 ** 25 + 2 ** 18
    huge = torch.tensor([2 ** 60 + 2 ** 52 + 1, -(2 ** 60 + 2 ** 52 + 1), 2 ** 60 + 2 ** 52], dtype=torch.int64)
    got = from_bits(kernel_cast(huge, torch.bfloat16).numpy(), torch.bfloat16).double().tolist()
    assert got == [2.0 ** 60 + 2.0 ** 53, -(2.0 ** 60 + 2.0 ** 53), 2.0 ** 60]


@pytest.mark.parametrize("src,dst,rounding", [
    (torch.float32, torch.float8_e4m3fn, "rtz"), (torch.float16, torch.float8_e5m2, "rtz"),
    (torch.bfloat16, torch.float8_e4m3fn, "rtz"), (torch.float64, torch.float8_e4m3fn, ""),
    (torch.float8_e4m3fn, torch.float64, ""), (torch.float64, torch.bfloat16, "rtz"),
])
def test_conversions_sm90_cannot_compile_are_refused(src, dst, rounding):
    x = torch.zeros(4, dtype=torch.float32).to(src)
    with pytest.raises(Exception, match="does not compile for sm_90"):
        kernel_cast(x, dst, rounding)


# ---- deliberately wrong conversions are rejected --------------------------------------------------

def _e4m3_grid() -> np.ndarray:
    g = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy().astype(np.float64)
    return g[np.isfinite(g)]  # codes 0x00..0x7E, increasing


def _ties_away(x: np.ndarray) -> np.ndarray:
    g = _e4m3_grid()
    with np.errstate(invalid="ignore"):  # the signalling NaNs among the inputs
        a = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    i = np.clip(np.searchsorted(g, a), 1, len(g) - 1)
    lo, hi = g[i - 1], g[i]
    code = np.where(a - lo >= hi - a, i, i - 1)  # a tie goes up: away from zero
    return (code | (np.signbit(x) << 7)).astype(np.uint8)


def _no_saturation(x: np.ndarray) -> np.ndarray:
    out = inum.convert_bits(x, "fp32", "fp8e4nv")
    return np.where(np.abs(x) > 448, np.uint8(0x7F), out)  # torch's old NaN-on-overflow rule


def _truncating(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # the signalling NaNs among the inputs
        wide = x.astype(np.float64)
    return inum.encode(wide, inum.FORMATS["fp8e4nv"], "rtz", saturate=True)  # toward zero


@pytest.mark.parametrize("wrong", [_ties_away, _no_saturation, _truncating])
def test_mis_rounding_conversion_is_rejected(monkeypatch, wrong):
    good = ti.InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            return ti.TensorHandle(wrong(np.asarray(src.data)), dst_type.scalar)
        return good(self, src, dst_type, rounding_mode)

    monkeypatch.setattr(ti.InterpreterBuilder, "create_fp_to_fp", create_fp_to_fp)
    x = float32_classes()
    assert mismatches(kernel_cast(x, torch.float8_e4m3fn), oracle_to_fp8(x, torch.float8_e4m3fn)) > 0


def test_stock_interpreter_is_rejected():
    inum.uninstall()
    try:
        x = float32_classes()
        x = x[~torch.isnan(x)]  # the stock conversion produces NaN bits numpy warns about
        with np.errstate(all="ignore"):
            assert mismatches(kernel_cast(x, torch.float8_e4m3fn), oracle_to_fp8(x, torch.float8_e4m3fn)) > 0
            assert mismatches(kernel_cast(x, torch.bfloat16), oracle_to_half(x, torch.bfloat16)) > 0
            # 7.83 -> 4 and 124.6 -> 64: the carry into the next binade is lost
            got = kernel_cast(torch.tensor([7.83, 124.6]), torch.float8_e4m3fn)
            assert from_bits(got.numpy(), torch.float8_e4m3fn).float().tolist() == [4.0, 64.0]
    finally:
        inum.install()
    assert inum.installed()


# ---- fused multiply-add ---------------------------------------------------------------------------

def _round_to_float32(q: Fraction) -> float:
    """The exact rational ``q`` rounded to nearest even float32 (gradual underflow, overflow to Inf)."""
    if q == 0:
        return 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    val = round(a / quantum) * quantum  # Fraction.__round__: ties to even
    f = float(val) if val <= Fraction(np.finfo(np.float32).max.item()) else np.inf
    return -f if q < 0 else f


def kernel_fma(x, y, z) -> torch.Tensor:
    x, y, z = (torch.tensor(np.asarray(v, dtype=np.float32)) for v in (x, y, z))
    out = torch.empty_like(z)
    _fma_kernel[(triton.cdiv(z.numel(), BLOCK),)](x, y, z, out, z.numel(), BLOCK=BLOCK)
    return out


def _fma_cases() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    n = 3000
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(np.float32)
    y = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(np.float32)
    # z cancels most of x*y in a third of the cases, is far below or above it in the others
    p = x.astype(np.float64) * y
    scale = np.exp2(rng.integers(-20, 20, n))
    z = np.where(rng.random(n) < 0.33, -p * (1 + rng.standard_normal(n) * 2.0 ** -20), p * scale).astype(np.float32)
    # one float64 rounding lands on a float32 tie: x*y = 2^-24 - 2^-70, z = 1 + 2^-23
    x = np.append(x, [np.float32(1 + 2.0 ** -23), np.float32(1 + 2.0 ** -12), np.float32(2.0 ** -100)])
    y = np.append(y, [np.float32((1 - 2.0 ** -23) * 2.0 ** -24), np.float32(1 + 2.0 ** -12), np.float32(2.0 ** -49)])
    z = np.append(z, [np.float32(1 + 2.0 ** -23), np.float32(-(1 + 2.0 ** -11)), np.float32(2.0 ** -149)])
    return x, y, z


def test_fma_rounds_once():
    x, y, z = _fma_cases()
    want = np.array([_round_to_float32(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))
                     for a, b, c in zip(x, y, z)], dtype=np.float32)
    got = kernel_fma(x, y, z).numpy()
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert not bad.size, [(x[i], y[i], z[i], got[i], want[i]) for i in bad[:5]]
    assert got[-3] == np.float32(1 + 2.0 ** -23) and got[-2] == np.float32(2.0 ** -24)


def test_fma_specials():
    inf, nan = np.inf, np.nan
    got = kernel_fma([inf, 0.0, inf, 1.0, -0.0, 3.4e38], [0.0, 5.0, 1.0, nan, 0.0, 10.0],
                     [1.0, -0.0, -inf, 1.0, -0.0, -3.4e38]).numpy()
    assert np.isnan(got[0]) and got[1] == 0.0 and not np.signbit(got[1]) and np.isnan(got[2]) and np.isnan(got[3])
    assert got[4] == 0.0 and np.signbit(got[4])  # -0 * 0 + -0 = -0
    assert got[5] == np.inf  # 9 * 3.4e38 overflows once


@pytest.mark.parametrize("wrong", ["stock", "float64_then_round"])
def test_twice_rounded_fma_is_rejected(monkeypatch, wrong):
    if wrong == "stock":
        inum.uninstall()
    else:
        def create_fma(self, a, b, c):
            return ti.TensorHandle((a.data.astype(np.float64) * b.data + c.data).astype(np.float32), c.dtype.scalar)
        monkeypatch.setattr(ti.InterpreterBuilder, "create_fma", create_fma)
    try:
        x, y, z = _fma_cases()
        got = kernel_fma(x[-3:], y[-3:], z[-3:]).numpy()
    finally:
        inum.install()
    want = np.array([1 + 2.0 ** -23, 2.0 ** -24], dtype=np.float32)
    assert not np.array_equal(got[:2], want)


@triton.jit
def _k_ieee_specials(x_ptr, y_ptr, o_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x, y = tl.load(x_ptr + offs), tl.load(y_ptr + offs)
    tl.store(o_ptr + offs, tl.exp2(x / y) + tl.log2(y))


def _ieee_specials():
    x = torch.tensor([1.0, 0.0, 200.0, -1.0])
    y = torch.tensor([0.0, 0.0, 1.0, 0.0])   # 1/0 = inf, 0/0 = NaN, 2^200 = inf, log2(0) = -inf
    o = torch.empty(4)
    _k_ieee_specials[(1,)](x, y, o, N=4)
    return o


def test_launches_give_ieee_specials_without_numpy_warnings():
    """As on the GPU: division by zero, 0/0 and overflow give inf / NaN silently (the harness's
    checks judge the values); the stock interpreter warns through NumPy on each."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")   # any warning fails the launch
        o = _ieee_specials()
    assert torch.isnan(o[0]) and torch.isnan(o[1]) and o[2] == float("inf") and o[3] == float("-inf")
    inum.uninstall()
    try:
        with pytest.warns(RuntimeWarning):
            _ieee_specials()
    finally:
        inum.install()
