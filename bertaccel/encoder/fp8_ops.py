"""FP8 GEMMs for the fused encoder layer (precision=fp8 with encoder=fused, issue 47), with the casts
made where the activation is already in registers:

    h, h8, sh = layernorm_fp8(...)   the LayerNorm kernel also writes h's FP8 rows and their scales
    g, g8, sg = bias_gelu_fp8(i, b)  the bias+GELU kernel likewise (whole rows per program)
    y = fp8_linear(h, h8, sh, W, b)  torch._scaled_mm(h8, W8^T) with row scales of h and of W

torchao's float8 training (options/fp8.py) reads every activation again to find its amax and
writes a scaled copy, a pass the size of the activation per GEMM input: at BERT widths those
passes cost more than the faster GEMM saves (docs/accelerations.md). Here the LayerNorm and GELU
kernels, which hold whole rows, take each row's amax and write the FP8 row in the same pass (one
more byte per element written; nothing read again). The inputs that come from elsewhere (the
layer's input, the attention output) get one row-wise cast pass of their own (`rowwise_fp8`).

Scaling: row-wise and current (encoder/fp8_kernels.py): a token's row has its own scale, from
itself, and the weight one scale per output channel, cast each step from the master weight
(fp32, or the fused optimizers' half parameters). Current, not delayed: delayed scaling would save
nothing here (the row is in registers either way) and would clip a row larger than the last
steps' amax. Row-wise scales are exactly what `torch._scaled_mm` applies in its epilogue
(scale_a [M, 1], scale_b [1, N]).

Backward: the input and weight gradients in bf16 (`torch.mm`, as under autocast), from the bf16
activation the forward kept for them: an FP8 weight gradient would need the activation scaled
along tokens, a second cast pass of its own, and the input gradient the weight transposed and cast
again. So only the forward GEMMs (a third of the GEMM work) run in FP8; the benchmark
(benchmarks/step_kernels.py, modes fused-sdpa-fp8 and compile-fp8) says what that is worth against
bf16 and torchao.

Eager only: the wrappers are opaque to torch.compile (compiler.disable), which runs around them.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from . import fused_ops as F
from . import kernels as K

FP8 = torch.float8_e4m3fn


def _fp8_buffers(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(x.shape, device=x.device, dtype=FP8),
            torch.empty((x.shape[0],), device=x.device, dtype=torch.float32))


# Warps per program, measured on an H200 at 32,768 rows (benchmarks/fp8_casts.py, docs/lab/benchmarks.md):
# the cast pass moves little per element and is fastest at 4 warps whatever the width (0.038 ms at
# 768 wide against 0.048 at 8); the bias-GELU pass with its erf and row scale wants a warp per 256
# elements of its tile (at 3,072 wide 16 warps took 0.334 ms, 8 took 0.513).
CAST_WARPS = 4


def _gelu_warps(block_r: int, block_d: int) -> int:
    return min(16, max(4, block_r * block_d // 256))


def rowwise_fp8(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): x [N, C] (any float dtype, contiguous) as e4m3 rows and one fp32 scale per row,
    x ~= q * scale[:, None], scale = amax(|row|) / 448 (1 for a zero row)."""
    F._check_matrix("x", x)
    q, s = _fp8_buffers(x)
    block_r, block_d, _ = F._row_tile(x.shape[1])
    if x.shape[0] > 0:
        K._rowwise_fp8_kernel[(triton.cdiv(x.shape[0], block_r),)](x, q, s, x.shape[0], x.shape[1], BLOCK_R=block_r,
                                                                   BLOCK_D=block_d, num_warps=CAST_WARPS)
    return q, s


