"""`fused_attention(q, k, v, key_mask, dropout_p)` over padded [B, H, S, D] batches,
`fused_attention_packed(q, k, v, cu_seqlens, max_seqlen, dropout_p)` over packed [T, H, D] tokens and
`fused_attention_packed_qkv(qkv, cu_seqlens, max_seqlen, dropout_p)` over packed tokens whose q, k, v
are the slices of one fused [T, 3, H, D] projection: the Triton kernels as torch custom ops.

The kernels take one stride set for q, k, v and their gradients and another for the output and its
gradient. The qkv form uses that: it reads q, k, v in place from the fused projection and its backward
writes dq, dk, dv straight into the three slices of one [T, 3, H, D] gradient, which the fused QKV
GEMM's backward takes as it is (no concatenation); the output is a plain [T, H, D].

The launch side (tiles, geometry, checks, layouts, the two launches) is triton_launch.py; this module
is the op forms built on it. Custom ops (torch.library) with a registered autograd formula and fake (meta) kernels, so
torch.compile treats the attention as one opaque op: no graph break in the attention, and
the dropout seed is a tensor drawn from torch's generator inside the graph (no .item()).
The packed path never reads cu_seqlens on the host (no sync): it can run inside CUDA-graph
capture, and max_seqlen, a host int, sizes its grid instead.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import triton

from . import triton_kernels as K
from .triton_launch import (_bwd_launch, _check, _check_packed, _check_packed_qkv, _empty_as, _empty_lse,
                            _fwd_launch, _geometry, _shared_layout)


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor],
              seed: Optional[torch.Tensor], dropout_p: float, sm_scale: float,
              cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Separate q, k, v: the output in q's layout (for BERT's views, merging the heads is then a view)."""
    q, k, v = _shared_layout(q, k, v)
    return _fwd_launch(q, k, v, _empty_as(q), key_mask, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen)


@torch.library.custom_op("bertaccel::fused_attention_fwd", mutates_args=())
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor],
                  seed: Optional[torch.Tensor], dropout_p: float, sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return _fwd_impl(q, k, v, key_mask, seed, dropout_p, sm_scale)


@attention_fwd.register_fake
def _(q, k, v, key_mask, seed, dropout_p, sm_scale):
    q, _, _ = _shared_layout(q, k, v)  # the real output's layout, as _fwd_impl chooses it
    return _empty_as(q), _empty_lse(q, _geometry(q, None, 0))


def _bwd_impl(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, key_mask: Optional[torch.Tensor], seed: Optional[torch.Tensor], dropout_p: float,
              sm_scale: float, cu_seqlens: Optional[torch.Tensor] = None,
              max_seqlen: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = _shared_layout(q, k, v)
    dq, dk, dv = _empty_as(q), _empty_as(q), _empty_as(q)
    _bwd_launch(do, q, k, v, o, lse, dq, dk, dv, key_mask, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen)
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


@torch.library.custom_op("bertaccel::fused_attention_packed_fwd", mutates_args=())
def attention_packed_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                         seed: Optional[torch.Tensor], max_seqlen: int, dropout_p: float,
                         sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return _fwd_impl(q, k, v, None, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen)


@attention_packed_fwd.register_fake
def _(q, k, v, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale):
    q, _, _ = _shared_layout(q, k, v)
    return _empty_as(q), _empty_lse(q, _geometry(q, cu_seqlens, max_seqlen))


@torch.library.custom_op("bertaccel::fused_attention_packed_bwd", mutates_args=())
def attention_packed_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                         lse: torch.Tensor, cu_seqlens: torch.Tensor, seed: Optional[torch.Tensor], max_seqlen: int,
                         dropout_p: float, sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(do, q, k, v, o, lse, None, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen)


@attention_packed_bwd.register_fake
def _(do, q, k, v, o, lse, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale):
    q, _, _ = _shared_layout(q, k, v)
    return _empty_as(q), _empty_as(q), _empty_as(q)


def _packed_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_seqlens, seed)
    ctx.max_seqlen, ctx.dropout_p, ctx.sm_scale = max_seqlen, dropout_p, sm_scale


def _packed_backward(ctx, do, dlse):
    q, k, v, o, lse, cu_seqlens, seed = ctx.saved_tensors
    dq, dk, dv = attention_packed_bwd(do, q, k, v, o, lse, cu_seqlens, seed, ctx.max_seqlen, ctx.dropout_p,
                                      ctx.sm_scale)
    return dq, dk, dv, None, None, None, None, None


attention_packed_fwd.register_autograd(_packed_backward, setup_context=_packed_setup_context)


