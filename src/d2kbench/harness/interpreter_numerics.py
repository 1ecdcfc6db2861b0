"""Float conversions and the fused multiply-add of Triton's CPU interpreter, made to give the
bits that Triton 3.6 gives on the H200 (sm_90).

Under ``TRITON_INTERPRET=1`` Triton 3.6 converts floats in ``triton/runtime/interpreter.py``
(``_convert_float``, ``InterpreterBuilder.cast_impl`` / ``create_fp_to_fp``) with bit
manipulations that are wrong in several ways:

* float32 -> float8 (e4m3fn, e5m2): rounding never carries into the next binade (7.83 -> 4
  instead of 8, 124.6 -> 64), and nothing saturates (492 -> NaN, 567 -> 288, Inf -> 256);
* float8 -> wider: the NaN codes of e4m3fn (and Inf/NaN of e5m2) decode as finite numbers;
* float32 -> bfloat16 (every ``tl.store`` of an fp32 value into a bf16 tensor): truncated
  instead of rounded to nearest even, subnormals garbled; float64 and integers -> bfloat16
  reinterpret bits instead of converting values;
* ``tl.fma`` is a multiply and an add, rounded twice (``create_fma``).

:func:`install` replaces those builder methods (process-wide, idempotent); the harness calls
it in every CPU worker (:func:`d2kbench.harness.worker.worker_main`) before a solution is
imported. What Triton 3.6 emits on sm_90 for each conversion was read from the NVIDIA
backend (``third_party/nvidia/lib/TritonNVIDIAGPUToLLVM/ElementwiseOpToLLVM.cpp``,
``FpToFpOpConversion::createDestOps`` / ``getConversionFunc``) and checked by compiling
kernels for ``cuda:90`` on the CPU and reading the PTX (docs/cpu.md lists the instructions).
What those instructions compute comes from the PTX ISA (``cvt``: rounding modifiers and
``.satfinite``) and, for the NaN bit patterns that the ISA leaves open, from the host-side
reference conversions NVIDIA ships in ``cuda_fp8.hpp`` / ``cuda_fp16.hpp`` / ``cuda_bf16.hpp``
(in Triton's wheel under ``backends/nvidia/include``). The NaN bit patterns are not verified
on an H200.

Conversions Triton 3.6 cannot compile for sm_90 (float32/fp16/bf16 -> e4m3fn with
``fp_downcast_rounding="rtz"``, fp16/bf16 -> float8 with ``"rtz"``, float64 <-> float8, float8
-> float8, float64 -> fp16/bf16 with ``"rtz"``) raise :class:`UnsupportedConversion` here as
they fail to compile there. Other dtypes (the fnuz float8 types, integers) keep the
interpreter's own conversions, except integers -> bfloat16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Imports inside functions: triton's interpreter loads when the numerics are installed in a CPU worker.

__all__ = [
    "FloatFormat", "FORMATS", "SUPPORTED", "UnsupportedConversion", "convert_bits", "decode", "encode",
    "fma", "install", "installed", "uninstall",
]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format as stored in memory.

    ``nan_bits``: the NaN pattern a conversion into this format produces (positive, all
    exponent and mantissa bits set: the "canonical NaN" of NVIDIA's headers). ``has_inf``:
    whether the all-ones exponent with a zero mantissa is infinity (IEEE) or, as in e4m3fn,
    an ordinary binade whose all-ones mantissa alone is NaN.
    """

    name: str
    bits: int
    exp_bits: int
    man_bits: int
    has_inf: bool
    nan_bits: int

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def max_finite(self) -> float:
        top = (1 << self.exp_bits) - 1
        if self.has_inf:
            return float(np.ldexp(2.0 - 2.0 ** -self.man_bits, top - 1 - self.bias))
        return float(np.ldexp(2.0 - 2.0 ** (1 - self.man_bits), top - self.bias))  # e4m3fn: 448

    @property
    def storage(self) -> type:
        return {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[self.bits]


#: The formats handled here, by Triton's dtype name.
FORMATS: dict[str, FloatFormat] = {
    "fp8e4nv": FloatFormat("fp8e4nv", 8, 4, 3, False, 0x7F),
    "fp8e5": FloatFormat("fp8e5", 8, 5, 2, True, 0x7F),
    "fp16": FloatFormat("fp16", 16, 5, 10, True, 0x7FFF),
    "bf16": FloatFormat("bf16", 16, 8, 7, True, 0x7FFF),
    "fp32": FloatFormat("fp32", 32, 8, 23, True, 0x7FFFFFFF),
    "fp64": FloatFormat("fp64", 64, 11, 52, True, 0x7FFFFFFFFFFFFFFF),
}
_FP8 = ("fp8e4nv", "fp8e5")

#: (source, destination) -> the ``fp_downcast_rounding`` values Triton 3.6 compiles for sm_90
#: (None: no rounding argument, an exact widening). From ``FpToFpOpConversion`` (the fp8 table
#: of ``getConversionFunc``; fp16/bf16 -> fp8 accept RTNE only) and the ``arith.truncf`` /
#: ``arith.extf`` lowerings; confirmed by compiling each for cuda:90 (docs/cpu.md).
SUPPORTED: dict[tuple[str, str], tuple] = {
    ("fp32", "fp8e4nv"): ("rtne",), ("fp32", "fp8e5"): ("rtne", "rtz"),
    ("fp16", "fp8e4nv"): ("rtne",), ("fp16", "fp8e5"): ("rtne",),
    ("bf16", "fp8e4nv"): ("rtne",), ("bf16", "fp8e5"): ("rtne",),
    ("fp32", "fp16"): ("rtne", "rtz"), ("fp32", "bf16"): ("rtne", "rtz"),
    ("fp64", "fp16"): ("rtne",), ("fp64", "bf16"): ("rtne",),
    **{(f8, wide): (None,) for f8 in _FP8 for wide in ("fp16", "bf16", "fp32")},
    ("fp16", "fp32"): (None,), ("bf16", "fp32"): (None,),
}


class UnsupportedConversion(ValueError):
    """A float conversion that Triton 3.6's NVIDIA backend does not compile for sm_90."""


def decode(bits: np.ndarray, fmt: FloatFormat, specials: bool = True) -> np.ndarray:
    """The exact float64 values of ``bits`` (an unsigned integer array) in ``fmt``.

    Every fp8/fp16/bf16/fp32 value is exactly a float64. NaN patterns give NaN (sign and
    payload dropped). ``specials=False`` reads the all-ones exponent as an ordinary binade
    (what the sm_90 e5m2 -> bf16 bit trick does, see :func:`convert_bits`).
    """
    b = bits.astype(np.uint64)
    man_mask = (1 << fmt.man_bits) - 1
    exp_top = (1 << fmt.exp_bits) - 1
    man = (b & np.uint64(man_mask)).astype(np.int64)
    exp = ((b >> np.uint64(fmt.man_bits)) & np.uint64(exp_top)).astype(np.int64)
    neg = ((b >> np.uint64(fmt.bits - 1)) & np.uint64(1)).astype(bool)
    sig = np.where(exp == 0, man, man + (1 << fmt.man_bits)).astype(np.float64)
    binade = np.maximum(exp, 1)
    if specials and fmt.has_inf:
        binade = np.minimum(binade, exp_top - 1)  # the Inf/NaN binade is replaced below
    val = np.ldexp(sig, binade - fmt.bias - fmt.man_bits)
    if specials:
        if fmt.has_inf:
            val = np.where(exp == exp_top, np.where(man == 0, np.inf, np.nan), val)
        else:
            val = np.where((exp == exp_top) & (man == man_mask), np.nan, val)
    return np.where(neg, -val, val)


def encode(values: np.ndarray, fmt: FloatFormat, rounding: str = "rtne", saturate: bool = False) -> np.ndarray:
    """Round float64 ``values`` to ``fmt`` and return the bit patterns (``fmt.storage``).

    ``rounding``: ``"rtne"`` (nearest, ties to even: PTX ``.rn``) or ``"rtz"`` (toward zero:
    ``.rz``), applied once to the exact value, with gradual underflow (subnormal results; signed
    zeros kept). Overflow: with ``saturate`` (PTX ``.satfinite``) any result above the largest
    finite magnitude, and +-Inf, become +-max finite; otherwise round-to-nearest overflows to
    +-Inf and round-toward-zero stops at +-max finite (Inf stays Inf). NaN gives
    ``fmt.nan_bits``.

    Raises:
        ValueError: an unknown rounding, or an overflow that ``fmt`` cannot represent (no Inf
            and no saturation).
    """
    if rounding not in ("rtne", "rtz"):
        raise ValueError(f"unknown rounding {rounding!r} (rtne or rtz)")
    v = np.asarray(values, dtype=np.float64)
    nan = np.isnan(v)
    inf = np.isinf(v)
    neg = np.signbit(v)
    a = np.where(nan | inf, 0.0, np.abs(v))
    _, k = np.frexp(a)  # a = m * 2**k, m in [0.5, 1)
    quantum = np.maximum(k - 1, fmt.emin) - fmt.man_bits  # exponent of the last mantissa bit
    n = np.ldexp(a, -quantum)  # exact
    r = np.rint(n) if rounding == "rtne" else np.trunc(n)  # np.rint rounds ties to even
    with np.errstate(over="ignore"):  # a float64 near its own maximum may round up to Inf: overflow below
        val = np.ldexp(r, quantum)
    over = val > fmt.max_finite
    if saturate:
        val = np.where(over | inf, fmt.max_finite, val)
        to_inf = np.zeros_like(inf)
    elif rounding == "rtz":
        val = np.where(over, fmt.max_finite, val)
        to_inf = inf
    else:
        to_inf = inf | over
        val = np.where(over, 0.0, val)  # encoded as Inf below
    if np.any(to_inf) and not fmt.has_inf:
        raise ValueError(f"{fmt.name} has no infinity: overflow needs saturation")
    m2, k2 = np.frexp(val)
    normal = val >= np.ldexp(1.0, fmt.emin)
    exp_field = np.where(normal, k2 - 1 + fmt.bias, 0).astype(np.uint64)
    man_field = np.where(normal, np.ldexp(m2, fmt.man_bits + 1) - (1 << fmt.man_bits),
                         np.ldexp(val, fmt.man_bits - fmt.emin)).astype(np.uint64)
    out = (exp_field << np.uint64(fmt.man_bits)) | man_field
    out = np.where(to_inf, np.uint64(((1 << fmt.exp_bits) - 1) << fmt.man_bits), out)
    out = out | (neg.astype(np.uint64) << np.uint64(fmt.bits - 1))
    out = np.where(nan, np.uint64(fmt.nan_bits), out)
    return out.astype(fmt.storage)


def _as_bits(data: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    return np.ascontiguousarray(data).view(fmt.storage)


def convert_bits(data: np.ndarray, src: str, dst: str, rounding: str | None = None) -> np.ndarray:
    """Convert the interpreter's storage ``data`` of Triton dtype ``src`` to the bit patterns
    of ``dst`` (an unsigned array of ``dst``'s width), as Triton 3.6 does on sm_90.

    ``rounding`` is the ``fp_downcast_rounding`` of ``x.to(...)`` (``"rtne"``, ``"rtz"``, or
    None: a narrowing defaults to ``"rtne"``, as ``arith.truncf`` lowers to ``cvt.rn``).
    What each pair compiles to on sm_90 (PTX; ``FpToFpOpConversion::createDestOps``):

    * fp32 -> e4m3fn / e5m2: ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``: nearest-even; beyond the
      largest finite value (448 / 57344) and +-Inf saturate to it (PTX ISA, cvt,
      ``.satfinite``); NaN -> 0x7F (``cuda_fp8.hpp`` ``__nv_cvt_float_to_fp8``: canonical NaN).
    * fp32 -> e5m2 with ``"rtz"``: ``cvt.rz.f16.f32`` then the high byte of the fp16: toward
      zero, finite overflow stops at 57344, Inf stays Inf, NaN -> 0x7F.
    * fp16 -> fp8: ``cvt.rn.satfinite.*x2.f16x2``; bf16 -> fp8: ``cvt.f32.bf16`` (exact) then the
      fp32 conversion: the same rule.
    * fp32 -> fp16 / bf16: ``cvt.rn`` / ``cvt.rz``: IEEE, overflow to Inf (``rn``) or to the largest
      finite value (``rz``); NaN -> 0x7FFF (``cuda_fp16.hpp`` ``__internal_float2half``,
      ``cuda_bf16.hpp`` ``__internal_float2bfloat16``). fp64 -> fp16 / bf16: ``cvt.rn.*.f64``,
      rounded once from the float64 value.
    * e4m3fn -> fp16: ``cvt.rn.f16x2.e4m3x2``, exact, NaN -> 0x7FFF (``cuda_fp8.hpp``
      ``__nv_cvt_fp8_to_halfraw``); -> fp32 through that fp16 (``cvt.f32.f16``); -> bf16
      through that fp16 (``cvt.bf16.f16``). e5m2 -> fp16 / fp32 likewise (``cvt.rn.f16x2.e5m2x2``,
      Inf kept).
    * e5m2 -> bf16: no cvt; the bits are shifted into a bf16 and multiplied by 2**112
      (``Fp8E5M2_to_Bf16``, sm_90 branch): exact for finite codes, but the Inf and NaN codes
      come out finite: +-2**16 * (1 + m / 4) for mantissa m (Inf -> 65536).
    * fp16 -> fp32: ``cvt.f32.f16``, exact, NaN -> 0x7FFFFFFF (``__internal_half2float``);
      bf16 -> fp32: ``cvt.f32.bf16``, the 16 bits shifted up (NaN payload kept).

    Raises:
        UnsupportedConversion: a pair or rounding that Triton 3.6 does not compile for sm_90.
    """
    key = (src, dst)
    if key not in SUPPORTED:
        raise UnsupportedConversion(f"{src} -> {dst} does not compile for sm_90 in Triton 3.6 "
                                    "(FpToFpOpConversion has no lowering for it)")
    narrowing = FORMATS[dst].bits < FORMATS[src].bits
    mode = (rounding or "rtne") if narrowing else rounding
    if mode not in SUPPORTED[key]:
        raise UnsupportedConversion(f"{src} -> {dst} with fp_downcast_rounding={mode!r} does not compile for "
                                    f"sm_90 in Triton 3.6 (supported: {[m or 'none' for m in SUPPORTED[key]]})")
    sfmt, dfmt = FORMATS[src], FORMATS[dst]
    bits = _as_bits(data, sfmt)
    if key == ("bf16", "fp32"):
        return bits.astype(np.uint32) << np.uint32(16)
    if key == ("fp8e5", "bf16"):
        return encode(decode(bits, sfmt, specials=False), dfmt)
    values = decode(bits, sfmt)
    if not narrowing:
        return encode(values, dfmt)  # exact: every source value is a destination value
    # fp8 "rtz" (e5m2 only) goes through cvt.rz.f16.f32, which keeps Inf: no satfinite
    narrow_mode = rounding or "rtne"  # the mode checked above: narrowing always has one
    return encode(values, dfmt, narrow_mode, saturate=dst in _FP8 and narrow_mode == "rtne")


def fma(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``x * y + z`` rounded once to nearest even (PTX ``fma.rn.f32`` / ``.f16``), for float32
    or float16 arrays (broadcast together; the result has ``z``'s dtype).

    The product is exact in float64 (at most 48 significant bits); the sum is formed in float64
    with its exact rounding error (TwoSum) and rounded to odd, which float64's 53 bits make a
    correct pre-rounding for any format of at most 51 bits: the final cast to ``z``'s dtype is
    then the single correct rounding. Inf and NaN operands follow IEEE 754 (the float64
    expression). Subnormal inputs and results are kept (no flush to zero).
    """
    dtype = np.result_type(z)
    with np.errstate(over="ignore", invalid="ignore"):  # IEEE specials (signalling NaNs too) are intended
        x64, y64, z64 = np.broadcast_arrays(*(np.asarray(t, dtype=np.float64) for t in (x, y, z)))
        p = x64 * y64
        s = p + z64
        bv = s - p
        err = (p - (s - bv)) + (z64 - bv)
        finite = np.isfinite(s)
        inexact = finite & (err != 0)
        mag = s.view(np.int64) & np.int64(0x7FFFFFFFFFFFFFFF)
        toward_zero = inexact & (np.signbit(err) != np.signbit(s))  # s is above the exact sum
        mag = (mag - toward_zero.astype(np.int64)) | inexact.astype(np.int64)
        odd = (mag | (np.signbit(s).astype(np.int64) << np.int64(63))).view(np.float64)
        return np.where(inexact, odd, s).astype(dtype)


# ---- the interpreter hook -------------------------------------------------------------------

_ORIGINAL: dict[str, object] = {}


def _tl_name(dtype) -> str | None:
    name = getattr(dtype, "name", None)
    return name if name in FORMATS else None


def _rounding_name(mode) -> str | None:
    if mode is None:
        return None
    return {"RTNE": "rtne", "RTZ": "rtz"}.get(getattr(mode, "name", str(mode)).upper(), str(mode))


def _int_to_float64_round_to_odd(data: np.ndarray) -> np.ndarray:
    """Integers as float64, exact where they fit and rounded to odd otherwise (|v| >= 2**53),
    so that one further rounding to a format of <= 51 bits is the correctly rounded value."""
    out = data.astype(np.float64)
    if data.dtype.itemsize == 8:
        flat = out.reshape(-1)
        for i in np.flatnonzero(np.abs(flat) >= 2.0 ** 53):
            exact = int(data.reshape(-1)[i])
            f = float(exact)
            if int(f) != exact:
                if abs(int(f)) > abs(exact):
                    f = np.nextafter(f, 0.0)
                bits = np.float64(f).view(np.int64) | np.int64(1)
                flat[i] = bits.view(np.float64)
    return out


def install() -> None:
    """Make Triton's interpreter convert floats and compute ``tl.fma`` as sm_90 does.

    Replaces ``InterpreterBuilder.create_fp_to_fp``, ``cast_impl`` (``create_fp_trunc`` /
    ``create_fp_ext`` / int -> float), ``create_fma`` and the module functions
    ``_convert_float`` (used by ``create_dot`` for float8 operands) and
    ``_patch_lang_tensor`` (``__index__`` of one-element blocks without NumPy's deprecation) of
    ``triton.runtime.interpreter`` for this process, and runs every interpreted launch
    (``GridExecutor.__call__``) with NumPy's floating-point error reports off, as IEEE
    arithmetic on the GPU raises none. Idempotent; :func:`uninstall` restores them.
    Conversions not handled here are passed to the interpreter's own code.
    """
    from triton.runtime import interpreter as ti

    if _ORIGINAL:
        return
    builder = ti.InterpreterBuilder
    _ORIGINAL.update(create_fp_to_fp=builder.create_fp_to_fp, cast_impl=builder.cast_impl,
                     create_fma=builder.create_fma, _convert_float=ti._convert_float,
                     _patch_lang_tensor=ti._patch_lang_tensor)
    orig_patch_tensor = ti._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        """The interpreter's tensor patches, with ``__index__`` reading a one-element block's
        value as a NumPy scalar: ``int()`` of a one-element *array* (how the interpreter holds
        ``tl.program_id``) is deprecated in NumPy and warned on every ``range(pid * n, ...)``."""
        orig_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0])
                       if self.handle.data.size == 1 else int(self.handle.data))
    orig_convert, orig_cast = ti._convert_float, builder.cast_impl
    orig_fma = builder.create_fma

    def _convert_float(data, src_dtype, dst_dtype, rounding_mode):
        src, dst = _tl_name(src_dtype), _tl_name(dst_dtype)
        if src is None or dst is None:
            return orig_convert(data, src_dtype, dst_dtype, rounding_mode)
        return convert_bits(data, src, dst, _rounding_name(rounding_mode)).reshape(np.shape(data))

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        data = _convert_float(src.data, src.dtype.scalar, dst_type.scalar, rounding_mode)
        return ti.TensorHandle(data.view(ti._get_np_dtype(dst_type)), dst_type.scalar)

    def cast_impl(self, src, dst_type):
        s, d = src.dtype.scalar, dst_type.scalar
        sname, dname = _tl_name(s), _tl_name(d)
        if sname and dname and (sname, dname) in SUPPORTED:
            return create_fp_to_fp(self, src, dst_type, None)
        if dname == "bf16" and s.is_int() and not s.is_bool():
            values = _int_to_float64_round_to_odd(np.asarray(src.data))
            bits = encode(values, FORMATS["bf16"]).reshape(np.shape(src.data))
            return ti.TensorHandle(bits.view(ti._get_np_dtype(dst_type)), d)
        return orig_cast(self, src, dst_type)

    def create_fma(self, x, y, z):
        if np.asarray(z.data).dtype in (np.float32, np.float16):
            return ti.TensorHandle(fma(x.data, y.data, z.data), z.dtype.scalar)
        return orig_fma(self, x, y, z)

    orig_grid_call = ti.GridExecutor.__call__

    def grid_call(self, *args, **kwargs):
        """One interpreted launch with NumPy's floating-point error reports off: on the GPU,
        IEEE arithmetic raises no exceptions (x / 0 is inf, 0 / 0 is NaN, exp overflow is inf,
        silently); the harness's checks judge the values (``finite``), not NumPy warnings."""
        with np.errstate(all="ignore"):
            return orig_grid_call(self, *args, **kwargs)

    _ORIGINAL["GridExecutor.__call__"] = orig_grid_call
    builder.create_fp_to_fp = create_fp_to_fp
    builder.cast_impl = cast_impl
    builder.create_fma = create_fma
    ti._convert_float = _convert_float
    ti._patch_lang_tensor = _patch_lang_tensor
    ti.GridExecutor.__call__ = grid_call


def uninstall() -> None:
    """Restore the interpreter's own conversions and fma (undo :func:`install`)."""
    from triton.runtime import interpreter as ti

    if not _ORIGINAL:
        return
    builder = ti.InterpreterBuilder
    builder.create_fp_to_fp = _ORIGINAL["create_fp_to_fp"]
    builder.cast_impl = _ORIGINAL["cast_impl"]
    builder.create_fma = _ORIGINAL["create_fma"]
    ti._convert_float = _ORIGINAL["_convert_float"]
    ti._patch_lang_tensor = _ORIGINAL["_patch_lang_tensor"]
    ti.GridExecutor.__call__ = _ORIGINAL["GridExecutor.__call__"]
    _ORIGINAL.clear()


def installed() -> bool:
    """Whether :func:`install` is in effect in this process."""
    return bool(_ORIGINAL)
