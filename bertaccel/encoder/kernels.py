"""The Triton kernels of bertaccel.encoder.fused_ops (see its docstring for what each fuses and why).

Every kernel loads its inputs as fp32 whatever their dtype (fp32, fp16, bf16), computes in fp32
and rounds once, on the store, to the output's dtype. Tensors are row-major [N, C] and element
offsets are int32 (row * C + col): the wrappers check N * C < 2^31. The row count N changes from
batch to batch (packed tokens), so it is never specialized on (do_not_specialize): Triton would
otherwise compile a variant per "N divisible by 16 / N == 1" class. C (a hidden size) is fixed
per model, so it is specialized on (divisibility by 16 lets loads vectorize).

Dropout draws one Philox number per element with tl.rand(seed, row * C + col); the backward
draws the same numbers again, so no mask is ever stored. The seed is an int64 device tensor,
read in the kernel: the host never sees it (no sync; CUDA-graph capturable).

Only API that Triton 3.6 (the GPU machine) and 3.9 (here) both have: tl.rand, tl.erf, tl.exp,
tl.sqrt, tl.sum, tl.where, tl.minimum, tl.zeros, tl.arange, masked tl.load/tl.store, and range()
loops with runtime bounds.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .fp8_kernels import _store_fp8_rows


@triton.jit
def _load_seed(Seed, DROPOUT: tl.constexpr):
    # Without dropout the pointer is a placeholder and never read. One return statement: Triton
    # type-checks every return, even under a constexpr branch.
    if DROPOUT:
        seed = tl.load(Seed)
    else:
        seed = 0
    return seed


@triton.jit
def _keep(seed, offsets, p_drop):
    """True where dropout keeps the element: one uniform draw per (seed, row * C + col)."""
    return tl.rand(seed, offsets) >= p_drop


@triton.jit
def _tile(n_rows, n_cols, row0, col0, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """(rows, cols, in-bounds mask, int32 element offsets) of the [BLOCK_R, BLOCK_C] tile at (row0, col0)."""
    rows = row0 + tl.arange(0, BLOCK_R)
    cols = col0 + tl.arange(0, BLOCK_C)
    ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return rows, cols, ok, rows[:, None] * n_cols + cols[None, :]


@triton.jit
def _gelu(z):
    # BERT's exact GELU: z * Phi(z) with Phi the normal CDF, 0.5 * (1 + erf(z / sqrt(2))).
    return 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))


@triton.jit
def _gelu_grad(z):
    # d/dz z * Phi(z) = Phi(z) + z * phi(z), phi the normal density exp(-z^2 / 2) / sqrt(2 pi).
    cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
    return cdf + z * tl.exp(-0.5 * z * z) * 0.3989422804014327


@triton.jit(do_not_specialize=["n_rows"])
def _bias_gelu_fwd_kernel(X, Bias, Y, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Y = gelu(X + Bias), one [BLOCK_R, BLOCK_C] tile per program (grid: row tiles x column tiles)."""
    _, cols, ok, offs = _tile(n_rows, n_cols, tl.program_id(0) * BLOCK_R, tl.program_id(1) * BLOCK_C,
                              BLOCK_R, BLOCK_C)
    b = tl.load(Bias + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    z = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32) + b[None, :]
    tl.store(Y + offs, _gelu(z).to(Y.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["n_rows", "rows_per_program"])
def _bias_gelu_bwd_kernel(DY, X, Bias, DX, DBiasPartial, n_rows, n_cols, rows_per_program,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """DX = DY * gelu'(X + Bias); row r of DBiasPartial [programs, C] (fp32) = the sum of this
    program's DX rows (grid: row programs x column tiles; each program walks rows_per_program rows,
    a multiple of BLOCK_R). The sum is kept as a [BLOCK_R, BLOCK_C] tile and reduced over its rows
    once at the end: a reduction per iteration made the warps meet in shared memory at every tile
    (0.5 ms per call at T=32k, I=3072 on an H100, 2.5x the bytes' time)."""
    pid = tl.program_id(0)
    col0 = tl.program_id(1) * BLOCK_C
    cols = col0 + tl.arange(0, BLOCK_C)
    b = tl.load(Bias + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    first = pid * rows_per_program
    for row0 in range(first, tl.minimum(first + rows_per_program, n_rows), BLOCK_R):
        _, _, ok, offs = _tile(n_rows, n_cols, row0, col0, BLOCK_R, BLOCK_C)
        z = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32) + b[None, :]
        dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)  # 0 outside: adds nothing to acc
        dx = dy * _gelu_grad(z)
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=ok)
        acc += dx
    tl.store(DBiasPartial + pid * n_cols + cols, tl.sum(acc, axis=0), mask=cols < n_cols)


