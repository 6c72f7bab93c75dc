"""`fused_attention(q, k, v, key_mask, dropout_p)`: the Triton kernels as torch custom ops.

Custom ops (torch.library) with a registered autograd formula and fake (meta) kernels, so
torch.compile treats the attention as one opaque op: no graph break in the attention, and
the dropout seed is a tensor drawn from torch's generator inside the graph (no .item()).
"""
from __future__ import annotations

import math
import os
from typing import Optional, Tuple

import torch
import triton

from . import triton_kernels as K

HEAD_DIMS = (16, 32, 64, 128)
MAX_SEQ = 512


def _blocks(head_dim: int, seq: int) -> Tuple[int, int]:
    """(BLOCK_M, BLOCK_N): 64x64 tiles for BERT sizes, 32 for d=128 (registers), 16 for tiny S.
    Fixed rather than autotuned: with dynamic padding every new S would re-tune (measured: 300
    ms/step in a training run on an H200), and tuning did not move the B=32, S=128 op time."""
    b = 32 if head_dim == 128 else 64
    small = max(16, triton.next_power_of_2(seq))
    return min(b, small), min(b, small)


_block_override: Optional[Tuple[int, int]] = None  # tests: force several column blocks at small S


def _launch_args(q: torch.Tensor):
    bsz, heads, seq, dim = q.shape
    bm, bn = _block_override or _blocks(dim, seq)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32: exact products, not TF32
    upcast = q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"  # see _dot
    return bsz, heads, seq, dim, bm, bn, precision, upcast


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor]) -> None:
    if not (q.shape == k.shape == v.shape) or q.dim() != 4:
        raise ValueError(f"q, k, v must share a [B, H, S, D] shape; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    bsz, heads, seq, dim = q.shape
    if dim not in HEAD_DIMS:
        raise ValueError(f"head dim {dim} unsupported; use one of {HEAD_DIMS}")
    if seq > MAX_SEQ:
        raise ValueError(f"sequence length {seq} > {MAX_SEQ} (BERT positions)")
    if key_mask is not None and key_mask.shape != (bsz, seq):
        raise ValueError(f"key_mask must be [B, S] = {(bsz, seq)}; got {tuple(key_mask.shape)}")
    if bsz * heads * seq * seq >= 2 ** 31:
        raise ValueError("B*H*S*S >= 2^31: the dropout counter would overflow int32; split the batch")


def _shared_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q, k, v with one stride set and unit stride along D, as the kernels take one set of strides.
    BERT's q/k/v are [B, S, H, D] projections viewed as [B, H, S, D]: they already share one, so
    nothing is copied. Works on fake tensors too, so the custom op's fakes follow the same rule."""
    s = q.stride()
    if s[-1] == 1 and k.stride() == s and v.stride() == s:
        return q, k, v
    return q.contiguous(), k.contiguous(), v.contiguous()


def _like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t in ref's layout (a copy only when the strides differ)."""
    if t.stride() == ref.stride():
        return t
    return torch.empty_like(ref).copy_(t)


def _empty_as(q: torch.Tensor) -> torch.Tensor:
    """An output in q's layout: empty_like keeps it whenever q is dense, else the strides are set."""
    return _like(torch.empty_like(q), q)


def _mask_arg(key_mask: Optional[torch.Tensor], q: torch.Tensor):
    """(pointer, row stride, HAS_MASK): bool and integer masks are read as they are (no conversion
    kernel); without a mask the kernel never reads the pointer."""
    if key_mask is None:
        return q, 0, False
    if key_mask.dtype.is_floating_point:
        key_mask = key_mask != 0
    if key_mask.stride(-1) != 1:
        key_mask = key_mask.contiguous()
    return key_mask, key_mask.stride(0), True


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor],
              seed: Optional[torch.Tensor], dropout_p: float, sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _shared_layout(q, k, v)
    bsz, heads, seq, dim, bm, bn, precision, upcast = _launch_args(q)
    o = _empty_as(q)
    lse = torch.empty((bsz, heads, seq), device=q.device, dtype=torch.float32)
    mask, mask_stride, has_mask = _mask_arg(key_mask, q)
    K._fwd_kernel[(triton.cdiv(seq, bm), bsz * heads)](
        q, k, v, mask, q if seed is None else seed, o, lse, sm_scale, dropout_p, seq, heads,
        q.stride(0), q.stride(1), q.stride(2), mask_stride,
        HEAD_DIM=dim, BLOCK_M=bm, BLOCK_N=bn, HAS_MASK=has_mask, DROPOUT=dropout_p > 0,
        PRECISION=precision, UPCAST=upcast)
    return o, lse


@torch.library.custom_op("bertaccel::fused_attention_fwd", mutates_args=())
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor],
                  seed: Optional[torch.Tensor], dropout_p: float, sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return _fwd_impl(q, k, v, key_mask, seed, dropout_p, sm_scale)