class _LayerNormFp8Fn(torch.autograd.Function):
    """fused_ops' LayerNorm with y's FP8 rows as two more outputs (not differentiable)."""

    @staticmethod
    def forward(ctx, x, bias, residual, weight, ln_bias, seed, p, eps):
        q, s = _fp8_buffers(x)
        y, xhat, rstd = F._layernorm_fwd_impl(x, bias, residual, weight, ln_bias, seed, p, eps, fp8=(q, s))
        ctx.save_for_backward(xhat, rstd, bias, weight, ln_bias, seed)
        ctx.p = p
        ctx.mark_non_differentiable(q, s)
        return y, q, s

    @staticmethod
    def backward(ctx, dy, _dq, _ds):
        xhat, rstd, bias, weight, ln_bias, seed = ctx.saved_tensors
        return (*F._layernorm_bwd_impl(dy, xhat, rstd, bias, weight, ln_bias, seed, ctx.p), None, None, None)


class _BiasGeluFp8Fn(torch.autograd.Function):
    """fused_ops' bias-GELU (same backward) with y's FP8 rows as two more outputs."""

    @staticmethod
    def forward(ctx, x, bias):
        y = torch.empty_like(x)
        q, s = _fp8_buffers(x)
        block_r, block_d, _ = F._row_tile(x.shape[1])
        if x.shape[0] > 0:
            K._bias_gelu_fp8_fwd_kernel[(triton.cdiv(x.shape[0], block_r),)](
                x, bias, y, q, s, x.shape[0], x.shape[1], BLOCK_R=block_r, BLOCK_D=block_d,
                num_warps=_gelu_warps(block_r, block_d))
        ctx.save_for_backward(x, bias)
        ctx.mark_non_differentiable(q, s)
        return y, q, s

    @staticmethod
    def backward(ctx, dy, _dq, _ds):
        x, bias = ctx.saved_tensors
        return F._bias_gelu_bwd_impl(dy, x, bias)


class _Fp8LinearFn(torch.autograd.Function):
    """y = x W^T (+ b) with the forward GEMM in FP8 (x given as its FP8 rows), gradients in x's dtype."""

    @staticmethod
    def forward(ctx, x, q, scale, weight, bias):
        w8, w_scale = rowwise_fp8(weight)
        # The bias in the GEMM's epilogue, where cuBLAS takes one (a half output; the CPU's takes any).
        epilogue = bias is not None and (x.dtype != torch.float32 or x.device.type == "cpu")
        y = torch._scaled_mm(q, w8.t(), scale_a=scale[:, None], scale_b=w_scale[None, :],
                             bias=bias.to(x.dtype) if epilogue else None, out_dtype=x.dtype)
        if bias is not None and not epilogue:
            y = y + bias
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.mm(dy, weight.to(dy.dtype))
        dw = torch.mm(dy.t(), x).to(weight.dtype)
        db = dy.sum(0, dtype=torch.float32).to(weight.dtype) if ctx.has_bias else None
        return dx, None, None, dw, db


@torch.compiler.disable
def layernorm_fp8(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  ln_bias: torch.Tensor, p: float, eps: float, seed: Optional[torch.Tensor] = None,
                  training: bool = True) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fused_ops.bias_dropout_residual_layernorm's y, and y's FP8 rows (q e4m3, scale fp32 [N])."""
    F._check_layernorm(x, bias, residual, weight, ln_bias, p, eps, seed)
    p = float(p) if training else 0.0
    return _LayerNormFp8Fn.apply(x, bias, residual, weight, ln_bias, F._draw_seed(seed, p, x), p, float(eps))


@torch.compiler.disable
def bias_gelu_fp8(x: torch.Tensor, bias: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fused_ops.bias_gelu's y, and y's FP8 rows (q e4m3, scale fp32 [N])."""
    F._check_matrix("x", x)
    F._check_vector("bias", bias, x)
    return _BiasGeluFp8Fn.apply(x, bias)


@torch.compiler.disable
def fp8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x W^T + bias in x's dtype, the GEMM on q (x's FP8 rows, rowwise_fp8 or a kernel above) and W's
    FP8 rows; differentiable in x, weight and bias (bf16 GEMMs). Dims multiples of 16 (_scaled_mm)."""
    if weight.shape[0] % 16 or weight.shape[1] % 16:
        raise ValueError(f"fp8_linear: torch._scaled_mm needs both weight dims multiples of 16; got "
                         f"{tuple(weight.shape)}")
    return _Fp8LinearFn.apply(x, q, scale, weight, bias)
