"""FP8 (e4m3) rows for the Triton kernels of encoder/kernels.py: a matrix's rows each with its own
scale, written by the kernel that already holds the row (encoder/fp8_ops.py says why).

Row-wise current scaling: a row's scale is amax(|row|) / 448 (448: e4m3's largest finite value),
computed from the row itself in the same program that writes it, so no amax history is kept and a
row never saturates (delayed scaling would clip a row larger than the last steps' amax). A row of
zeros gets scale 1. The FP8 value is round-to-nearest-even of row / scale on e4m3's grid; the
rounding is done in fp32 arithmetic (`_e4m3`) so that the final cast converts an exactly
representable value: Triton's interpreter (the CPU tests) rounds a value that carries into the
next binade down a binade (31.6 became 16, not 32), the GPU's converter does not; both agree on
exact values. On a GPU (NATIVE=True) the hardware's own conversion (round to nearest even,
saturating) does the rounding: the emulation's dozen integer and float operations per element made
the whole-row bias-GELU kernel compute-bound (docs/lab/benchmarks.md).
"""
from __future__ import annotations

import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)  # (a global a @jit function reads must be a constexpr)


@triton.jit
def _e4m3(v):
    """v (fp32, already divided by its scale) rounded to nearest-even on e4m3's grid and saturated
    to +-448: 3 mantissa bits, so the step in v's binade is 2^(exponent - 3), never below the
    subnormals' 2^-9. Exponent by the float's bits (exact, unlike log2); rounding by adding and
    subtracting 1.5 * 2^23, which leaves an fp32 value of magnitude < 2^22 rounded to an integer,
    ties to even."""
    v = tl.minimum(tl.maximum(v, -E4M3_MAX), E4M3_MAX)
    bits = v.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127
    step_exp = tl.maximum(exponent, -6) - 3
    step = ((step_exp + 127) << 23).to(tl.float32, bitcast=True)
    magic = 12582912.0  # 1.5 * 2^23
    return ((v / step + magic) - magic) * step


@triton.jit
def _row_scale(x):
    """The scale of each row of an fp32 [R, C] tile whose padding is 0: amax / 448, 1 for a zero row."""
    amax = tl.max(tl.abs(x), axis=1)
    return tl.where(amax > 0.0, amax / E4M3_MAX, 1.0)


@triton.jit
def _store_fp8_rows(x, Q, S, rows, ok, offs, n_rows, NATIVE: tl.constexpr):
    """Q = x / scale on e4m3's grid, S = the rows' scales (fp32 [N]). x's padding must be 0.
    NATIVE: the GPU's converter rounds (True), or _e4m3 in fp32 (Triton's interpreter)."""
    scale = _row_scale(x)
    v = x / scale[:, None]
    if NATIVE:
        v = tl.minimum(tl.maximum(v, -E4M3_MAX), E4M3_MAX)
    else:
        v = _e4m3(v)
    tl.store(Q + offs, v.to(Q.dtype.element_ty), mask=ok)
    tl.store(S + rows, scale, mask=rows < n_rows)
