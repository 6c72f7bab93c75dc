"""`fused_attention(q, k, v, key_mask, dropout_p)` over padded [B, H, S, D] batches,
`fused_attention_packed(q, k, v, cu_seqlens, max_seqlen, dropout_p)` over packed [T, H, D] tokens and
`fused_attention_packed_qkv(qkv, cu_seqlens, max_seqlen, dropout_p)` over packed tokens whose q, k, v
are the slices of one fused [T, 3, H, D] projection: the Triton kernels as torch custom ops.

The kernels take one stride set for q, k, v and their gradients and another for the output and its
gradient. The qkv form uses that: it reads q, k, v in place from the fused projection and its backward
writes dq, dk, dv straight into the three slices of one [T, 3, H, D] gradient, which the fused QKV
GEMM's backward takes as it is (no concatenation); the output is a plain [T, H, D].

Custom ops (torch.library) with a registered autograd formula and fake (meta) kernels, so
torch.compile treats the attention as one opaque op: no graph break in the attention, and
the dropout seed is a tensor drawn from torch's generator inside the graph (no .item()).
The packed path never reads cu_seqlens on the host (no sync): it can run inside CUDA-graph
capture, and max_seqlen, a host int, sizes its grid instead.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple, Optional, Tuple

import torch
import triton

from . import triton_kernels as K

HEAD_DIMS = (16, 32, 64, 128)
MAX_SEQ = 512
INT32_LIMIT = 2 ** 31


def _tile(head_dim: int, dtype: torch.dtype) -> int:
    """64x64 tiles for fp16/bf16 at BERT sizes, 32 for d=128 (registers) and for fp32. fp32 takes
    exact ("ieee") dots, FMA code the size of the tile: 64x64 tiles at d=64 spilled registers
    (10.2 ms per B=32 S=128 fwd+bwd against 0.82 ms with 32x32, H100) and took 27 s to compile
    against 9 s; at d=32, 16 s against 8 s. In half precision 32 and 64 timed the same."""
    return 32 if head_dim == 128 or dtype == torch.float32 else 64


def _blocks(head_dim: int, seq: int, dtype: torch.dtype) -> Tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the padded kernel: _tile's, 16 for tiny S. Fixed rather than
    autotuned: with dynamic padding every new S would re-tune (measured: 300 ms/step in a training
    run on an H200), and tuning did not move the B=32, S=128 op time."""
    b = _tile(head_dim, dtype)
    small = max(16, triton.next_power_of_2(seq))
    return min(b, small), min(b, small)


def _packed_blocks(head_dim: int, dtype: torch.dtype) -> Tuple[int, int]:
    """Packed tokens: the tiles do not depend on max_seqlen, which moves from batch to batch, so
    a run compiles one variant per dtype / head dim / dropout, not one per length."""
    b = _tile(head_dim, dtype)
    return b, b


_block_override: Optional[Tuple[int, int]] = None  # tests: force several column blocks at small S


class _Geometry(NamedTuple):
    """What the kernels index by: nseq sequences (batch rows or packed sequences) of heads heads,
    seq rows per sequence in the grid / LSE / dropout counter."""
    nseq: int
    heads: int
    seq: int
    dim: int


def _geometry(q: torch.Tensor, cu_seqlens: Optional[torch.Tensor], max_seqlen: int) -> _Geometry:
    if cu_seqlens is None:
        return _Geometry(*q.shape)
    _, heads, dim = q.shape
    return _Geometry(cu_seqlens.shape[0] - 1, heads, max_seqlen, dim)


def _strides(t: torch.Tensor, varlen: bool) -> Tuple[int, int, int]:
    """One of the kernels' stride sets, (batch, head, row), in elements: of a [B, H, S, D] tensor, or of a packed
    [T, H, D] one, whose rows are tokens and which has no batch stride (sequence starts are loaded)."""
    if varlen:
        return 0, t.stride(1), t.stride(0)
    return t.stride(0), t.stride(1), t.stride(2)


def _empty_lse(q: torch.Tensor, g: _Geometry) -> torch.Tensor:
    return q.new_empty((g.nseq, g.heads, g.seq), dtype=torch.float32)