def _qkv_fwd_impl(qkv: torch.Tensor, cu_seqlens: torch.Tensor, seed: Optional[torch.Tensor], max_seqlen: int,
                  dropout_p: float, sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k, v read in place as the slices of qkv (they share its strides); o [T, H, D] contiguous."""
    q, k, v = qkv.unbind(1)
    return _fwd_launch(q, k, v, q.new_empty(q.shape), None, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen)


def _qkv_bwd_impl(do: torch.Tensor, qkv: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, cu_seqlens: torch.Tensor,
                  seed: Optional[torch.Tensor], max_seqlen: int, dropout_p: float, sm_scale: float) -> torch.Tensor:
    """dq, dk, dv written by the kernel into the slices of one contiguous [T, 3, H, D] dqkv. The kernels read
    q, k, v with the gradients' strides, so a qkv in another layout (not a view of the [T, 3*H*D] GEMM output)
    is copied here, once; the forward read it in place."""
    dqkv = qkv.new_empty(qkv.shape)
    if not qkv.is_contiguous():
        qkv = qkv.contiguous()
    q, k, v = qkv.unbind(1)
    dq, dk, dv = dqkv.unbind(1)
    _bwd_launch(do, q, k, v, o, lse, dq, dk, dv, None, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen)
    return dqkv


@torch.library.custom_op("bertaccel::fused_attention_packed_qkv_fwd", mutates_args=())
def attention_packed_qkv_fwd(qkv: torch.Tensor, cu_seqlens: torch.Tensor, seed: Optional[torch.Tensor],
                             max_seqlen: int, dropout_p: float, sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return _qkv_fwd_impl(qkv, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale)


@attention_packed_qkv_fwd.register_fake
def _(qkv, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale):
    q = qkv.select(1, 0)
    return q.new_empty(q.shape), _empty_lse(q, _geometry(q, cu_seqlens, max_seqlen))


@torch.library.custom_op("bertaccel::fused_attention_packed_qkv_bwd", mutates_args=())
def attention_packed_qkv_bwd(do: torch.Tensor, qkv: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                             cu_seqlens: torch.Tensor, seed: Optional[torch.Tensor], max_seqlen: int,
                             dropout_p: float, sm_scale: float) -> torch.Tensor:
    return _qkv_bwd_impl(do, qkv, o, lse, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale)


@attention_packed_qkv_bwd.register_fake
def _(do, qkv, o, lse, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale):
    return qkv.new_empty(qkv.shape)


def _packed_qkv_setup_context(ctx, inputs, output):
    qkv, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale = inputs
    o, lse = output
    ctx.save_for_backward(qkv, o, lse, cu_seqlens, seed)
    ctx.max_seqlen, ctx.dropout_p, ctx.sm_scale = max_seqlen, dropout_p, sm_scale


def _packed_qkv_backward(ctx, do, dlse):
    qkv, o, lse, cu_seqlens, seed = ctx.saved_tensors
    dqkv = attention_packed_qkv_bwd(do, qkv, o, lse, cu_seqlens, seed, ctx.max_seqlen, ctx.dropout_p, ctx.sm_scale)
    return dqkv, None, None, None, None, None


attention_packed_qkv_fwd.register_autograd(_packed_qkv_backward, setup_context=_packed_qkv_setup_context)


class _EagerFn(torch.autograd.Function):
    """The same kernels without the custom-op dispatcher, for eager mode: torch.library's
    Python dispatch costs per call, and BERT calls attention twice per layer per step.
    Padded (key_mask, cu_seqlens None) or packed (cu_seqlens, max_seqlen; key_mask None)."""

    @staticmethod
    def forward(ctx, q, k, v, key_mask, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen):
        o, lse = _fwd_impl(q, k, v, key_mask, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen)
        ctx.save_for_backward(q, k, v, o, lse, key_mask, seed, cu_seqlens)
        ctx.dropout_p, ctx.sm_scale, ctx.max_seqlen = dropout_p, sm_scale, max_seqlen
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, key_mask, seed, cu_seqlens = ctx.saved_tensors
        grads = _bwd_impl(do, q, k, v, o, lse, key_mask, seed, ctx.dropout_p, ctx.sm_scale, cu_seqlens,
                          ctx.max_seqlen)
        return (*grads, None, None, None, None, None, None)


class _EagerQKVFn(torch.autograd.Function):
    """The qkv form without the dispatcher (see _EagerFn): one [T, 3, H, D] input, one gradient."""

    @staticmethod
    def forward(ctx, qkv, seed, dropout_p, sm_scale, cu_seqlens, max_seqlen):
        o, lse = _qkv_fwd_impl(qkv, cu_seqlens, seed, max_seqlen, dropout_p, sm_scale)
        ctx.save_for_backward(qkv, o, lse, seed, cu_seqlens)
        ctx.dropout_p, ctx.sm_scale, ctx.max_seqlen = dropout_p, sm_scale, max_seqlen
        return o

    @staticmethod
    def backward(ctx, do):
        qkv, o, lse, seed, cu_seqlens = ctx.saved_tensors
        dqkv = _qkv_bwd_impl(do, qkv, o, lse, cu_seqlens, seed, ctx.max_seqlen, ctx.dropout_p, ctx.sm_scale)
        return dqkv, None, None, None, None, None


def _call_args(dropout_p: float, sm_scale: Optional[float], seed: Optional[torch.Tensor],
               q: torch.Tensor) -> Tuple[float, Optional[torch.Tensor], float]:
    """(dropout_p, seed, scale) as the ops take them. The dropout seed is drawn from torch's generator on the
    device when not given (no host sync); the scale defaults to 1/sqrt(D)."""
    dropout_p = float(dropout_p)
    if dropout_p > 0 and seed is None:
        seed = torch.randint(0, 2 ** 31 - 1, (1,), device=q.device, dtype=torch.int64)
    return dropout_p, seed, float(sm_scale or 1.0 / math.sqrt(q.shape[-1]))


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor] = None,
                    dropout_p: float = 0.0, sm_scale: Optional[float] = None,
                    seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(q k^T * scale, keys masked by key_mask) with dropout, times v. q/k/v: [B, H, S, D]
    (any strides; a [B, S, H, D] tensor's transpose is taken without a copy).

    key_mask: [B, S], nonzero = attend (None = all keys). seed: int64 scalar tensor (drawn from
    torch's generator when None and dropout_p > 0); the same seed gives the same dropout mask.
    """
    _check(q, k, v, key_mask)
    dropout_p, seed, scale = _call_args(dropout_p, sm_scale, seed, q)
    if torch.compiler.is_compiling():  # the custom op: opaque to dynamo, no graph break
        return attention_fwd(q, k, v, key_mask, seed, dropout_p, scale)[0]
    return _EagerFn.apply(q, k, v, key_mask, seed, dropout_p, scale, None, 0)


def fused_attention_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                           max_seqlen: int, dropout_p: float = 0.0, sm_scale: Optional[float] = None,
                           seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention over packed tokens: q/k/v [T, H, D] (any strides with unit stride on D, e.g. views
    of [T, H*D] projections, read in place), N sequences concatenated; each token attends to the keys
    of its own sequence only. cu_seqlens: int32 [N+1] on q's device, cu_seqlens[0] = 0, cu_seqlens[N]
    = T, empty sequences allowed. max_seqlen: a host int >= every sequence's length (a bound is
    enough); it sizes the grid and keys dropout: at dropout_p > 0 the mask depends on it, as the
    padded one depends on S. Returns [T, H, D] in q's layout. Never syncs the host."""
    _check_packed(q, k, v, cu_seqlens, max_seqlen)
    dropout_p, seed, scale = _call_args(dropout_p, sm_scale, seed, q)
    if torch.compiler.is_compiling():  # the custom op: opaque to dynamo, no graph break
        return attention_packed_fwd(q, k, v, cu_seqlens, seed, max_seqlen, dropout_p, scale)[0]
    return _EagerFn.apply(q, k, v, None, seed, dropout_p, scale, cu_seqlens, max_seqlen)


