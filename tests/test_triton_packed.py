"""The packed (variable-length) Triton attention against per-sequence PyTorch attention and against
the padded API (CPU: Triton's interpreter, small sizes; conftest.py sets TRITON_INTERPRET=1).
"""
from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from bertaccel.attention import triton_attention as TA  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Ragged: several 16-row blocks with a tail, an empty sequence, a single token, one block exactly.
LENGTHS = [37, 0, 1, 16, 21]
TOL = {torch.float32: 1e-4, torch.float16: 5e-3}


def packed_reference(q, k, v, cu_seqlens, sm_scale):
    """Per-sequence softmax attention in fp32 with plain torch: [T, H, D] -> [T, H, D] (fp32)."""
    bounds = cu_seqlens.tolist()
    out = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[start:end].float().transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        probs = torch.softmax(qs @ ks.transpose(-1, -2) * sm_scale, -1)
        out.append((probs @ vs).transpose(0, 1))
    return torch.cat(out)


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def _qkv(total, heads, dim, dtype, seed=0, layout="thd"):
    """q, k, v [T, H, D] and the leaves their gradients land in. thd: BERT's packed path, views of
    [T, H*D] projections (read in place); htd: [H, T, D] storage, head-major (in place, other
    strides); fused: slices of one [T, 3, H, D] projection (not dense: the wrapper copies them)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "fused":
        qkv = torch.randn(total, 3, heads, dim, generator=g).to(DEVICE, dtype).requires_grad_()
        return (qkv,), qkv.unbind(1)
    shape = (total, heads * dim) if layout == "thd" else (heads, total, dim)
    leaves = tuple(torch.randn(shape, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(3))
    if layout == "thd":
        return leaves, tuple(t.view(total, heads, dim) for t in leaves)
    return leaves, tuple(t.transpose(0, 1) for t in leaves)


def _rel(a, b):
    a, b = a.double(), b.double()
    assert not torch.isnan(a).any(), "NaN never passes"
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(autouse=True)
def small_blocks():
    # 16x16 tiles: several query and key blocks per sequence, and ragged tails.
    TA._block_override = (16, 16)
    yield
    TA._block_override = None


@pytest.mark.parametrize("dtype, layout", [(torch.float32, "thd"), (torch.float16, "thd"),
                                           (torch.float32, "htd"), (torch.float32, "fused")])
def test_packed_forward_and_gradients_match_per_sequence_attention(dtype, layout):
    cu = _cu(LENGTHS)
    leaves, (q, k, v) = _qkv(sum(LENGTHS), 2, 32, dtype, layout=layout)
    scale = 1 / math.sqrt(32)
    out = TA.fused_attention_packed(q, k, v, cu, max(LENGTHS), 0.0, scale)
    assert out.shape == q.shape and out.stride() == (q.stride() if layout != "fused" else (64, 32, 1))
    ref = packed_reference(q, k, v, cu, scale)
    assert _rel(out, ref) < TOL[dtype]
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad)
    want = torch.autograd.grad(ref, leaves, grad.float())
    if layout == "fused":  # one leaf: its [T, 3, H, D] gradient holds dq, dk, dv
        got, want = got[0].unbind(1), want[0].unbind(1)
    for name, a, b in zip("qkv", got, want):
        assert _rel(a, b) < (TOL[dtype] if dtype == torch.float32 else 3 * TOL[dtype]), name


@pytest.mark.parametrize("p", [0.0, 0.3])
def test_packed_equals_padded_on_the_same_tokens(p):
    # With max_seqlen = the padded S the dropout counter is the padded one (sequence i = batch row
    # i), so even the dropout masks agree; at p = 0 this is packed vs key-masked padded attention.
    lengths, heads, seq, dim = [29, 0, 17, 1], 2, 29, 32
    g = torch.Generator().manual_seed(1)
    padded = [torch.randn(len(lengths), heads, seq, dim, generator=g).to(DEVICE).requires_grad_() for _ in range(3)]
    keep = torch.zeros(len(lengths), seq, dtype=torch.bool, device=DEVICE)
    for i, n in enumerate(lengths):
        keep[i, :n] = True

    def pack(t):  # [B, H, S, D] -> the real tokens, [T, H, D]
        return t.transpose(1, 2)[keep]

    seed = torch.tensor([77], dtype=torch.int64, device=DEVICE)
    want = TA.fused_attention(*padded, keep, p, seed=seed)
    packed = [pack(t).detach().requires_grad_() for t in padded]
    got = TA.fused_attention_packed(*packed, _cu(lengths), seq, p, seed=seed)
    assert _rel(got, pack(want)) < 1e-6
    grad = torch.randn_like(got)
    grad_padded = torch.zeros_like(want).transpose(1, 2)
    grad_padded[keep] = grad  # padding rows get no gradient, so they add nothing to dK, dV
    want_grads = torch.autograd.grad(want, padded, grad_padded.transpose(1, 2))
    got_grads = torch.autograd.grad(got, packed, grad)
    for name, a, b in zip("qkv", got_grads, want_grads):
        assert _rel(a, pack(b)) < 1e-6, name


def test_packed_dropout_seeds_rate_and_a_loose_max_seqlen():
    p, lengths, heads = 0.25, [64, 50, 33], 2
    cu, total = _cu(lengths), sum(lengths)
    # q = k = 0: every probability is 1/L; v one-hot on the key's position, so out[i, h, j] is
    # keep(i, j) / (L (1 - p)): the output shows the dropout mask itself.
    q = torch.zeros(total, heads, 64, device=DEVICE)
    pos = torch.cat([torch.arange(n) for n in lengths])
    v = torch.nn.functional.one_hot(pos, 64).float()[:, None, :].expand(total, heads, 64).to(DEVICE)
    seed = torch.tensor([2024], dtype=torch.int64, device=DEVICE)
    out = TA.fused_attention_packed(q, q, v, cu, 64, p, seed=seed)
    assert torch.equal(out, TA.fused_attention_packed(q, q, v, cu, 64, p, seed=seed))
    assert not torch.equal(out, TA.fused_attention_packed(q, q, v, cu, 64, p, seed=seed + 1))
    kept, draws = 0, 0
    for (start, end), n in zip(zip(cu[:-1].tolist(), cu[1:].tolist()), lengths):
        block = out[start:end, :, :n]
        assert torch.allclose(block[block != 0], torch.tensor(1 / (n * (1 - p)), device=DEVICE))
        kept, draws = kept + (block != 0).sum().item(), draws + block.numel()
    assert abs(1 - kept / draws - p) < 0.02, kept / draws  # ~15k draws: 6 standard deviations
    # Without dropout max_seqlen is only a bound: a loose one changes nothing.
    q, k, v = (torch.randn(total, heads, 16, device=DEVICE) for _ in range(3))
    assert torch.equal(TA.fused_attention_packed(q, k, v, cu, 64), TA.fused_attention_packed(q, k, v, cu, 100))


def test_packed_op_under_torch_compile_matches_eager_without_graph_breaks():
    lengths = [19, 0, 8]
    cu = _cu(lengths)
    leaves, (q, k, v) = _qkv(sum(lengths), 2, 16, torch.float32, seed=3)
    seed = torch.tensor([5], dtype=torch.int64, device=DEVICE)

    def attend(q_proj, k_proj, v_proj, cu, seed):  # as a packed BERT layer: heads split by a view
        q, k, v = (t.view(-1, 2, 16) for t in (q_proj, k_proj, v_proj))
        return TA.fused_attention_packed(q, k, v, cu, 19, 0.2, 0.25, seed=seed).reshape(-1, 32) * 2

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)  # fullgraph: a break raises
    eager, traced = attend(*leaves, cu, seed), compiled(*leaves, cu, seed)
    assert torch.equal(eager, traced)
    grad = torch.randn_like(eager)
    for a, b in zip(torch.autograd.grad(eager, leaves, grad), torch.autograd.grad(traced, leaves, grad)):
        assert torch.equal(a, b)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(TA.attention_packed_fwd, (q, k, v, cu, seed, 19, 0.2, 0.25), test_utils=utils)
    torch.library.opcheck(TA.attention_packed_fwd, (q, k, v, cu, None, 24, 0.0, 0.25), test_utils=utils)


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "q": a["q"][None]}, r"\[T, H, D\] shape"),
    (lambda a: {**a, "q": a["q"][..., :8], "k": a["k"][..., :8], "v": a["v"][..., :8]}, "head dim 8"),
    (lambda a: {**a, "cu_seqlens": a["cu_seqlens"].long()}, "cu_seqlens must be an int32"),
    (lambda a: {**a, "cu_seqlens": a["cu_seqlens"][:1]}, "cu_seqlens must be an int32"),
    (lambda a: {**a, "max_seqlen": 0}, "max_seqlen must be a host int"),
    (lambda a: {**a, "max_seqlen": torch.tensor(5)}, "max_seqlen must be a host int"),
    (lambda a: {**a, "max_seqlen": 2 ** 15}, "dropout counter would overflow"),
])
def test_packed_input_checks(change, message):
    q = torch.zeros(5, 4, 16, device=DEVICE)
    args = {"q": q, "k": q, "v": q, "cu_seqlens": _cu([2, 3]), "max_seqlen": 3}
    with pytest.raises(ValueError, match=message):
        TA.fused_attention_packed(**change(args))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs, CUDA graphs and compiled variants need CUDA")
def test_packed_path_never_syncs_captures_in_a_cuda_graph_and_compiles_one_variant_per_config():
    from bertaccel.attention import triton_kernels as K

    TA._block_override = None  # the real, length-independent tiles
    heads, dim = 4, 64
    seed = torch.tensor([3], dtype=torch.int64, device=DEVICE)
    K._fwd_kernel.device_caches.clear()
    K._bwd_kernel.device_caches.clear()
    for lengths in ([128, 5, 77], [1], [33, 0, 64, 17], [100, 100], [250, 3]):
        q, k, v = (torch.randn(sum(lengths), heads, dim, device=DEVICE, requires_grad=True) for _ in range(3))
        cu = _cu(lengths)
        torch.cuda.set_sync_debug_mode("error")  # any host sync raises
        try:
            out = TA.fused_attention_packed(q, k, v, cu, max(lengths), 0.1, seed=seed)
            out.backward(torch.ones_like(out))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for kernel in (K._fwd_kernel, K._bwd_kernel):
        assert sum(len(entry[0]) for entry in kernel.device_caches.values()) == 1, kernel
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = TA.fused_attention_packed(q.detach(), k.detach(), v.detach(), cu, 250, 0.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, TA.fused_attention_packed(q.detach(), k.detach(), v.detach(), cu, 250, 0.0))