def _launch_args(q: torch.Tensor, g: _Geometry, varlen: bool):
    bm, bn = _block_override or (_packed_blocks(g.dim, q.dtype) if varlen else _blocks(g.dim, g.seq, q.dtype))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32: exact products, not TF32
    upcast = q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"  # see _dot
    return bm, bn, precision, upcast


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor]) -> None:
    if not (q.shape == k.shape == v.shape) or q.dim() != 4:
        raise ValueError(f"q, k, v must share a [B, H, S, D] shape; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    bsz, heads, seq, dim = q.shape
    if dim not in HEAD_DIMS:
        raise ValueError(f"head dim {dim} unsupported; use one of {HEAD_DIMS}")
    if seq > MAX_SEQ:
        raise ValueError(f"sequence length {seq} > {MAX_SEQ} (BERT positions)")
    if key_mask is not None and key_mask.shape != (bsz, seq):
        raise ValueError(f"key_mask must be [B, S] = {(bsz, seq)}; got {tuple(key_mask.shape)}")
    if bsz * heads * seq * seq >= INT32_LIMIT:
        raise ValueError("B*H*S*S >= 2^31: the dropout counter would overflow int32; split the batch")


def _check_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen) -> None:
    """Shapes, dtypes and int32 ranges only: nothing here reads cu_seqlens' values (no host sync),
    so that cu_seqlens[0] == 0, cu_seqlens[N] == T and max_seqlen >= every length are the caller's."""
    if not (q.shape == k.shape == v.shape) or q.dim() != 3:
        raise ValueError(f"packed q, k, v must share a [T, H, D] shape; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    total, heads, dim = q.shape
    if dim not in HEAD_DIMS:
        raise ValueError(f"head dim {dim} unsupported; use one of {HEAD_DIMS}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 \
            or cu_seqlens.shape[0] < 2:
        got = (cu_seqlens.dtype, tuple(cu_seqlens.shape)) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens)
        raise ValueError(f"cu_seqlens must be an int32 tensor of shape [N+1], N >= 1 sequences; got {got}")
    if cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens is on {cu_seqlens.device}, q on {q.device}: the kernel reads it on q's device")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, torch.SymInt)) or max_seqlen < 1:
        raise ValueError(f"max_seqlen must be a host int >= 1 (a bound on every sequence's length); got {max_seqlen!r}")
    if (cu_seqlens.shape[0] - 1) * heads * max_seqlen * max_seqlen >= INT32_LIMIT:
        raise ValueError("N*H*max_seqlen^2 >= 2^31: the dropout counter would overflow int32; split the batch")
    if total * max(q.stride(0), k.stride(0), v.stride(0), heads * dim) >= INT32_LIMIT:
        raise ValueError("T * token stride >= 2^31: the kernels' int32 element offsets would overflow; split the batch")


def _check_packed_qkv(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen) -> None:
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv must be [T, 3, H, D]; got {tuple(qkv.shape)}")
    if qkv.stride(-1) != 1:
        raise ValueError(f"qkv must have unit stride along D (it is read in place); got strides {qkv.stride()}")
    _check_packed(*qkv.unbind(1), cu_seqlens, max_seqlen)


def _shared_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """q, k, v with one stride set and unit stride along D, as the kernels take one set of strides for q, k, v
    and their gradients (allocated in q's layout by _empty_as). BERT's q/k/v are [B, S, H, D] projections
    viewed as [B, H, S, D] (packed: [T, H*D] viewed as [T, H, D]): they already share one, so nothing is
    copied. Works on fake tensors too, so the custom op's fakes follow the same rule."""
    s = q.stride()
    if s[-1] == 1 and k.stride() == s and v.stride() == s and _dense(q):
        return q, k, v
    return q.contiguous(), k.contiguous(), v.contiguous()


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (a permuted contiguous tensor): exactly when empty_like keeps its strides,
    so the gradients, allocated in q's layout, can share q's stride set. Slices of a fused [.., 3, H, D]
    projection are not: their gradients would come out contiguous, with other strides (the qkv form
    instead allocates one [T, 3, H, D] gradient, whose slices have the strides of a contiguous qkv's)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


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


def _fwd_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, key_mask: Optional[torch.Tensor],
                seed: Optional[torch.Tensor], dropout_p: float, sm_scale: float, cu_seqlens: Optional[torch.Tensor],
                max_seqlen: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Writes o (its own strides, unit along D) from q, k, v (one shared stride set, unit along D); returns o and
    the LSE: padded (cu_seqlens None: [B, H, S, D], LSE [B, H, S]) or packed ([T, H, D], LSE [N, H, max_seqlen])."""
    varlen = cu_seqlens is not None
    g = _geometry(q, cu_seqlens, max_seqlen)
    bm, bn, precision, upcast = _launch_args(q, g, varlen)
    lse = _empty_lse(q, g)
    mask, mask_stride, has_mask = _mask_arg(key_mask, q)
    # Placeholders (q) for the seed and cu_seqlens pointers a variant never reads.
    K._fwd_kernel[(triton.cdiv(g.seq, bm), g.nseq * g.heads)](
        q, k, v, mask, q if seed is None else seed, q if cu_seqlens is None else cu_seqlens, o, lse, sm_scale,
        dropout_p, g.seq, g.heads, *_strides(q, varlen), *_strides(o, varlen), mask_stride,
        HEAD_DIM=g.dim, BLOCK_M=bm, BLOCK_N=bn, HAS_MASK=has_mask, VARLEN=varlen,
        DROPOUT=dropout_p > 0, PRECISION=precision, UPCAST=upcast)
    return o, lse


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


def _bwd_launch(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                key_mask: Optional[torch.Tensor], seed: Optional[torch.Tensor], dropout_p: float, sm_scale: float,
                cu_seqlens: Optional[torch.Tensor], max_seqlen: int) -> None:
    """Writes dq, dk, dv, which must share q, k, v's stride set. o is the forward's (dense, unit stride along D);
    dO is read with o's strides, so it is copied only when autograd hands it over in another layout."""
    do = _like(do, o)
    varlen = cu_seqlens is not None
    g = _geometry(q, cu_seqlens, max_seqlen)
    bm, bn, precision, upcast = _launch_args(q, g, varlen)
    mask, mask_stride, has_mask = _mask_arg(key_mask, q)
    K._bwd_kernel[(triton.cdiv(g.seq, min(bm, bn)), g.nseq * g.heads)](
        q, k, v, o, do, mask, q if seed is None else seed, q if cu_seqlens is None else cu_seqlens, lse, dq, dk, dv,
        sm_scale, dropout_p, g.seq, g.heads, *_strides(q, varlen), *_strides(o, varlen), mask_stride,
        HEAD_DIM=g.dim, BLOCK_M=bm, BLOCK_N=bn, HAS_MASK=has_mask, VARLEN=varlen,
        DROPOUT=dropout_p > 0, PRECISION=precision, UPCAST=upcast)


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
    _bwd_launch(do, *qkv.unbind(1), o, lse, *dqkv.unbind(1), None, seed, dropout_p, sm_scale, cu_seqlens,
                max_seqlen)
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
