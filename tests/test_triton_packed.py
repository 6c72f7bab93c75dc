"""The packed (variable-length) Triton attention against per-sequence PyTorch attention and against
the padded API (CPU: Triton's interpreter, small sizes; conftest.py sets TRITON_INTERPRET=1).
"""
from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")

from bertaccel.attention import triton_attention as TA  # noqa: E402
from bertaccel.attention import triton_launch as TL  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Ragged: several 16-row blocks with a tail, an empty sequence, a single token, one block exactly.
LENGTHS = [37, 0, 1, 16, 21]
TOL = {torch.float32: 1e-4, torch.float16: 5e-3}


def packed_reference(q, k, v, cu_seqlens, sm_scale, keep=None, p=0.0):
    """Per-sequence softmax attention in fp32 with plain torch: [T, H, D] -> [T, H, D] (fp32). keep: the
    kernels' dropout mask, [N, H, S, S] from dropout_keep_mask with S = max_seqlen, to reproduce it."""
    bounds = cu_seqlens.tolist()
    out = []
    for i, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        qs, ks, vs = (t[start:end].float().transpose(0, 1) for t in (q, k, v))  # [H, L, D]
        probs = torch.softmax(qs @ ks.transpose(-1, -2) * sm_scale, -1)
        if keep is not None:
            probs = probs * keep[i, :, :end - start, :end - start] / (1 - p)
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
    TL._block_override = (16, 16)
    yield
    TL._block_override = None


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


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
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


@pytest.mark.slow
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


@pytest.mark.slow
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
def test_packed_paths_never_sync_capture_in_a_cuda_graph_and_compile_one_variant_per_config():
    from bertaccel.attention import triton_kernels as K

    TL._block_override = None  # the real, length-independent tiles
    heads, dim = 4, 64
    seed = torch.tensor([3], dtype=torch.int64, device=DEVICE)
    K._fwd_kernel.device_caches.clear()
    K._bwd_kernel.device_caches.clear()
    for lengths in ([128, 5, 77], [1], [33, 0, 64, 17], [100, 100], [250, 3]):
        q, k, v = (torch.randn(sum(lengths), heads, dim, device=DEVICE, requires_grad=True) for _ in range(3))
        qkv = torch.randn(sum(lengths), 3, heads, dim, device=DEVICE, requires_grad=True)
        cu = _cu(lengths)
        torch.cuda.set_sync_debug_mode("error")  # any host sync raises
        try:
            out = TA.fused_attention_packed(q, k, v, cu, max(lengths), 0.1, seed=seed)
            out.backward(torch.ones_like(out))
            out = TA.fused_attention_packed_qkv(qkv, cu, max(lengths), 0.1, seed=seed)
            out.backward(torch.ones_like(out))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # One variant for both forms too: the qkv form's strides (3*H*D per token) fall in the same
    # divisible-by-16 class as the separate tensors' (H*D).
    for kernel in (K._fwd_kernel, K._bwd_kernel):
        assert sum(len(entry[0]) for entry in kernel.device_caches.values()) == 1, kernel
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = TA.fused_attention_packed(q.detach(), k.detach(), v.detach(), cu, 250, 0.0)
        captured_qkv = TA.fused_attention_packed_qkv(qkv.detach(), cu, 250, 0.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, TA.fused_attention_packed(q.detach(), k.detach(), v.detach(), cu, 250, 0.0))
    assert torch.equal(captured_qkv, TA.fused_attention_packed_qkv(qkv.detach(), cu, 250, 0.0))


def _projection(total, heads, dim, dtype, layout, seed=0):
    """The leaf a fused QKV GEMM writes and qkv [T, 3, H, D] viewed on it. gemm: the [T, 3*H*D] output
    itself (contiguous); strided: the first 3*H*D columns of a wider buffer (rows 32 elements apart
    more, read in place by the forward, copied once by the backward)."""
    g = torch.Generator().manual_seed(seed)
    width = 3 * heads * dim + (32 if layout == "strided" else 0)
    leaf = torch.randn(total, width, generator=g).to(DEVICE, dtype).requires_grad_()
    return leaf, leaf[:, :3 * heads * dim].view(total, 3, heads, dim)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, p, layout", [(torch.float32, 0.0, "gemm"), (torch.float16, 0.0, "gemm"),
                                              (torch.float32, 0.3, "gemm"), (torch.float16, 0.3, "gemm"),
                                              (torch.float32, 0.0, "strided")])
