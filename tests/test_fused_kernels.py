"""The fused encoder kernels (bertaccel/encoder) against plain PyTorch in float64: forward and every
input gradient, ragged row counts, non-power-of-two widths, fp32 and bf16, dropout keyed by a seed,
empty batches, bad inputs, and the custom-op path under torch.compile (CPU: Triton's interpreter,
small sizes; conftest.py sets TRITON_INTERPRET=1).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

from bertaccel.encoder import fused_ops as FO  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROWS = (1, 7, 37)  # one row, less than a row tile, several row tiles with a tail
WIDTHS = (32, 48, 96)  # a power of two and two that leave padding columns in the tile
# Max error relative to the reference's largest magnitude. fp32: the kernels compute in fp32 with
# one rounding; bf16: outputs (and the saved xhat) rounded to 8 mantissa bits.
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
EPS = 1e-12  # BERT's LayerNorm eps


INTERPRETER_TILE_ELEMENTS = FO.INTERPRETER_TILE_ELEMENTS  # the interpreter's own tiles (one covers ROWS)


@pytest.fixture(autouse=True)
def gpu_sized_row_tiles(monkeypatch):
    """Row tiles of 4-16 rows under the interpreter too, as a GPU's (16 rows of width 32 there), so
    ROWS' 37 is several row tiles with a tail and the backward's programs walk several tiles each:
    the interpreter's own tiles cover every row here in one."""
    monkeypatch.setattr(FO, "INTERPRETER_TILE_ELEMENTS", 512)


def test_the_interpreter_covers_the_rows_in_one_tile_and_a_gpu_keeps_its_tiles(monkeypatch):
    """The interpreter runs a program's operations one by one in Python, so its time is the number
    of tiles: one tile over the rows, up to INTERPRETER_TILE_ELEMENTS. A GPU's tiles follow the
    width alone (not the token count, which would compile a variant per batch)."""
    monkeypatch.setattr(FO, "INTERPRETER_TILE_ELEMENTS", INTERPRETER_TILE_ELEMENTS)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert FO._row_tile(37, 32, cpu) == (64, 32, 1) and FO._gelu_tile(37, 96, cpu) == (64, 128)
    assert FO._row_tile(5000, 384, cpu)[:2] == (INTERPRETER_TILE_ELEMENTS // 512, 512)
    assert FO._row_tile(37, 32, gpu) == FO._row_tile(5000, 32, gpu) == (16, 32, 2)
    assert FO._gelu_tile(37, 96, gpu) == FO._gelu_tile(5000, 96, gpu) == (16, 128)


def _assert_close(out: torch.Tensor, ref: torch.Tensor, rel: float, what: str) -> None:
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    err = (out.double() - ref).abs().max().item() if out.numel() else 0.0
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, 1.0)
    assert err <= rel * scale, f"{what}: max error {err:.3g} > {rel} x {scale:.3g}"