@attention_fwd.register_fake
def _(q, k, v, key_mask, seed, dropout_p, sm_scale):
    q, _, _ = _shared_layout(q, k, v)  # the real output's layout, as _fwd_impl chooses it
    return _empty_as(q), q.new_empty(q.shape[:3], dtype=torch.float32)


def _bwd_impl(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, key_mask: Optional[torch.Tensor], seed: Optional[torch.Tensor], dropout_p: float,
              sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = _shared_layout(q, k, v)
    o, do = _like(o, q), _like(do, q)
    bsz, heads, seq, dim, bm, bn, precision, upcast = _launch_args(q)
    dq, dk, dv = _empty_as(q), _empty_as(q), _empty_as(q)
    mask, mask_stride, has_mask = _mask_arg(key_mask, q)
    K._bwd_kernel[(triton.cdiv(seq, min(bm, bn)), bsz * heads)](
        q, k, v, o, do, mask, q if seed is None else seed, lse, dq, dk, dv, sm_scale, dropout_p, seq, heads,
        q.stride(0), q.stride(1), q.stride(2), mask_stride,
        HEAD_DIM=dim, BLOCK_M=bm, BLOCK_N=bn, HAS_MASK=has_mask, DROPOUT=dropout_p > 0,
        PRECISION=precision, UPCAST=upcast)
    return dq, dk, dv


@torch.library.custom_op("bertaccel::fused_attention_bwd", mutates_args=())
def attention_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                  lse: torch.Tensor, key_mask: Optional[torch.Tensor], seed: Optional[torch.Tensor], dropout_p: float,
                  sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(do, q, k, v, o, lse, key_mask, seed, dropout_p, sm_scale)


@attention_bwd.register_fake
def _(do, q, k, v, o, lse, key_mask, seed, dropout_p, sm_scale):
    q, _, _ = _shared_layout(q, k, v)
    return _empty_as(q), _empty_as(q), _empty_as(q)


def _setup_context(ctx, inputs, output):
    q, k, v, key_mask, seed, dropout_p, sm_scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, key_mask, seed)
    ctx.dropout_p, ctx.sm_scale = dropout_p, sm_scale


def _backward(ctx, do, dlse):
    q, k, v, o, lse, key_mask, seed = ctx.saved_tensors
    dq, dk, dv = attention_bwd(do, q, k, v, o, lse, key_mask, seed, ctx.dropout_p, ctx.sm_scale)
    return dq, dk, dv, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerFn(torch.autograd.Function):
    """The same kernels without the custom-op dispatcher, for eager mode: torch.library's
    Python dispatch costs per call, and BERT calls attention twice per layer per step."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, seed, dropout_p, sm_scale):
        o, lse = _fwd_impl(q, k, v, key_mask, seed, dropout_p, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse, key_mask, seed)
        ctx.dropout_p, ctx.sm_scale = dropout_p, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, key_mask, seed = ctx.saved_tensors
        return (*_bwd_impl(do, q, k, v, o, lse, key_mask, seed, ctx.dropout_p, ctx.sm_scale),
                None, None, None, None)


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor] = None,
                    dropout_p: float = 0.0, sm_scale: Optional[float] = None,
                    seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(q k^T * scale, keys masked by key_mask) with dropout, times v. q/k/v: [B, H, S, D]
    (any strides; a [B, S, H, D] tensor's transpose is taken without a copy).

    key_mask: [B, S], nonzero = attend (None = all keys). seed: int64 scalar tensor (drawn from
    torch's generator when None and dropout_p > 0); the same seed gives the same dropout mask.
    """
    _check(q, k, v, key_mask)
    dropout_p = float(dropout_p)
    if dropout_p > 0 and seed is None:
        seed = torch.randint(0, 2 ** 31 - 1, (1,), device=q.device, dtype=torch.int64)
    scale = float(sm_scale or 1.0 / math.sqrt(q.shape[-1]))
    if torch.compiler.is_compiling():  # the custom op: opaque to dynamo, no graph break
        return attention_fwd(q, k, v, key_mask, seed, dropout_p, scale)[0]
    return _EagerFn.apply(q, k, v, key_mask, seed, dropout_p, scale)


def dropout_keep_mask(seed: torch.Tensor, bsz: int, heads: int, seq: int, dropout_p: float) -> torch.Tensor:
    """[B, H, S, S] bool: which attention probabilities the kernels keep for this seed."""
    out = torch.empty((bsz, heads, seq, seq), dtype=torch.int8, device=seed.device)
    block = 16 if seq <= 16 else 32
    K._keep_mask_kernel[(triton.cdiv(seq, block), bsz * heads)](seed, out, float(dropout_p), seq, BLOCK=block)
    return out.bool()
