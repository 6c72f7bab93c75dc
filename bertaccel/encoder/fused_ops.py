"""LightSeq-style fused elementwise ops of a BERT layer, as Triton kernels with autograd:

`bias_gelu(x, bias)`: the intermediate dense layer's bias add and exact (erf) GELU in one pass.
`bias_dropout_residual_layernorm(x, bias, residual, weight, ln_bias, p, eps)`: the output dense
layers' bias add, hidden dropout, residual add and LayerNorm in one pass.

Why: between the matmuls a BERT layer is memory-bound elementwise work. Unfused (PyTorch eager,
Hugging Face's layer), each step reads and writes the whole [N, C] activation; fused, each
element is read and written once. Bytes moved per element below, s = the activation's element
size (2 for fp16/bf16, 4 for fp32); the [C] parameters and [N] row statistics are negligible.

bias_gelu (x [N, I], usually I = 4 * hidden):
  forward: reads x, writes y: 2s (unfused: add 3s + gelu 2s = 5s).
  backward: reads dy and x, writes dx: 3s, plus the dbias partial sums (unfused: recompute the add
  3s, gelu backward 3s, dbias sum s = 7s).
  Saved for backward: x (not y). GELU is not invertible in closed form, so its derivative needs its
  input; x is already saved by the matmul that produced it (autograd keeps one tensor for both),
  while y would be an extra [N, I] tensor.

bias_dropout_residual_layernorm (x, residual [N, D]):
  forward: reads x and residual, writes y and xhat: 4s (unfused: add 3s, dropout 2s + a 1-byte
  mask, residual add 3s, LayerNorm 2s and its saved input: about 10s + 1).
  backward: reads dy and xhat, writes dx and dresidual: 4s, plus the partial sums.
  Saved for backward: xhat = (z - mean) * rstd in x's dtype and rstd (fp32 [N]); the dropout mask is
  regenerated from the seed (never stored). xhat rather than z: the same bytes, the mean is not
  needed (dz needs xhat and rstd only), and rounding xhat to bf16 errs relative to xhat itself,
  where z - mean from a rounded z would lose digits whenever |mean| >> std. Not y: recovering xhat
  from y divides by weight, which may be 0.
  dresidual is dz and dx is dz * keep / (1 - p): both are written (an extra s per element at p = 0)
  because a custom op's outputs may not alias each other.

Parameter gradients (dbias, dweight, dln_bias) are row sums: each backward program walks a block of
rows accumulating fp32 sums in registers, writes one row of a [programs, C] fp32 buffer, and torch
sums that buffer. Deterministic (no atomics), and the buffer (a few programs per SM) is much
smaller than the activation, so this beats a separate `dx.sum(0)`, which reads all of dx again.

Each op is (a) a torch.autograd.Function in eager mode (torch.library's Python dispatch costs per
call, and a BERT layer calls these twice per step) and (b) a torch.library custom op pair (forward,
backward; fake kernels and a registered autograd formula) under torch.compile, so the graph holds
one opaque op and no graph break. Dropout seeds are int64 device tensors drawn with torch.randint
on the device, never read on the host: no .item(), no sync, CUDA-graph capturable.

Triton: the GPU machine has Triton 3.6 (torch 2.11), this one 3.9; the kernels use only API both
have. On a machine without CUDA they run in Triton's interpreter (TRITON_INTERPRET=1).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from . import kernels as K

INT32_LIMIT = 2 ** 31
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TILE_ELEMENTS = 2048  # elements per program tile: 8..16 fp32 values per thread at 4..8 warps, no spills
GELU_BLOCK_COLS = 256
PROGRAMS_PER_SM = 4  # partial-sum backward programs: enough warps in flight per SM for a memory-bound kernel
CPU_PROGRAMS = 2  # the interpreter: few programs, so each one walks several row tiles (tested)
# Triton's interpreter (no CUDA: the CPU tests) runs each program's operations one by one in Python
# on numpy arrays, so its time grows with the number of programs and row tiles, not with their size,
# and no register file bounds a tile: its tiles cover the rows up to this many elements. (A compiled
# test on the CPU spent three quarters of its time in the interpreter, tiles of 16 rows.)
INTERPRETER_TILE_ELEMENTS = 1 << 16


# ---------------------------------------------------------------- launch geometry

def _interpreter_rows(n_rows: int, block_cols: int) -> int:
    """Rows per tile under the interpreter: all of them, up to INTERPRETER_TILE_ELEMENTS."""
    return max(1, min(triton.next_power_of_2(max(1, n_rows)), INTERPRETER_TILE_ELEMENTS // block_cols))


def _row_tile(n_rows: int, n_cols: int, device: torch.device) -> Tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps) of the LayerNorm kernels: whole rows (BLOCK_D >= D), several
    per program when D is small so a program still moves TILE_ELEMENTS (a GPU: n_rows is not read,
    so the tile and the compiled variant do not change with the batch's token count)."""
    block_d = triton.next_power_of_2(n_cols)
    if device.type != "cuda":
        return _interpreter_rows(n_rows, block_d), block_d, 1
    block_r = max(1, min(16, TILE_ELEMENTS // block_d))
    return block_r, block_d, min(8, max(1, block_r * block_d // 256))


def _gelu_tile(n_rows: int, n_cols: int, device: torch.device) -> Tuple[int, int]:
    """(BLOCK_R, BLOCK_C) of the bias-GELU kernels: column tiles of up to 256, rows to fill the tile
    (the interpreter: whole rows, as many as INTERPRETER_TILE_ELEMENTS holds)."""
    if device.type != "cuda":
        block_c = min(INTERPRETER_TILE_ELEMENTS, triton.next_power_of_2(n_cols))
        return _interpreter_rows(n_rows, block_c), block_c
    block_c = min(GELU_BLOCK_COLS, triton.next_power_of_2(n_cols))
    return max(1, TILE_ELEMENTS // block_c), block_c


def _row_split(n_rows: int, block_r: int, other_programs: int, device: torch.device) -> Tuple[int, int]:
    """(row programs, rows per program) of a partial-sum backward: about PROGRAMS_PER_SM programs
    per SM in all (other_programs: the column tiles beside each row program), each walking a
    multiple of block_r rows. A host-side query of cached device properties: no sync."""
    if device.type == "cuda":
        target = PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = CPU_PROGRAMS
    tiles = triton.cdiv(n_rows, block_r)
    programs = min(tiles, max(1, target // other_programs))
    if programs == 0:
        return 0, 0
    tiles_per_program = triton.cdiv(tiles, programs)
    return triton.cdiv(tiles, tiles_per_program), tiles_per_program * block_r


# ---------------------------------------------------------------- input checks

def _check_matrix(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError(f"{name} must be a 2-D [N, C] tensor; got {getattr(t, 'shape', type(t))}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32, float16 or bfloat16; got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be row-major contiguous (the kernels index row * C + col); "
                         f"got strides {t.stride()}")
    if t.shape[0] * t.shape[1] >= INT32_LIMIT:
        raise ValueError(f"{name} has N * C = {t.shape[0] * t.shape[1]} >= 2^31 elements: int32 offsets "
                         f"would overflow; split the batch")


def _check_vector(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    """A per-column parameter of x: [C], contiguous, on x's device, fp32 or x's dtype (autocast
    leaves parameters fp32 while activations are half)."""
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != (x.shape[1],):
        raise ValueError(f"{name} must be a [C] = [{x.shape[1]}] tensor; got {getattr(t, 'shape', type(t))}")
    if t.dtype not in (torch.float32, x.dtype):
        raise ValueError(f"{name} must be float32 or x's dtype {x.dtype}; got {t.dtype}")
    if t.device != x.device or not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous on x's device {x.device}; got {t.device}, "
                         f"strides {t.stride()}")


def _check_seed(seed: Optional[torch.Tensor], x: torch.Tensor) -> None:
    if seed is not None and (not isinstance(seed, torch.Tensor) or seed.dtype != torch.int64
                             or seed.numel() != 1 or seed.device != x.device):
        raise ValueError(f"seed must be a one-element int64 tensor on {x.device}; got "
                         f"{(seed.dtype, tuple(seed.shape), seed.device) if isinstance(seed, torch.Tensor) else seed}")


def _check_layernorm(x, bias, residual, weight, ln_bias, p, eps, seed) -> None:
    _check_matrix("x", x)
    _check_matrix("residual", residual)
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"residual must match x's shape, dtype and device {tuple(x.shape)}, {x.dtype}, "
                         f"{x.device}; got {tuple(residual.shape)}, {residual.dtype}, {residual.device}")
    for name, t in (("bias", bias), ("weight", weight), ("ln_bias", ln_bias)):
        _check_vector(name, t, x)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be a float in [0, 1); got {p!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0.0:
        raise ValueError(f"eps must be a float > 0; got {eps!r}")
    _check_seed(seed, x)


def _draw_seed(seed: Optional[torch.Tensor], p: float, x: torch.Tensor) -> Optional[torch.Tensor]:
    """The dropout seed: given, or drawn from torch's generator on x's device (no host sync);
    None without dropout (the kernels then never read it)."""
    if p == 0.0:
        return None
    if seed is None:
        return torch.randint(0, 2 ** 31 - 1, (1,), device=x.device, dtype=torch.int64)
    return seed.reshape(1)


# ---------------------------------------------------------------- implementations (real tensors)

def _bias_gelu_fwd_impl(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n_rows, n_cols = x.shape
    block_r, block_c = _gelu_tile(n_rows, n_cols, x.device)
    if n_rows > 0:  # a grid of size 0 is not launched
        K._bias_gelu_fwd_kernel[(triton.cdiv(n_rows, block_r), triton.cdiv(n_cols, block_c))](
            x, bias, y, n_rows, n_cols, BLOCK_R=block_r, BLOCK_C=block_c)
    return y


def _bias_gelu_bwd_impl(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    dy = dy.contiguous()  # e.g. the expanded (stride 0) gradient of a .sum()
    n_rows, n_cols = x.shape
    block_r, block_c = _gelu_tile(n_rows, n_cols, x.device)
    col_tiles = triton.cdiv(n_cols, block_c)
    programs, rows_per_program = _row_split(n_rows, block_r, col_tiles, x.device)
    dx = torch.empty_like(x)
    partial = torch.empty((1, programs, n_cols), device=x.device, dtype=torch.float32)
    if programs > 0:
        K._bias_gelu_bwd_kernel[(programs, col_tiles)](
            dy, x, bias, dx, partial, n_rows, n_cols, rows_per_program, BLOCK_R=block_r, BLOCK_C=block_c)
    return dx, _sum_partials(partial, (bias,))[0]


def _layernorm_fwd_impl(x, bias, residual, weight, ln_bias, seed: Optional[torch.Tensor], p: float,
                        eps: float, fp8: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, xhat, rstd): y and xhat in x's dtype, rstd fp32 [N]. fp8: (e4m3 [N, D], fp32 [N]) buffers
    the kernel also fills with y's FP8 rows and their scales (encoder/fp8_ops.py)."""
    n_rows, n_cols = x.shape
    y, xhat = torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty((n_rows,), device=x.device, dtype=torch.float32)
    block_r, block_d, warps = _row_tile(n_rows, n_cols, x.device)
    q, s = fp8 if fp8 is not None else (x, rstd)  # (placeholders, never written without FP8)
    if n_rows > 0:
        K._bdrln_fwd_kernel[(triton.cdiv(n_rows, block_r),)](
            x, bias, residual, weight, ln_bias, x if seed is None else seed, y, xhat, rstd, q, s, n_rows, n_cols,
            p, 1.0 / (1.0 - p), eps, BLOCK_R=block_r, BLOCK_D=block_d, DROPOUT=seed is not None,
            FP8=fp8 is not None, NATIVE=x.is_cuda, num_warps=warps)
    return y, xhat, rstd


def _layernorm_bwd_impl(dy, xhat, rstd, bias, weight, ln_bias, seed: Optional[torch.Tensor], p: float,
                        fp8: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
    """(dx, dbias, dresidual, dweight, dln_bias); parameter gradients in their parameter's dtype.
    fp8: (e4m3 [N, D], fp32 [N]) buffers the kernel also fills with dx's FP8 rows and their scales."""
    dy = dy.contiguous()
    n_rows, n_cols = xhat.shape
    block_r, block_d, warps = _row_tile(n_rows, n_cols, xhat.device)
    programs, rows_per_program = _row_split(n_rows, block_r, 1, xhat.device)
    dx, dres = torch.empty_like(xhat), torch.empty_like(xhat)
    partials = torch.empty((3, programs, n_cols), device=xhat.device, dtype=torch.float32)
    q, s = fp8 if fp8 is not None else (dx, rstd)  # (placeholders, never written without FP8)
    if programs > 0:
        K._bdrln_bwd_kernel[(programs,)](
            dy, xhat, weight, rstd, xhat if seed is None else seed, dx, dres, partials[0], partials[1],
            partials[2], q, s, n_rows, n_cols, rows_per_program, p, 1.0 / (1.0 - p),
            BLOCK_R=block_r, BLOCK_D=block_d, DROPOUT=seed is not None, FP8=fp8 is not None,
            NATIVE=xhat.is_cuda, num_warps=warps)
    dbias, dweight, dln_bias = _sum_partials(partials, (bias, weight, ln_bias))
    return dx, dbias, dres, dweight, dln_bias


def _sum_partials(partials: torch.Tensor, params: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, ...]:
    """Each [programs, C] fp32 partial buffer summed over its programs, in its parameter's dtype:
    one launch for all of them (kernels._sum_partials_kernel). Separate tensors, not views of one:
    a custom op's outputs may not alias each other."""
    outs = tuple(torch.empty_like(p) for p in params)
    n_sets, n_programs, n_cols = partials.shape
    if n_programs == 0:
        return tuple(o.zero_() for o in outs)
    block_c = min(256, triton.next_power_of_2(n_cols))
    K._sum_partials_kernel[(triton.cdiv(n_cols, block_c), n_sets)](
        partials, *(outs + (outs[0],) * (3 - n_sets)), n_programs, n_cols, BLOCK_P=8, BLOCK_C=block_c)
    return outs


# ---------------------------------------------------------------- custom ops (torch.compile)

@torch.library.custom_op("bertaccel::bias_gelu_fwd", mutates_args=())
def bias_gelu_fwd(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _bias_gelu_fwd_impl(x, bias)


@bias_gelu_fwd.register_fake
def _(x, bias):
    return torch.empty_like(x)


@torch.library.custom_op("bertaccel::bias_gelu_bwd", mutates_args=())
def bias_gelu_bwd(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return _bias_gelu_bwd_impl(dy, x, bias)


@bias_gelu_bwd.register_fake
def _(dy, x, bias):
    return torch.empty_like(x), torch.empty_like(bias)


def _bias_gelu_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # x, bias: x is what GELU's derivative needs


def _bias_gelu_backward(ctx, dy):
    x, bias = ctx.saved_tensors
    return bias_gelu_bwd(dy, x, bias)


bias_gelu_fwd.register_autograd(_bias_gelu_backward, setup_context=_bias_gelu_setup_context)


@torch.library.custom_op("bertaccel::bias_dropout_residual_layernorm_fwd", mutates_args=())
def layernorm_fwd(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  ln_bias: torch.Tensor, seed: Optional[torch.Tensor], p: float,
                  eps: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _layernorm_fwd_impl(x, bias, residual, weight, ln_bias, seed, p, eps)


@layernorm_fwd.register_fake
def _(x, bias, residual, weight, ln_bias, seed, p, eps):
    return torch.empty_like(x), torch.empty_like(x), x.new_empty((x.shape[0],), dtype=torch.float32)


@torch.library.custom_op("bertaccel::bias_dropout_residual_layernorm_bwd", mutates_args=())
def layernorm_bwd(dy: torch.Tensor, xhat: torch.Tensor, rstd: torch.Tensor, bias: torch.Tensor,
                  weight: torch.Tensor, ln_bias: torch.Tensor, seed: Optional[torch.Tensor],
                  p: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _layernorm_bwd_impl(dy, xhat, rstd, bias, weight, ln_bias, seed, p)


@layernorm_bwd.register_fake
def _(dy, xhat, rstd, bias, weight, ln_bias, seed, p):
    return (torch.empty_like(xhat), torch.empty_like(bias), torch.empty_like(xhat), torch.empty_like(weight),
            torch.empty_like(ln_bias))


def _layernorm_setup_context(ctx, inputs, output):
    _, bias, _, weight, ln_bias, seed, p, _ = inputs
    _, xhat, rstd = output
    # bias and ln_bias only for their dtypes (parameters: saving them copies nothing)
    ctx.save_for_backward(xhat, rstd, bias, weight, ln_bias, seed)
    ctx.p = p


def _layernorm_backward(ctx, dy, dxhat, drstd):
    # xhat and rstd are outputs only so that backward can have them; the public op returns y alone,
    # so nothing downstream gives them a gradient (dxhat, drstd are None or zeros).
    xhat, rstd, bias, weight, ln_bias, seed = ctx.saved_tensors
    dx, dbias, dres, dweight, dln_bias = layernorm_bwd(dy, xhat, rstd, bias, weight, ln_bias, seed, ctx.p)
    return dx, dbias, dres, dweight, dln_bias, None, None, None


layernorm_fwd.register_autograd(_layernorm_backward, setup_context=_layernorm_setup_context)


# ---------------------------------------------------------------- eager autograd functions

class _BiasGeluFn(torch.autograd.Function):
    """The bias-GELU kernels without the custom-op dispatcher, for eager mode."""

    @staticmethod
    def forward(ctx, x, bias):
        ctx.save_for_backward(x, bias)
        return _bias_gelu_fwd_impl(x, bias)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        return _bias_gelu_bwd_impl(dy, x, bias)


class _LayerNormFn(torch.autograd.Function):
    """The bias-dropout-residual-LayerNorm kernels without the custom-op dispatcher, for eager mode."""

    @staticmethod
    def forward(ctx, x, bias, residual, weight, ln_bias, seed, p, eps):
        y, xhat, rstd = _layernorm_fwd_impl(x, bias, residual, weight, ln_bias, seed, p, eps)
        ctx.save_for_backward(xhat, rstd, bias, weight, ln_bias, seed)
        ctx.p = p
        return y

    @staticmethod
    def backward(ctx, dy):
        xhat, rstd, bias, weight, ln_bias, seed = ctx.saved_tensors
        return (*_layernorm_bwd_impl(dy, xhat, rstd, bias, weight, ln_bias, seed, ctx.p), None, None, None)


# ---------------------------------------------------------------- public API

def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x + bias) with BERT's exact (erf) GELU, computed in fp32, returned in x's dtype.
    x: [N, I] contiguous fp32/fp16/bf16; bias: [I], fp32 or x's dtype. Differentiable in x and bias
    (dbias in bias's dtype, accumulated in fp32)."""
    _check_matrix("x", x)
    _check_vector("bias", bias, x)
    if torch.compiler.is_compiling():  # the custom op: opaque to dynamo, no graph break
        return bias_gelu_fwd(x, bias)
    return _BiasGeluFn.apply(x, bias)


def bias_dropout_residual_layernorm(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                                    weight: torch.Tensor, ln_bias: torch.Tensor, p: float, eps: float,
                                    seed: Optional[torch.Tensor] = None, training: bool = True) -> torch.Tensor:
    """LayerNorm(dropout(x + bias, p) + residual) * weight + ln_bias, row statistics in fp32.
    x, residual: [N, D] contiguous, one float dtype; bias, weight, ln_bias: [D], fp32 or x's dtype.
    Dropout only when training and p > 0; its mask is keyed by (seed, row * D + col): seed is a
    one-element int64 tensor on x's device (drawn from torch's generator there when None), and the
    same seed gives the same mask (dropout_keep_mask shows it). Returns y in x's dtype."""
    _check_layernorm(x, bias, residual, weight, ln_bias, p, eps, seed)
    p = float(p) if training else 0.0
    seed = _draw_seed(seed, p, x)
    if torch.compiler.is_compiling():  # the custom op: opaque to dynamo, no graph break
        return layernorm_fwd(x, bias, residual, weight, ln_bias, seed, p, float(eps))[0]
    return _LayerNormFn.apply(x, bias, residual, weight, ln_bias, seed, p, float(eps))


def dropout_keep_mask(seed: torch.Tensor, n: int, d: int, p: float) -> torch.Tensor:
    """[n, d] bool on seed's device: where bias_dropout_residual_layernorm keeps x + bias for this seed."""
    if n * d >= INT32_LIMIT:
        raise ValueError(f"n * d = {n * d} >= 2^31: int32 offsets would overflow")
    out = torch.empty((n, d), dtype=torch.int8, device=seed.device)
    block_r, block_d, warps = _row_tile(n, d, seed.device)
    if n > 0:
        K._keep_mask_kernel[(triton.cdiv(n, block_r),)](seed, out, n, d, float(p), BLOCK_R=block_r,
                                                         BLOCK_D=block_d, num_warps=warps)
    return out.bool()