def _leaf(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(DEVICE, dtype).requires_grad_()


def _ref_leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().requires_grad_()


def _grads_vs_reference(out, ref, inputs, refs, dtype, gen, names):
    """Backpropagate one random dy through both and compare every input gradient (dtype: the input's)."""
    dy = torch.randn(out.shape, generator=gen).to(DEVICE, out.dtype)
    out.backward(dy)
    ref.backward(dy.double())
    for name, t, r in zip(names, inputs, refs):
        assert t.grad.dtype == t.dtype, (name, t.grad.dtype)
        _assert_close(t.grad, r.grad, REL_TOL[dtype], f"d{name}")


# ---------------------------------------------------------------- bias + GELU

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("width", WIDTHS)
def test_bias_gelu_matches_torch(dtype, n, width):
    gen = torch.Generator().manual_seed(n * 1000 + width)
    x, bias = _leaf((n, width), dtype, gen, 2.0), _leaf((width,), dtype, gen)
    xr, br = _ref_leaf(x), _ref_leaf(bias)
    y, yr = FO.bias_gelu(x, bias), F.gelu(xr + br, approximate="none")
    assert y.dtype == dtype
    _assert_close(y, yr, REL_TOL[dtype], "y")
    _grads_vs_reference(y, yr, (x, bias), (xr, br), dtype, gen, ("x", "bias"))


def test_bias_gelu_fp32_bias_with_bf16_x_and_wide_rows():
    """Autocast's case (fp32 parameter, bf16 activation) at BERT's intermediate width (12 column tiles):
    dx in bf16, dbias in fp32 summed in fp32."""
    gen = torch.Generator().manual_seed(3)
    x, bias = _leaf((5, 3072), torch.bfloat16, gen, 2.0), _leaf((3072,), torch.float32, gen)
    xr, br = _ref_leaf(x), _ref_leaf(bias)
    y, yr = FO.bias_gelu(x, bias), F.gelu(xr + br, approximate="none")
    assert y.dtype == torch.bfloat16
    _assert_close(y, yr, REL_TOL[torch.bfloat16], "y")
    _grads_vs_reference(y, yr, (x, bias), (xr, br), torch.bfloat16, gen, ("x", "bias"))
    assert bias.grad.dtype == torch.float32


# ---------------------------------------------------------------- bias + dropout + residual + LayerNorm

def _layernorm_inputs(n, width, dtype, param_dtype, gen):
    x, residual = _leaf((n, width), dtype, gen), _leaf((n, width), dtype, gen, 3.0)
    # Weight and bias away from 1 and 0, so a swapped or missing term shows.
    params = [_leaf((width,), param_dtype, gen, s) for s in (0.5, 1.0, 0.5)]
    with torch.no_grad():
        params[1] += 1.0
    return [x, params[0], residual, params[1], params[2]]


def _layernorm_reference(refs, keep, p):
    x, bias, residual, weight, ln_bias = refs
    h = x + bias
    if keep is not None:
        h = h * keep.double() / (1.0 - p)
    return F.layer_norm(h + residual, (x.shape[1],), weight, ln_bias, EPS)


NAMES = ("x", "bias", "residual", "weight", "ln_bias")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("p", [0.0, 0.1])
def test_layernorm_matches_torch(dtype, n, width, p):
    """Forward and all five gradients; with dropout, both against the mask dropout_keep_mask gives for
    the seed: the backward regenerated the forward's mask."""
    gen = torch.Generator().manual_seed(n * 1000 + width)
    inputs = _layernorm_inputs(n, width, dtype, dtype, gen)
    refs = [_ref_leaf(t) for t in inputs]
    seed = torch.tensor([1234 + n], device=DEVICE)
    y = FO.bias_dropout_residual_layernorm(*inputs, p=p, eps=EPS, seed=seed)
    keep = FO.dropout_keep_mask(seed, n, width, p) if p > 0 else None
    yr = _layernorm_reference(refs, keep, p)
    assert y.dtype == dtype
    _assert_close(y, yr, REL_TOL[dtype], "y")
    _grads_vs_reference(y, yr, inputs, refs, dtype, gen, NAMES)
    if keep is not None:
        assert not inputs[0].grad[~keep].any(), "dx must be 0 where dropout dropped"
        assert inputs[0].grad[keep].ne(0).all(), "dx must be nonzero where dropout kept"


def test_layernorm_fp32_params_with_bf16_x_at_bert_width():
    """Autocast's case at BERT-base width (768: one row per program, 256 padding columns): fp32
    bias / weight / ln_bias and their gradients, bf16 activations and theirs."""
    gen = torch.Generator().manual_seed(5)
    inputs = _layernorm_inputs(3, 768, torch.bfloat16, torch.float32, gen)
    refs = [_ref_leaf(t) for t in inputs]
    seed = torch.tensor([77], device=DEVICE)
    y = FO.bias_dropout_residual_layernorm(*inputs, p=0.1, eps=EPS, seed=seed)
    yr = _layernorm_reference(refs, FO.dropout_keep_mask(seed, 3, 768, 0.1), 0.1)
    _assert_close(y, yr, REL_TOL[torch.bfloat16], "y")
    _grads_vs_reference(y, yr, inputs, refs, torch.bfloat16, gen, NAMES)
    assert [t.grad.dtype for t in inputs] == [torch.bfloat16, torch.float32, torch.bfloat16, torch.float32,
                                              torch.float32]


def test_not_training_is_no_dropout():
    """training=False ignores p (no seed needed) and matches the p = 0 op and plain LayerNorm."""
    gen = torch.Generator().manual_seed(9)
    inputs = _layernorm_inputs(7, 48, torch.float32, torch.float32, gen)
    y_eval = FO.bias_dropout_residual_layernorm(*inputs, p=0.5, eps=EPS, training=False)
    y_p0 = FO.bias_dropout_residual_layernorm(*inputs, p=0.0, eps=EPS)
    assert torch.equal(y_eval, y_p0)
    _assert_close(y_eval, _layernorm_reference([_ref_leaf(t) for t in inputs], None, 0.0), 1e-5, "y")


# ---------------------------------------------------------------- the dropout mask

def test_dropout_mask_follows_the_seed():
    n, width, p = 256, 96, 0.1
    seed = torch.tensor([42], device=DEVICE)
    keep = FO.dropout_keep_mask(seed, n, width, p)
    assert keep.dtype == torch.bool and keep.shape == (n, width)
    assert torch.equal(keep, FO.dropout_keep_mask(seed.clone(), n, width, p)), "same seed, same mask"
    other = FO.dropout_keep_mask(torch.tensor([43], device=DEVICE), n, width, p)
    assert (keep != other).float().mean() > 0.1, "another seed must draw another mask"
    # Keyed by row * D + col, not by N: a packed batch's first rows drop the same elements whatever follows.
    assert torch.equal(FO.dropout_keep_mask(seed, 5, width, p), keep[:5])
    # Binomial: the kept fraction within 5 standard deviations of 1 - p.
    sd = math.sqrt(p * (1 - p) / keep.numel())
    assert abs(keep.float().mean().item() - (1 - p)) < 5 * sd


def test_same_seed_same_output_and_fresh_seeds_differ():
    gen = torch.Generator().manual_seed(11)
    inputs = [t.detach() for t in _layernorm_inputs(37, 32, torch.float32, torch.float32, gen)]
    seed = torch.tensor([7], device=DEVICE)
    y1 = FO.bias_dropout_residual_layernorm(*inputs, p=0.1, eps=EPS, seed=seed)
    assert torch.equal(y1, FO.bias_dropout_residual_layernorm(*inputs, p=0.1, eps=EPS, seed=seed))
    # Without a seed each call draws one from torch's generator: reproducible under manual_seed, and
    # two draws differ.
    torch.manual_seed(0)
    a = FO.bias_dropout_residual_layernorm(*inputs, p=0.1, eps=EPS)
    b = FO.bias_dropout_residual_layernorm(*inputs, p=0.1, eps=EPS)
    torch.manual_seed(0)
    assert torch.equal(a, FO.bias_dropout_residual_layernorm(*inputs, p=0.1, eps=EPS))
    assert not torch.equal(a, b)


# ---------------------------------------------------------------- empty batches, bad inputs

def test_empty_batch():
    """N = 0 (nothing launched): empty outputs, empty activation gradients, zero parameter gradients."""
    gen = torch.Generator().manual_seed(0)
    x, bias = _leaf((0, 48), torch.float32, gen), _leaf((48,), torch.float32, gen)
    y = FO.bias_gelu(x, bias)
    assert y.shape == (0, 48)
    y.sum().backward()
    assert x.grad.shape == (0, 48) and torch.equal(bias.grad, torch.zeros(48, device=DEVICE))
    inputs = _layernorm_inputs(0, 48, torch.float32, torch.float32, gen)
    y = FO.bias_dropout_residual_layernorm(*inputs, p=0.1, eps=EPS)
    assert y.shape == (0, 48)
    y.sum().backward()
    assert inputs[0].grad.shape == (0, 48) and inputs[2].grad.shape == (0, 48)
    for t in (inputs[1], inputs[3], inputs[4]):
        assert torch.equal(t.grad, torch.zeros(48, device=DEVICE))
    assert FO.dropout_keep_mask(torch.tensor([1]), 0, 48, 0.1).shape == (0, 48)


def _bad_gelu_inputs():
    x, b = torch.randn(4, 32), torch.randn(32)
    return [
        ((torch.randn(32), b), "2-D"),
        ((x.long(), b), "float32, float16 or bfloat16"),
        ((torch.randn(32, 4).t(), b), "contiguous"),
        ((x, torch.randn(31)), r"\[C\] = \[32\]"),
        ((x.bfloat16(), b.half()), "float32 or x's dtype"),
        ((x, b.to("meta")), "x's device"),
    ]


@pytest.mark.parametrize("args, message", _bad_gelu_inputs())
def test_bias_gelu_rejects_bad_inputs(args, message):
    with pytest.raises(ValueError, match=message):
        FO.bias_gelu(*args)


def _bad_layernorm_inputs():
    x, r, v = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)
    ok = dict(x=x, bias=v, residual=r, weight=v, ln_bias=v, p=0.1, eps=1e-5)
    return [
        ({**ok, "residual": torch.randn(4, 33)}, "residual must match"),
        ({**ok, "residual": r.double()}, "residual must be float32"),
        ({**ok, "weight": torch.randn(16)}, r"weight must be a \[C\]"),
        ({**ok, "ln_bias": v.bfloat16()}, "ln_bias must be float32 or x's dtype"),
        ({**ok, "p": 1.0}, r"p must be a float in \[0, 1\)"),
        ({**ok, "p": -0.1}, r"p must be a float in \[0, 1\)"),
        ({**ok, "eps": 0.0}, "eps must be a float > 0"),
        ({**ok, "seed": torch.tensor([1], dtype=torch.int32)}, "one-element int64"),
        ({**ok, "seed": torch.tensor([1, 2])}, "one-element int64"),
    ]