@triton.jit(do_not_specialize=["n_rows"])
def _bias_gelu_fp8_fwd_kernel(X, Bias, Y, Q, S, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                              NATIVE: tl.constexpr):
    """Y = gelu(X + Bias) in X's dtype and its FP8 rows (Q e4m3, S fp32 scales) from the same fp32
    values: whole rows per program (a row's scale needs all of it), where _bias_gelu_fwd_kernel
    tiles columns."""
    rows, cols, ok, offs = _tile(n_rows, n_cols, tl.program_id(0) * BLOCK_R, 0, BLOCK_R, BLOCK_D)
    b = tl.load(Bias + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    z = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32) + b[None, :]
    y = tl.where(ok, _gelu(z), 0.0)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=ok)
    _store_fp8_rows(y, Q, S, rows, ok, offs, n_rows, NATIVE)


@triton.jit(do_not_specialize=["n_rows"])
def _rowwise_fp8_kernel(X, Q, S, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, NATIVE: tl.constexpr):
    """BLOCK_R whole rows per program: the FP8 rows of X (Q e4m3 [N, C], S fp32 [N])."""
    rows, _, ok, offs = _tile(n_rows, n_cols, tl.program_id(0) * BLOCK_R, 0, BLOCK_R, BLOCK_D)
    _store_fp8_rows(tl.load(X + offs, mask=ok, other=0.0).to(tl.float32), Q, S, rows, ok, offs, n_rows, NATIVE)


@triton.jit(do_not_specialize=["n_rows"])
def _bdrln_fwd_kernel(X, Bias, Res, W, LnB, Seed, Y, Xhat, Rstd, Q, S, n_rows, n_cols, p_drop, keep_scale, eps,
                      BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, DROPOUT: tl.constexpr, FP8: tl.constexpr,
                      NATIVE: tl.constexpr):
    """BLOCK_R whole rows per program (BLOCK_D >= D): z = dropout(X + Bias) + Res, Y = LN(z) * W + LnB.
    Writes Y, xhat = (z - mean) * rstd (both in X's dtype) and rstd (fp32); with FP8, also Y's FP8
    rows (Q e4m3, S fp32 scales) from the same fp32 values (else Q and S are placeholders)."""
    rows, cols, ok, offs = _tile(n_rows, n_cols, tl.program_id(0) * BLOCK_R, 0, BLOCK_R, BLOCK_D)
    col_ok = cols < n_cols
    h = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
    h += tl.load(Bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if DROPOUT:
        h = tl.where(_keep(_load_seed(Seed, DROPOUT), offs, p_drop), h * keep_scale, 0.0)
    z = h + tl.load(Res + offs, mask=ok, other=0.0).to(tl.float32)  # 0 outside the tensor
    mean = tl.sum(z, axis=1) / n_cols
    centered = tl.where(ok, z - mean[:, None], 0.0)  # the padding columns must not enter the variance
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=1) / n_cols + eps)
    xhat = centered * rstd[:, None]
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    lnb = tl.load(LnB + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = tl.where(ok, xhat * w[None, :] + lnb[None, :], 0.0)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=ok)
    tl.store(Xhat + offs, xhat.to(Xhat.dtype.element_ty), mask=ok)
    tl.store(Rstd + rows, rstd, mask=rows < n_rows)
    if FP8:
        _store_fp8_rows(y, Q, S, rows, ok, offs, n_rows, NATIVE)


