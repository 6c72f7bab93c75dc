"""The launch side of our Triton attention (bertaccel/attention/triton_kernels.py): tile sizes, the
geometry and strides the kernels index by, input checks, layouts, and the two launches (forward,
backward) that every op form of triton_attention.py shares. No torch.library or autograd here:
triton_attention.py builds its custom ops and autograd functions on these.
"""
from __future__ import annotations

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


# Triton's interpreter (no CUDA: the CPU tests) runs each program and each key block's operations
# one by one in Python: its time grows with the number of tiles, not their size, and no register
# file bounds one. Its tiles cover the sequence, up to this length (packed: the longest sequence).
INTERPRETER_MAX_TILE = 128


def _interpreter_blocks(seq: int) -> Tuple[int, int]:
    b = min(INTERPRETER_MAX_TILE, max(16, triton.next_power_of_2(seq)))
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
    bm, bn = _block_override or (_interpreter_blocks(g.seq) if not q.is_cuda else
                                 _packed_blocks(g.dim, q.dtype) if varlen else _blocks(g.dim, g.seq, q.dtype))
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
    q, k, v = qkv.unbind(1)
    _check_packed(q, k, v, cu_seqlens, max_seqlen)


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