def fused_attention_packed_qkv(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                               dropout_p: float = 0.0, sm_scale: Optional[float] = None,
                               seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fused_attention_packed with q, k, v = qkv.unbind(1): qkv [T, 3, H, D], e.g. the [T, 3*H*D] output of one
    fused QKV GEMM viewed as [T, 3, H, D] (unit stride along D, any strides otherwise), read in place.
    Returns o [T, H, D] contiguous. Its backward gives qkv one contiguous [T, 3, H, D] gradient, dq, dk, dv
    written into its slices by the kernel (a qkv that is not contiguous is copied once in the backward).
    cu_seqlens, max_seqlen, dropout_p, sm_scale and seed as in fused_attention_packed: the same seed and
    max_seqlen give the same dropout mask, and the same numbers. Never syncs the host."""
    _check_packed_qkv(qkv, cu_seqlens, max_seqlen)
    dropout_p, seed, scale = _call_args(dropout_p, sm_scale, seed, qkv)
    if torch.compiler.is_compiling():  # the custom op: opaque to dynamo, no graph break
        return attention_packed_qkv_fwd(qkv, cu_seqlens, seed, max_seqlen, dropout_p, scale)[0]
    return _EagerQKVFn.apply(qkv, seed, dropout_p, scale, cu_seqlens, max_seqlen)


def dropout_keep_mask(seed: torch.Tensor, bsz: int, heads: int, seq: int, dropout_p: float) -> torch.Tensor:
    """[B, H, S, S] bool: which attention probabilities the kernels keep for this seed."""
    out = torch.empty((bsz, heads, seq, seq), dtype=torch.int8, device=seed.device)
    block = 16 if seq <= 16 else 32
    K._keep_mask_kernel[(triton.cdiv(seq, block), bsz * heads)](seed, out, float(dropout_p), seq, BLOCK=block)
    return out.bool()
