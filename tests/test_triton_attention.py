"""The Triton fused attention against eager attention (CPU: Triton's interpreter, small sizes).

conftest.py sets TRITON_INTERPRET=1 on machines without CUDA before anything imports Triton.
"""
from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from bertaccel.attention import triton_attention as TA  # noqa: E402
from bertaccel.attention import triton_launch as TL  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(q, k, v, keep, scale, drop_keep=None, p=0.0):
    """Eager attention in float64; drop_keep: the kernel's own dropout mask, to reproduce it."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~keep.bool()[:, None, None, :], float("-inf"))
    probs = torch.softmax(s, -1)
    if drop_keep is not None:
        probs = probs * drop_keep / (1 - p)
    return probs @ v.double()


def _inputs(b, h, s, d, dtype, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(3))
    keep = torch.zeros(b, s, dtype=torch.int32, device=DEVICE)
    for i, n in enumerate(lengths):
        keep[i, :n] = 1
    return q, k, v, keep


def _rel(a, b):
    a, b = a.double(), b.double()
    assert not torch.isnan(a).any(), "NaN never passes"
    return ((a - b).abs().max() / b.abs().max()).item()


TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 5e-3}


@pytest.fixture(autouse=True)
def small_blocks():
    # Several 16-wide column blocks even at small S, and a ragged tail: what the online softmax
    # across blocks and the tail masking must get right.
    TL._block_override = (16, 16)
    yield
    TL._block_override = None


# float32 at d=32 in the inner loop; the other cases (seconds each under the Triton interpreter) in the full suite.
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow),
                                   pytest.param(torch.float16, marks=pytest.mark.slow)])
@pytest.mark.parametrize("d", [32, pytest.param(64, marks=pytest.mark.slow)])
def test_forward_and_gradients_match_eager(dtype, d):
    q, k, v, keep = _inputs(2, 2, 37, d, dtype, lengths=[37, 21])
    scale = 1 / math.sqrt(d)
    out = TA.fused_attention(q, k, v, keep, 0.0, scale)
    ref = reference(q, k, v, keep, scale)
    assert _rel(out, ref) < TOL[dtype]
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad.double())
    for name, a, b in zip("qkv", got, want):
        assert _rel(a, b) < (TOL[dtype] if dtype == torch.float32 else 3 * TOL[dtype]), name


@pytest.mark.slow
def test_bshd_layout_bool_mask_and_unequal_blocks_match_the_contiguous_path():
    # BERT's q/k/v are [B, S, H, D] projections viewed as [B, H, S, D]: the kernels read them in
    # place, the output keeps that layout (so merging heads is a view), and a bool mask is read
    # as it is. 16x32 tiles: the backward grid must cover the larger block count.
    q, k, v, keep = _inputs(2, 3, 45, 32, torch.float32, lengths=[45, 30], seed=4)
    ref_out = TA.fused_attention(q, k, v, keep, 0.0)
    grad = torch.randn_like(ref_out)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v), grad)
    bshd = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
    for blocks in [(16, 16), (16, 32), (32, 16)]:
        TL._block_override = blocks
        out = TA.fused_attention(*(t.transpose(1, 2) for t in bshd), keep.bool(), 0.0)
        assert out.transpose(1, 2).is_contiguous(), "output should come back in the [B, S, H, D] layout"
        assert _rel(out, ref_out) < 1e-5, blocks
        got = torch.autograd.grad(out, bshd, grad.transpose(1, 2).contiguous().transpose(1, 2))
        for name, a, b in zip("qkv", got, ref_grads):
            assert _rel(a.transpose(1, 2), b) < 1e-5, (blocks, name)


def test_no_mask_equals_an_all_ones_mask():
    q, k, v, _ = _inputs(1, 2, 19, 32, torch.float32, lengths=[19])
    ones = torch.ones(1, 19, dtype=torch.int64, device=DEVICE)
    assert torch.equal(TA.fused_attention(q, k, v, None), TA.fused_attention(q, k, v, ones))


def test_head_dim_128_and_a_fully_masked_row():
    q, k, v, keep = _inputs(2, 1, 20, 128, torch.float32, lengths=[20, 0])  # batch 1: no valid key
    out = TA.fused_attention(q, k, v, keep, 0.0)
    assert torch.isfinite(out).all() and out[1].abs().max() == 0
    assert _rel(out[0:1], reference(q[0:1], k[0:1], v[0:1], keep[0:1], 1 / math.sqrt(128))) < 1e-4
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and q.grad[1].abs().max() == 0


def test_dropout_mask_is_reproduced_in_backward():
    p = 0.3
    q, k, v, keep = _inputs(2, 2, 33, 32, torch.float32, lengths=[33, 19], seed=3)
    seed = torch.tensor([1234], dtype=torch.int64, device=DEVICE)
    scale = 1 / math.sqrt(32)
    out = TA.fused_attention(q, k, v, keep, p, scale, seed=seed)
    again = TA.fused_attention(q, k, v, keep, p, scale, seed=seed)
    assert torch.equal(out, again)  # same seed, same mask
    other = TA.fused_attention(q, k, v, keep, p, scale, seed=seed + 1)
    assert not torch.allclose(out, other)
    drop_keep = TA.dropout_keep_mask(seed, 2, 2, 33, p).double()
    ref = reference(q, k, v, keep, scale, drop_keep, p)
    assert _rel(out, ref) < 1e-4
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad.double())
    for name, a, b in zip("qkv", got, want):
        assert _rel(a, b) < 1e-4, name


def test_keep_rate_within_one_percent():
    p = 0.1
    mask = TA.dropout_keep_mask(torch.tensor([7], device=DEVICE), 4, 4, 128, p)  # 262,144 draws
    assert abs(mask.float().mean().item() - (1 - p)) < 0.01


def test_bad_shapes_are_refused():
    q = torch.zeros(1, 1, 8, 48)
    with pytest.raises(ValueError, match="head dim 48"):
        TA.fused_attention(q, q, q)


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_custom_op_path_matches_the_eager_path():
    # torch.compile goes through the registered custom ops; eager mode through the autograd
    # Function: the same kernels, so the same numbers (and the op passes torch's opcheck).
    q, k, v, keep = _inputs(1, 2, 24, 32, torch.float32, lengths=[19])
    seed = torch.tensor([5], dtype=torch.int64, device=DEVICE)
    eager = TA.fused_attention(q, k, v, keep, 0.2, 0.25, seed=seed)
    op, _ = TA.attention_fwd(q, k, v, keep, seed, 0.2, 0.25)
    assert torch.equal(eager, op)
    g = torch.randn_like(op)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(eager, (q, k, v), g),
                                                  torch.autograd.grad(op, (q, k, v), g)))
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(TA.attention_fwd, (q, k, v, keep, seed, 0.2, 0.25), test_utils=utils)
    # The fakes must predict the real layouts: transposed views, and no mask / no seed.
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v))
    torch.library.opcheck(TA.attention_fwd, (qt, kt, vt, None, None, 0.0, 0.25), test_utils=utils)


def test_the_interpreter_takes_one_tile_over_the_sequence_up_to_its_cap():
    """Without the override, a CPU tensor (Triton's interpreter, whose time is the number of tiles)
    gets tiles that cover the sequence, packed or padded, up to INTERPRETER_MAX_TILE; a GPU's are
    _tile's (32 or 64)."""
    TL._block_override = None
    q = torch.zeros(2, 2, 45, 32)
    assert TL._launch_args(q, TL._Geometry(2, 2, 45, 32), False)[:2] == (64, 64)
    assert TL._launch_args(q, TL._Geometry(3, 2, 300, 32), True)[:2] == (TL.INTERPRETER_MAX_TILE,) * 2
    assert TL._interpreter_blocks(5) == (16, 16)
    assert TL._blocks(32, 45, torch.float32) == (32, 32) and TL._packed_blocks(64, torch.float16) == (64, 64)