@triton.jit(do_not_specialize=["n_rows", "rows_per_program"])
def _bdrln_bwd_kernel(DY, Xhat, W, Rstd, Seed, DX, DRes, DBiasPartial, DWPartial, DLnBPartial, Q, S,
                      n_rows, n_cols, rows_per_program, p_drop, keep_scale,
                      BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, DROPOUT: tl.constexpr, FP8: tl.constexpr,
                      NATIVE: tl.constexpr):
    """Each program walks rows_per_program rows (a multiple of BLOCK_R), BLOCK_R at a time:
    dz = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = DY * W; DRes = dz; DX = dz * keep / (1 - p).
    Row pid of each [programs, D] fp32 partial buffer gets this program's sums of DX, DY * xhat, DY.
    With FP8, also DX's FP8 rows (Q e4m3, S fp32 scales): the input gradient of the GEMM that made X
    runs on them (encoder/fp8_ops.py)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < n_cols
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    seed = _load_seed(Seed, DROPOUT)
    # The parameter sums as [BLOCK_R, BLOCK_D] tiles, reduced over their rows once at the end (see
    # _bias_gelu_bwd_kernel); only the row statistics below need a reduction per tile.
    acc_dbias = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    acc_dw = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    acc_dlnb = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    first = pid * rows_per_program
    for row0 in range(first, tl.minimum(first + rows_per_program, n_rows), BLOCK_R):
        rows, _, ok, offs = _tile(n_rows, n_cols, row0, 0, BLOCK_R, BLOCK_D)
        # Outside the tensor dy, xhat and rstd read as 0, so dz is 0 there and the sums gain nothing.
        dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
        xhat = tl.load(Xhat + offs, mask=ok, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + rows, mask=rows < n_rows, other=0.0)
        g = dy * w[None, :]
        mean_g = tl.sum(g, axis=1) / n_cols
        mean_gx = tl.sum(g * xhat, axis=1) / n_cols
        dz = rstd[:, None] * (g - mean_g[:, None] - xhat * mean_gx[:, None])
        tl.store(DRes + offs, dz.to(DRes.dtype.element_ty), mask=ok)
        # Padding columns hold -rstd * mean(g), harmlessly: they sum into accumulator columns never stored.
        if DROPOUT:
            dx = tl.where(_keep(seed, offs, p_drop), dz * keep_scale, 0.0)
        else:
            dx = dz
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=ok)
        if FP8:  # (the padding columns' nonzero dz must not enter a row's amax)
            _store_fp8_rows(tl.where(ok, dx, 0.0), Q, S, rows, ok, offs, n_rows, NATIVE)
        acc_dbias += dx
        acc_dw += dy * xhat
        acc_dlnb += dy
    part = pid * n_cols + cols
    tl.store(DBiasPartial + part, tl.sum(acc_dbias, axis=0), mask=col_ok)
    tl.store(DWPartial + part, tl.sum(acc_dw, axis=0), mask=col_ok)
    tl.store(DLnBPartial + part, tl.sum(acc_dlnb, axis=0), mask=col_ok)


@triton.jit(do_not_specialize=["n_programs"])
def _sum_partials_kernel(P, Out0, Out1, Out2, n_programs, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """The second stage of the parameter gradients: Out_k[c] = sum over programs of P[k, :, c], for
    the (up to three) partial buffers of one backward in ONE launch (grid: column tiles x buffers),
    written in each output's dtype. Three torch sums and their casts were 4-6 launches per
    LayerNorm backward: 0.85 ms of a B=32 BERT-base step on an H100, more than the kernels summed."""
    k = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
    for p0 in range(0, n_programs, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        ok = (rows < n_programs)[:, None] & (cols < n_cols)[None, :]
        acc += tl.load(P + (k * n_programs + rows[:, None]) * n_cols + cols[None, :], mask=ok, other=0.0)
    total = tl.sum(acc, axis=0)
    if k == 0:
        tl.store(Out0 + cols, total.to(Out0.dtype.element_ty), mask=cols < n_cols)
    elif k == 1:
        tl.store(Out1 + cols, total.to(Out1.dtype.element_ty), mask=cols < n_cols)
    else:
        tl.store(Out2 + cols, total.to(Out2.dtype.element_ty), mask=cols < n_cols)


@triton.jit(do_not_specialize=["n_rows"])
def _keep_mask_kernel(Seed, Out, n_rows, n_cols, p_drop, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Out (int8 [N, D]) = 1 where the kernels above keep the element for this seed, else 0."""
    _, _, ok, offs = _tile(n_rows, n_cols, tl.program_id(0) * BLOCK_R, 0, BLOCK_R, BLOCK_D)
    keep = _keep(tl.load(Seed), offs, p_drop)
    tl.store(Out + offs, keep.to(tl.int8), mask=ok)