def test_qkv_form_equals_the_packed_op_on_unbound_copies_and_the_per_sequence_reference(dtype, p, layout):
    cu, heads, dim, max_seqlen = _cu(LENGTHS), 2, 32, max(LENGTHS)
    leaf, qkv = _projection(sum(LENGTHS), heads, dim, dtype, layout)
    seed = torch.tensor([11], dtype=torch.int64, device=DEVICE)
    scale = 1 / math.sqrt(dim)
    out = TA.fused_attention_packed_qkv(qkv, cu, max_seqlen, p, scale, seed=seed)
    assert out.shape == (sum(LENGTHS), heads, dim) and out.is_contiguous()
    copies = [t.detach().contiguous().requires_grad_() for t in qkv.unbind(1)]
    separate = TA.fused_attention_packed(*copies, cu, max_seqlen, p, scale, seed=seed)
    assert torch.equal(out, separate), "same kernels, same tiles, same dropout mask: the same numbers"
    keep = TA.dropout_keep_mask(seed, len(LENGTHS), heads, max_seqlen, p) if p else None
    ref = packed_reference(*qkv.unbind(1), cu, scale, keep, p)
    assert _rel(out, ref) < TOL[dtype]
    grad = torch.randn_like(out)
    (dleaf,) = torch.autograd.grad(out, leaf, grad)
    dqkv = dleaf[:, :3 * heads * dim].view_as(qkv)
    assert not dleaf[:, 3 * heads * dim:].any()  # the wider buffer's other columns are not attention's
    for name, a, b in zip("qkv", dqkv.unbind(1), torch.autograd.grad(separate, copies, grad)):
        assert torch.equal(a, b), name
    (want,) = torch.autograd.grad(ref, leaf, grad.float())
    want = want[:, :3 * heads * dim].view_as(qkv)
    for name, a, b in zip("qkv", dqkv.unbind(1), want.unbind(1)):
        assert _rel(a, b) < (TOL[dtype] if dtype == torch.float32 else 3 * TOL[dtype]), name


def test_qkv_gradient_is_one_tensor_straight_from_the_op():
    lengths, heads, dim = [19, 0, 8], 2, 16
    qkv = torch.randn(sum(lengths), 3, heads, dim, device=DEVICE, requires_grad=True)
    out = TA.fused_attention_packed_qkv(qkv, _cu(lengths), 19)
    # The op's backward feeds qkv's gradient accumulator itself: no unbind / stack / cat node in between,
    # which the packed op on qkv.unbind(1) would need (UnbindBackward stacks dq, dk, dv into a new tensor).
    (feeds,) = [node for node, _ in out.grad_fn.next_functions if node is not None]
    assert feeds.variable is qkv
    (dqkv,) = torch.autograd.grad(out, qkv, torch.randn_like(out))
    assert dqkv.shape == (sum(lengths), 3, heads, dim) and dqkv.is_contiguous()
    unbound = TA.fused_attention_packed(*qkv.unbind(1), _cu(lengths), 19)
    assert any("Unbind" in type(node).__name__ for node, _ in unbound.grad_fn.next_functions if node is not None)


@pytest.mark.slow
def test_qkv_op_under_torch_compile_matches_eager_and_its_backward_graph_has_no_concatenation():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    lengths, heads, dim = [19, 0, 8], 2, 16
    cu, total = _cu(lengths), sum(lengths)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(total, 24, generator=g).to(DEVICE).requires_grad_()
    w = torch.randn(3 * heads * dim, 24, generator=g).to(DEVICE).requires_grad_()
    seed = torch.tensor([5], dtype=torch.int64, device=DEVICE)

    def layer(x, w, cu, seed):  # as the fused BERT layer: one QKV GEMM, heads split by a view
        qkv = (x @ w.t()).view(-1, 3, heads, dim)
        return TA.fused_attention_packed_qkv(qkv, cu, 19, 0.2, 0.25, seed=seed).reshape(-1, heads * dim) * 2

    eager = layer(x, w, cu, seed)
    grad = torch.randn_like(eager)
    want = torch.autograd.grad(eager, (x, w), grad)
    backward_graphs = []

    def keep_backward(gm, example_inputs):  # aot_eager's nop compiler, keeping the graph to look at
        backward_graphs.append(gm.graph)
        return make_boxed_func(gm.forward)

    for backend in ("aot_eager", aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                                              bw_compiler=keep_backward)):
        traced = torch.compile(layer, backend=backend, fullgraph=True)(x, w, cu, seed)  # fullgraph: a break raises
        assert torch.equal(eager, traced)
        for a, b in zip(want, torch.autograd.grad(traced, (x, w), grad)):
            assert torch.equal(a, b)
        torch._dynamo.reset()
    (graph,) = backward_graphs
    targets = [node.target for node in graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.bertaccel.fused_attention_packed_qkv_bwd.default) == 1
    aten = torch.ops.aten
    assert not {aten.cat.default, aten.stack.default, aten.clone.default, aten.copy_.default} & set(targets), targets
    qkv = (x @ w.t()).detach().view(-1, 3, heads, dim).requires_grad_()
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(TA.attention_packed_qkv_fwd, (qkv, cu, seed, 19, 0.2, 0.25), test_utils=utils)
    torch.library.opcheck(TA.attention_packed_qkv_fwd, (qkv.transpose(0, 1).contiguous().transpose(0, 1), cu, None,
                                                        24, 0.0, 0.25), test_utils=utils)


@pytest.mark.parametrize("qkv, message", [
    (torch.zeros(5, 2, 4, 16), r"\[T, 3, H, D\]"),
    (torch.zeros(5, 3, 16, 4).transpose(2, 3), "unit stride along D"),
    (torch.zeros(5, 3, 4, 8), "head dim 8"),
])
def test_qkv_input_checks(qkv, message):
    with pytest.raises(ValueError, match=message):
        TA.fused_attention_packed_qkv(qkv.to(DEVICE), _cu([2, 3]), 3)