@pytest.mark.parametrize("kwargs, message", _bad_layernorm_inputs())
def test_layernorm_rejects_bad_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FO.bias_dropout_residual_layernorm(**kwargs)


# ---------------------------------------------------------------- torch.compile

@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_custom_ops_compile_in_one_graph():
    """Under torch.compile the ops are the custom ops (one graph, fullgraph: no break) with their fake
    kernels and autograd formula, and give eager's output and gradients (same seed, same mask)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def layer(x, bias, residual, weight, ln_bias, seed):
        return FO.bias_dropout_residual_layernorm(FO.bias_gelu(x, bias), bias, residual, weight, ln_bias,
                                                  p=0.1, eps=EPS, seed=seed)

    gen = torch.Generator().manual_seed(2)
    inputs = _layernorm_inputs(7, 32, torch.float32, torch.float32, gen)
    seed = torch.tensor([3], device=DEVICE)
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    y = torch.compile(layer, backend=counter, fullgraph=True)(*inputs, seed)
    y.sum().backward()
    compiled_grads = [t.grad.clone() for t in inputs]
    ops = {str(node.target) for g in counter.graphs for node in g.graph.nodes if node.op == "call_function"}
    assert counter.frame_count == 1
    assert {"bertaccel.bias_gelu_fwd.default", "bertaccel.bias_dropout_residual_layernorm_fwd.default"} <= ops, ops
    for t in inputs:
        t.grad = None
    y_eager = layer(*inputs, seed)
    y_eager.sum().backward()
    assert torch.equal(y, y_eager)
    for name, t, g in zip(NAMES, inputs, compiled_grads):
        assert torch.equal(t.grad, g), name
