"""Fused BERT self-attention in Triton: forward and backward, FlashAttention-2 style.

Forward (one program per BLOCK_M query rows of one (batch, head)): stream over key blocks with
an online softmax (running max m and normalizer l), so the S x S score matrix never exists in
memory; the key-padding mask and the sequence tail are -inf before the softmax; dropout is
applied to the probabilities that multiply V, from a Philox stream keyed by (seed, position),
and 1/(1-p) rescales the kept ones. The softmax normalizer always uses the undropped
probabilities, so it is correct across column blocks (seed 000's block-local softmax was not).
The log-sum-exp per row is saved for the backward.

Backward, one kernel: program i computes dK/dV of key block i (over all query blocks) and then
dQ of query block i (over all key blocks), with delta = rowsum(dO * O) (holds with dropout too:
O = (P o Z/(1-p)) V) computed per query block where needed. Both recompute
P = exp(QK^T*scale - lse) and regenerate the dropout mask from the same seed and positions, so no
S x S tensor is stored. One launch forward and one backward: at BERT sizes (B=32, S=128) the
host cost of a launch is larger than the kernel's GPU time, so launches are what to save.

The kernels take two stride sets: one for Q, K, V and their gradients dQ, dK, dV (the wrapper makes
them share a layout, usually free: [B, S, H, D] projections viewed as [B, H, S, D] need no copy), and
one for O and dO. With its own set, O can be laid out apart from the inputs: packed Q, K, V can be the
three slices of one fused [T, 3, H, D] projection, read in place, with dQ, dK, dV written into the
slices of one [T, 3, H, D] gradient (the fused QKV GEMM's backward then reads it as it is), while O
is a plain [T, H, D]; and dO need only match O, not Q.

Packed (VARLEN) tokens: Q, K, V are [T, H, D], N sequences concatenated, cu_seqlens [N+1] gives
their starts. The same kernels run with the "batch" index as the sequence index: its start and
length L are loaded on the device (the host never reads cu_seqlens, so no sync, and the launch can
be captured in a CUDA graph), and L replaces S for loop bounds and row/column validity. S is then
max_seqlen: it sizes the grid and stays the row stride of the LSE buffer and of the dropout
counter, so the Philox keying is the padded one with B = N and S = max_seqlen. A program whose
block starts at or past its sequence's end does nothing (an `if` around the body, not an early
return). S and the mask's row stride are not specialized on (do_not_specialize): Triton would
otherwise compile a variant per "S divisible by 16 / S == 1" class, i.e. re-JIT as padding moves.

fp16/bf16 inputs use tensor-core dots with fp32 accumulation; fp32 inputs use exact ("ieee")
dots, not TF32. Head dims: 16..128, powers of two.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST only under TRITON_INTERPRET with bf16: the interpreter's tl.dot mis-reads bf16
    # operands (a 16x16 product came out 2e10 off), so there the operands go in as fp32.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _load_rows(ptr, base, rows, offs_d, stride_s, ok):
    """A [rows, HEAD_DIM] tile of a [B, H, S, D] (or packed [T, H, D]) tensor; rows not ok read as 0."""
    return tl.load(ptr + base + rows[:, None] * stride_s + offs_d[None, :], mask=ok[:, None], other=0.0)


@triton.jit
def _store_rows(ptr, base, rows, offs_d, stride_s, ok, tile):
    """Write a [rows, HEAD_DIM] fp32 tile into a [B, H, S, D] (or [T, H, D]) tensor in its dtype; rows not ok
    skipped."""
    tl.store(ptr + base + rows[:, None] * stride_s + offs_d[None, :], tile.to(ptr.dtype.element_ty),
             mask=ok[:, None])


@triton.jit
def _sequence(Cu, off_hz, S, H, stride_b, stride_h, stride_s, stride_ob, stride_oh, stride_os,
              VARLEN: tl.constexpr):
    """(b, base, obase, L) of one (sequence, head) program: the batch row or packed sequence index,
    the offset of its first row for this head in Q, K, V, dQ, dK, dV (base) and in O, dO (obase,
    their own strides), and its length: S padded; packed, loaded from cu_seqlens.
    (One return statement: see _seed.)"""
    b = off_hz // H
    h = off_hz % H
    if VARLEN:
        start = tl.load(Cu + b)
        length = tl.load(Cu + b + 1) - start
        base = start * stride_s + h * stride_h
        obase = start * stride_os + h * stride_oh
    else:
        length = S
        base = b * stride_b + h * stride_h
        obase = b * stride_ob + h * stride_oh
    return b, base, obase, length


@triton.jit
def _key_block(K, V, M, b, base, offs_n, offs_d, L, stride_s, mask_stride_b, HAS_MASK: tl.constexpr):
    """One block of keys: (inside the sequence, may be attended, K tile, V tile). Keys past its
    length L or, with a mask, padding may not be attended (a masked load reads them as 0 = padding)."""
    col_ok = offs_n < L
    if HAS_MASK:
        key_ok = tl.load(M + b * mask_stride_b + offs_n, mask=col_ok, other=0) != 0
    else:
        key_ok = col_ok
    k = _load_rows(K, base, offs_n, offs_d, stride_s, col_ok)
    v = _load_rows(V, base, offs_n, offs_d, stride_s, col_ok)
    return col_ok, key_ok, k, v


@triton.jit
def _keep(seed, off_hz, offs_m, offs_n, S, p_drop):
    # One Philox draw per (batch*head, query, key) position; int32 offsets (the wrapper checks range).
    offsets = off_hz * S * S + offs_m[:, None] * S + offs_n[None, :]
    return tl.rand(seed, offsets) >= p_drop


@triton.jit
def _seed(Seed, DROPOUT: tl.constexpr):
    # Without dropout the seed pointer is a placeholder and never read. (One return statement:
    # the compiler type-checks every return, even under a constexpr branch.)
    if DROPOUT:
        seed = tl.load(Seed)
    else:
        seed = 0
    return seed


# S and the mask's row stride vary with the batch's padding / max_seqlen: not specialized on (see top).
@triton.jit(do_not_specialize=["S", "mask_stride_b"])
def _fwd_kernel(Q, K, V, M, Seed, Cu, O, LSE, sm_scale, p_drop, S, H,
                stride_b, stride_h, stride_s, stride_ob, stride_oh, stride_os, mask_stride_b,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr,
                VARLEN: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    b, base, obase, L = _sequence(Cu, off_hz, S, H, stride_b, stride_h, stride_s, stride_ob, stride_oh, stride_os,
                                  VARLEN)
    if start_m * BLOCK_M < L:  # packed: the grid is sized by max_seqlen, this sequence may be shorter
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m < L
        q = _load_rows(Q, base, offs_m, offs_d, stride_s, row_ok)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        seed = _seed(Seed, DROPOUT)
        for start_n in range(0, L, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            col_ok, key_ok, k, v = _key_block(K, V, M, b, base, offs_n, offs_d, L, stride_s, mask_stride_b,
                                              HAS_MASK)
            qk = _dot(q, tl.trans(k), PRECISION, UPCAST) * sm_scale
            qk = tl.where(key_ok[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no valid key yet
            p = tl.exp(qk - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            if DROPOUT:
                p = tl.where(_keep(seed, off_hz, offs_m, offs_n, S, p_drop), p / (1.0 - p_drop), 0.0)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, UPCAST)
            m_i = m_new
        has_key = l_i > 0
        out = acc / tl.where(has_key, l_i, 1.0)[:, None]  # no valid key at all: output 0
        lse = tl.where(has_key, tl.where(m_i == float("-inf"), 0.0, m_i) + tl.log(l_i), float("inf"))
        _store_rows(O, obase, offs_m, offs_d, stride_os, row_ok, out)
        tl.store(LSE + off_hz * S + offs_m, lse, mask=row_ok)


@triton.jit
def _probs(q, k, key_ok, lse, sm_scale, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """P recomputed from the saved log-sum-exp (masked keys and padded rows give 0)."""
    qk = _dot(q, tl.trans(k), PRECISION, UPCAST) * sm_scale
    qk = tl.where(key_ok[None, :], qk, float("-inf"))
    return tl.exp(qk - lse[:, None])


@triton.jit
def _rows_lse_delta(O, DO, LSE, obase, off_hz, offs_m, offs_d, S, stride_os, row_ok):
    """dO, the saved log-sum-exp (row stride S) and delta = rowsum(dO * O) for a block of query rows (O and dO
    at obase with row stride stride_os: their own layout). Computed
    where it is needed rather than in a separate pre-pass: one kernel launch less per backward,
    which is what counts at BERT sizes, where the launches cost more than the math."""
    do = _load_rows(DO, obase, offs_m, offs_d, stride_os, row_ok)
    o = _load_rows(O, obase, offs_m, offs_d, stride_os, row_ok)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    lse = tl.load(LSE + off_hz * S + offs_m, mask=row_ok, other=float("inf"))
    return do, lse, delta


@triton.jit
def _bwd_dkdv(Q, K, V, O, DO, M, LSE, DK, DV, seed, start_n, off_hz, b, base, obase, sm_scale, p_drop, S, L,
              stride_s, stride_os, mask_stride_b, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dK, dV of one key block, streaming over all query blocks of the sequence (length L)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok, key_ok, k, v = _key_block(K, V, M, b, base, offs_n, offs_d, L, stride_s, mask_stride_b, HAS_MASK)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for start_m in range(0, L, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < L
        q = _load_rows(Q, base, offs_m, offs_d, stride_s, row_ok)
        do, lse, delta = _rows_lse_delta(O, DO, LSE, obase, off_hz, offs_m, offs_d, S, stride_os, row_ok)
        p = _probs(q, k, key_ok, lse, sm_scale, PRECISION, UPCAST)
        dp = _dot(do, tl.trans(v), PRECISION, UPCAST)
        if DROPOUT:
            keep = _keep(seed, off_hz, offs_m, offs_n, S, p_drop)
            p_dropped = tl.where(keep, p / (1.0 - p_drop), 0.0)
            dp = tl.where(keep, dp / (1.0 - p_drop), 0.0)
        else:
            p_dropped = p
        dv += _dot(tl.trans(p_dropped.to(do.dtype)), do, PRECISION, UPCAST)
        ds = p * (dp - delta[:, None])
        dk += _dot(tl.trans(ds.to(q.dtype)), q, PRECISION, UPCAST)
    _store_rows(DK, base, offs_n, offs_d, stride_s, col_ok, dk * sm_scale)
    _store_rows(DV, base, offs_n, offs_d, stride_s, col_ok, dv)


@triton.jit
def _bwd_dq(Q, K, V, O, DO, M, LSE, DQ, seed, start_m, off_hz, b, base, obase, sm_scale, p_drop, S, L,
            stride_s, stride_os, mask_stride_b, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            HAS_MASK: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of one query block, streaming over all key blocks of the sequence (length L)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < L
    q = _load_rows(Q, base, offs_m, offs_d, stride_s, row_ok)
    do, lse, delta = _rows_lse_delta(O, DO, LSE, obase, off_hz, offs_m, offs_d, S, stride_os, row_ok)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(0, L, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok, key_ok, k, v = _key_block(K, V, M, b, base, offs_n, offs_d, L, stride_s, mask_stride_b, HAS_MASK)
        p = _probs(q, k, key_ok, lse, sm_scale, PRECISION, UPCAST)
        dp = _dot(do, tl.trans(v), PRECISION, UPCAST)
        if DROPOUT:
            dp = tl.where(_keep(seed, off_hz, offs_m, offs_n, S, p_drop), dp / (1.0 - p_drop), 0.0)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, PRECISION, UPCAST)
    _store_rows(DQ, base, offs_m, offs_d, stride_s, row_ok, dq * sm_scale)


@triton.jit(do_not_specialize=["S", "mask_stride_b"])
def _bwd_kernel(Q, K, V, O, DO, M, Seed, Cu, LSE, DQ, DK, DV, sm_scale, p_drop, S, H,
                stride_b, stride_h, stride_s, stride_ob, stride_oh, stride_os, mask_stride_b,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr,
                VARLEN: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """The whole backward in one launch: program i computes dK/dV of key block i and dQ of query
    block i (the grid covers the larger of the two block counts; blocks past the sequence's
    length L do nothing). Q, K, V, DQ, DK, DV share the first stride set, O and DO the second."""
    pid = tl.program_id(0)
    off_hz = tl.program_id(1)
    b, base, obase, L = _sequence(Cu, off_hz, S, H, stride_b, stride_h, stride_s, stride_ob, stride_oh, stride_os,
                                  VARLEN)
    seed = _seed(Seed, DROPOUT)
    if pid * BLOCK_N < L:
        _bwd_dkdv(Q, K, V, O, DO, M, LSE, DK, DV, seed, pid * BLOCK_N, off_hz, b, base, obase, sm_scale, p_drop, S,
                  L, stride_s, stride_os, mask_stride_b, HEAD_DIM, BLOCK_M, BLOCK_N, HAS_MASK, DROPOUT, PRECISION,
                  UPCAST)
    if pid * BLOCK_M < L:
        _bwd_dq(Q, K, V, O, DO, M, LSE, DQ, seed, pid * BLOCK_M, off_hz, b, base, obase, sm_scale, p_drop, S, L,
                stride_s, stride_os, mask_stride_b, HEAD_DIM, BLOCK_M, BLOCK_N, HAS_MASK, DROPOUT, PRECISION, UPCAST)


@triton.jit(do_not_specialize=["S"])
def _keep_mask_kernel(Seed, Out, p_drop, S, BLOCK: tl.constexpr):
    """The keep mask the attention kernels use, written out: for tests and for inspection."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    offs_m = start_m * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    seed = tl.load(Seed)
    for start_n in range(0, S, BLOCK):
        cols = start_n + offs_n
        keep = _keep(seed, off_hz, offs_m, cols, S, p_drop)
        ok = (offs_m[:, None] < S) & (cols[None, :] < S)
        tl.store(Out + off_hz * S * S + offs_m[:, None] * S + cols[None, :], keep.to(tl.int8), mask=ok)
