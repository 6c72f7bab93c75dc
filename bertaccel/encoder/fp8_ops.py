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

Backward: the input gradient of the output projection and of the second FFN GEMM in FP8 too.
Their output gradient is the input gradient of the bias-dropout-residual-LayerNorm that follows
them, whose backward kernel holds whole rows of it: it writes the FP8 rows as well (one more byte
per element, nothing read again), and hands them to the GEMM's backward through a `GradRows`
mailbox, since autograd passes only the bf16 gradient. The weight for that GEMM is cast along its
other axis (W^T's rows: a scale per input channel), which costs a pass over the weight, not the
activations. The other two input gradients (Q/K/V's, from the attention core's backward; the first
FFN GEMM's, from the column-tiled bias-GELU backward) would need a cast pass of their own over
3d- and 4d-wide gradients, which costs more than the FP8 GEMM saves (docs/lab/benchmarks.md):
they stay bf16. The weight gradients stay bf16 (`torch.mm`, as under autocast), from the bf16
activation the forward kept: an FP8 weight gradient contracts over tokens, so both operands would
need scales along tokens, a transposing cast pass of each activation.

Eager, or captured in CUDA graphs (compile.step_graph=true): the wrappers are opaque to
torch.compile (compiler.disable), which would run around them with a graph break at each.
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


class GradRows:
    """A GEMM output's gradient as FP8 rows, from the LayerNorm backward that computes it to the FP8
    GEMM's backward that takes it (autograd hands on only the bf16 tensor, `dy`, which identifies
    it). Made per forward call, so nothing outlives the step."""

    __slots__ = ("dy", "q", "scale")

    def __init__(self) -> None:
        self.dy: Optional[torch.Tensor] = None
        self.q: Optional[torch.Tensor] = None
        self.scale: Optional[torch.Tensor] = None

    def take(self, dy: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """The FP8 rows if dy is the gradient they were written from (else None); emptied either way."""
        mine, q, scale = self.dy, self.q, self.scale
        self.dy = self.q = self.scale = None
        if mine is None or dy.data_ptr() != mine.data_ptr() or dy.shape != mine.shape or dy.stride() != mine.stride():
            return None
        assert q is not None and scale is not None  # the LayerNorm backward writes them with dy
        return q, scale


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
    block_r, block_d, _ = F._row_tile(x.shape[0], x.shape[1], x.device)
    if x.shape[0] > 0:
        K._rowwise_fp8_kernel[(triton.cdiv(x.shape[0], block_r),)](x, q, s, x.shape[0], x.shape[1], BLOCK_R=block_r,
                                                                   BLOCK_D=block_d, NATIVE=x.is_cuda,
                                                                   num_warps=CAST_WARPS)
    return q, s


class _LayerNormFp8Fn(torch.autograd.Function):
    """fused_ops' LayerNorm with, where asked, y's FP8 rows as two more outputs (not differentiable)
    and, into `grad_rows`, the FP8 rows of x's gradient."""

    @staticmethod
    def forward(ctx, x, bias, residual, weight, ln_bias, seed, p, eps, out_rows, grad_rows):
        fp8 = _fp8_buffers(x) if out_rows else None
        y, xhat, rstd = F._layernorm_fwd_impl(x, bias, residual, weight, ln_bias, seed, p, eps, fp8=fp8)
        ctx.save_for_backward(xhat, rstd, bias, weight, ln_bias, seed)
        ctx.p = p
        ctx.grad_rows = grad_rows
        if fp8 is None:
            return y
        ctx.mark_non_differentiable(*fp8)
        # No zero-filled "gradients" of the FP8 outputs (an FP8 fill of [N, D] per call otherwise,
        # 1.2 ms a step at the BERT-large shape): backward gets None for them.
        ctx.set_materialize_grads(False)
        return (y, *fp8)

    @staticmethod
    def backward(ctx, dy, *_fp8_grads):
        if dy is None:
            return (None,) * 10
        xhat, rstd, bias, weight, ln_bias, seed = ctx.saved_tensors
        box = ctx.grad_rows
        fp8 = _fp8_buffers(xhat) if box is not None else None
        dx, *rest = F._layernorm_bwd_impl(dy, xhat, rstd, bias, weight, ln_bias, seed, ctx.p, fp8=fp8)
        if box is not None:
            box.dy, (box.q, box.scale) = dx, fp8
        return (dx, *rest, None, None, None, None, None)


class _BiasGeluFp8Fn(torch.autograd.Function):
    """fused_ops' bias-GELU (same backward) with y's FP8 rows as two more outputs."""

    @staticmethod
    def forward(ctx, x, bias):
        y = torch.empty_like(x)
        q, s = _fp8_buffers(x)
        block_r, block_d, _ = F._row_tile(x.shape[0], x.shape[1], x.device)
        if x.shape[0] > 0:
            K._bias_gelu_fp8_fwd_kernel[(triton.cdiv(x.shape[0], block_r),)](
                x, bias, y, q, s, x.shape[0], x.shape[1], BLOCK_R=block_r, BLOCK_D=block_d, NATIVE=x.is_cuda,
                num_warps=_gelu_warps(block_r, block_d))
        ctx.save_for_backward(x, bias)
        ctx.mark_non_differentiable(q, s)
        ctx.set_materialize_grads(False)  # (as in _LayerNormFp8Fn)
        return y, q, s

    @staticmethod
    def backward(ctx, dy, _dq, _ds):
        if dy is None:
            return None, None
        x, bias = ctx.saved_tensors
        return F._bias_gelu_bwd_impl(dy, x, bias)


class _Fp8LinearFn(torch.autograd.Function):
    """y = x W^T (+ b) with the forward GEMM in FP8 (x given as its FP8 rows), gradients in x's dtype;
    the input gradient also in FP8 where `grad_rows` brings dy's FP8 rows."""

    @staticmethod
    def forward(ctx, x, q, scale, weight, bias, grad_rows):
        w8, w_scale = rowwise_fp8(weight)
        # The bias in the GEMM's epilogue, where cuBLAS takes one (a half output; the CPU's takes any).
        epilogue = bias is not None and (x.dtype != torch.float32 or x.device.type == "cpu")
        y = torch._scaled_mm(q, w8.t(), scale_a=scale[:, None], scale_b=w_scale[None, :],
                             bias=bias.to(x.dtype) if epilogue else None, out_dtype=x.dtype)
        if bias is not None and not epilogue:
            y = y + bias
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.grad_rows = grad_rows
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        rows = ctx.grad_rows.take(dy) if ctx.grad_rows is not None else None
        dy = dy.contiguous()
        if rows is not None:
            # dx = dy W: dy's rows scaled per token, W^T's rows (W's columns) per input channel.
            wt8, wt_scale = rowwise_fp8(weight.t().contiguous())
            dx = torch._scaled_mm(rows[0], wt8.t(), scale_a=rows[1][:, None], scale_b=wt_scale[None, :],
                                  out_dtype=dy.dtype)
        else:
            dx = torch.mm(dy, weight.to(dy.dtype))
        dw = torch.mm(dy.t(), x).to(weight.dtype)
        db = dy.sum(0, dtype=torch.float32).to(weight.dtype) if ctx.has_bias else None
        return dx, None, None, dw, db, None


@torch.compiler.disable
def layernorm_fp8(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  ln_bias: torch.Tensor, p: float, eps: float, seed: Optional[torch.Tensor] = None,
                  training: bool = True, out_rows: bool = True, grad_rows: Optional[GradRows] = None):
    """fused_ops.bias_dropout_residual_layernorm's y and, with out_rows, y's FP8 rows (y, q e4m3,
    scale fp32 [N]); grad_rows: a mailbox the backward fills with the FP8 rows of x's gradient, for
    the fp8_linear that made x."""
    F._check_layernorm(x, bias, residual, weight, ln_bias, p, eps, seed)
    p = float(p) if training else 0.0
    return _LayerNormFp8Fn.apply(x, bias, residual, weight, ln_bias, F._draw_seed(seed, p, x), p, float(eps),
                                 out_rows, grad_rows)


@torch.compiler.disable
def bias_gelu_fp8(x: torch.Tensor, bias: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fused_ops.bias_gelu's y, and y's FP8 rows (q e4m3, scale fp32 [N])."""
    F._check_matrix("x", x)
    F._check_vector("bias", bias, x)
    return _BiasGeluFp8Fn.apply(x, bias)


@torch.compiler.disable
def fp8_linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor,
               bias: Optional[torch.Tensor] = None, grad_rows: Optional[GradRows] = None) -> torch.Tensor:
    """x W^T + bias in x's dtype, the GEMM on q (x's FP8 rows, rowwise_fp8 or a kernel above) and W's
    FP8 rows; differentiable in x, weight and bias. The input gradient's GEMM runs in FP8 where
    grad_rows (given to the layernorm_fp8 that takes y) brings the output gradient's FP8 rows, the
    rest in bf16. Dims multiples of 16 (_scaled_mm)."""
    if weight.shape[0] % 16 or weight.shape[1] % 16:
        raise ValueError(f"fp8_linear: torch._scaled_mm needs both weight dims multiples of 16; got "
                         f"{tuple(weight.shape)}")
    return _Fp8LinearFn.apply(x, q, scale, weight, bias, grad_rows)
