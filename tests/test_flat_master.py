"""fp32 master weights of fp16/bf16 parameters in the flat-buffer optimizers (AdamWFused,
AdanFused): the master follows an fp32 run, the half parameter is its rounding, state_dict keeps
the master, a zeroed state restarts from the weights, and torch.amp.GradScaler's scale and inf
skips are applied inside the kernel.

CPU: Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py before anything imports Triton).
"""
from __future__ import annotations

import io
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from torch import nn  # noqa: E402

pytest.importorskip("triton")

from bertaccel.optimizers.adamw_flat import AdamWFused  # noqa: E402
from bertaccel.optimizers.adan import Adan  # noqa: E402
from bertaccel.optimizers.adan_fused import AdanFused  # noqa: E402
from bertaccel.optimizers.flat import BLOCK, MASTER_KEY, kernel_launches_per_step  # noqa: E402
from bertaccel.optimizers.flat_kernel import jit, store_param, tl  # noqa: E402
from bertaccel.train.step_graph import restore_first_step  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(3, 5), (7,), (BLOCK + 37,), (1,)]


def _adamw_ref(groups, **kw):
    return torch.optim.AdamW(groups, foreach=False, **kw)


def _adan_ref(groups, **kw):
    return Adan(groups, foreach=False, **kw)


# name: (flat optimizer, the fp32 reference of the same algorithm, its state keys, rtol)
ALGORITHMS = {
    "adamw": (AdamWFused, _adamw_ref, ("exp_avg", "exp_avg_sq"), 2e-6),
    "adan": (AdanFused, _adan_ref, ("exp_avg", "exp_avg_diff", "exp_avg_sq", "pre_grad"), 1e-5),
}


def _weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(DEVICE) for s in SHAPES]


def _grads(step, seed=100):
    g = torch.Generator().manual_seed(seed + step)
    return [torch.randn(s, generator=g).to(DEVICE) for s in SHAPES]


def _groups(ps):
    return [{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}]


def _lr(value, capturable):
    return torch.tensor(value, device=DEVICE) if capturable else value


def _close(a, b, rtol):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=rtol, atol=rtol / 10)


@pytest.mark.parametrize("capturable", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_master_follows_an_fp32_run_and_the_half_parameter_is_its_rounding(name, dtype, capturable):
    """Half parameters, half gradients: the fp32 master equals the fp32 reference optimizer run on
    fp32 copies fed the same (half-rounded) gradients; the parameter is master.to(half) exactly,
    and it lives in the half workspace (no fp32 copy behind p.data); one launch per group."""
    Fused, Ref, keys, rtol = ALGORITHMS[name]
    half = [nn.Parameter(w.to(dtype)) for w in _weights()]
    ref = [nn.Parameter(w.to(dtype).float()) for w in _weights()]
    opt = Fused(_groups(half), lr=_lr(1e-2, capturable), capturable=capturable)
    ref_opt = Ref(_groups(ref), lr=1e-2)
    for step in range(4):
        for p, q, g in zip(half, ref, _grads(step)):
            p.grad, q.grad = g.to(dtype), g.to(dtype).float()
        opt.step()
        ref_opt.step()
    # master and workspace written by the same launch (capturable: then the step count's advance)
    assert kernel_launches_per_step(opt) == 2 * (1 + capturable)
    for p, q in zip(half, ref):
        master = opt.state[p][MASTER_KEY]
        assert p.dtype == dtype and p.grad.dtype == dtype and master.dtype == torch.float32
        _close(master, q, rtol)
        assert torch.equal(p.detach(), master.to(dtype))
        for key in keys:
            assert opt.state[p][key].dtype == torch.float32
            _close(opt.state[p][key], ref_opt.state[q][key], rtol)
    for bucket in (b for bs in opt._buckets for b in bs):
        assert bucket.p.dtype == dtype and bucket.master.dtype == torch.float32
        for p in bucket.params:
            assert p.untyped_storage().data_ptr() == bucket.p.untyped_storage().data_ptr()
            assert p.untyped_storage().nbytes() == bucket.total * dtype.itemsize


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_fp32_parameters_have_no_master(name):
    Fused = ALGORITHMS[name][0]
    ps = [nn.Parameter(w) for w in _weights()]
    opt = Fused(_groups(ps), lr=1e-2)
    for p, g in zip(ps, _grads(0)):
        p.grad = g
    opt.step()
    assert all(b.master is None for bs in opt._buckets for b in bs)
    assert all(MASTER_KEY not in opt.state[p] for p in ps)


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_updates_below_bf16_resolution_accumulate_in_the_master():
    """What the master is for: 100 AdamW steps of about lr = 1e-4 each on a weight of 1.0, whose
    bf16 spacing is 2**-7. Updated in bf16 (torch's AdamW on bf16 parameters) every step rounds
    back to 1.0; from the fp32 master the weight reaches 1 - 100 * lr (rounded to bf16)."""
    plain = nn.Parameter(torch.ones(4, device=DEVICE, dtype=torch.bfloat16))
    mastered = nn.Parameter(torch.ones(4, device=DEVICE, dtype=torch.bfloat16))
    torch_opt = torch.optim.AdamW([plain], lr=1e-4, weight_decay=0.0, foreach=False)
    opt = AdamWFused([mastered], lr=1e-4, weight_decay=0.0)
    for _ in range(100):
        plain.grad = torch.ones_like(plain)
        mastered.grad = torch.ones_like(mastered)
        torch_opt.step()
        opt.step()
    assert torch.equal(plain.detach(), torch.ones_like(plain))
    _close(opt.state[mastered][MASTER_KEY], torch.full((4,), 1 - 100 * 1e-4, device=DEVICE), 1e-5)
    assert torch.equal(mastered.detach(), torch.full_like(mastered, 1 - 100 * 1e-4))  # rounds to 0.98828125


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(DEVICE, dtype)


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g).to(DEVICE)
        loss = nn.functional.mse_loss(model(x.to(dtype)).float(), x[:, :2] * 2 - x[:, 2:])
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_state_dict_keeps_the_fp32_master(name):
    """Saved and loaded, the master and state stay fp32 (torch's load_state_dict would cast them
    to bf16), and the resumed run equals the uninterrupted one exactly. A model loaded with other
    weights than the checkpoint's restarts its master from them."""
    Fused, _, keys, _ = ALGORITHMS[name]
    dtype = torch.bfloat16
    model = _model(dtype)
    opt = Fused(model.parameters(), lr=1e-2)
    _train(model, opt, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert {k for st in saved["opt"]["state"].values() for k in st} == {"step", MASTER_KEY, *keys}
    masters = [st[MASTER_KEY] for st in saved["opt"]["state"].values()]
    assert all(m.dtype == torch.float32 for m in masters)
    assert any(not torch.equal(m, p.detach().float()) for m, p in zip(masters, model.parameters()))
    model2 = _model(dtype, seed=5)
    model2.load_state_dict(saved["model"])
    opt2 = Fused(model2.parameters(), lr=1e-2)
    opt2.load_state_dict(saved["opt"])
    for p, m in zip(model2.parameters(), masters):
        assert opt2.state[p][MASTER_KEY].dtype == torch.float32 and torch.equal(opt2.state[p][MASTER_KEY], m)
        assert all(opt2.state[p][k].dtype == torch.float32 for k in keys)
    _train(model, opt, 2, seed=7)
    _train(model2, opt2, 2, seed=7)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p][MASTER_KEY], opt2.state[q][MASTER_KEY])
    # The same optimizer state over a model holding other weights: the master restarts from them
    # (lr 0: the step moves nothing, so the master is the parameter's value).
    other = _model(dtype, seed=9)
    opt3 = Fused(other.parameters(), lr=0.0)
    opt3.load_state_dict(saved["opt"])
    for group in opt3.param_groups:
        group["lr"] = 0.0
    weights = [p.detach().clone() for p in other.parameters()]
    _train(other, opt3, 1)
    for p, w in zip(other.parameters(), weights):
        assert torch.equal(opt3.state[p][MASTER_KEY], w.float()) and torch.equal(p.detach(), w)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_zeroed_state_restarts_from_the_weights_put_back(name):
    """The step-graph capture's reset: after an eager step, the weights are copied back into the
    half parameters in place and every state tensor is zeroed (the master included). The next
    steps equal a fresh optimizer's: a first step reseeds the master from the workspace."""
    Fused = ALGORITHMS[name][0]
    dtype = torch.bfloat16
    ps = [nn.Parameter(w.to(dtype)) for w in _weights()]
    fresh_ps = [nn.Parameter(w.to(dtype)) for w in _weights()]
    init = [p.detach().clone() for p in ps]
    opt = Fused(_groups(ps), lr=_lr(1e-2, True), capturable=True)
    for p, g in zip(ps, _grads(9)):
        p.grad = g.to(dtype)
    opt.step()
    restore_first_step(ps, init, opt)  # as StepGraphs.capture leaves it
    fresh = Fused(_groups(fresh_ps), lr=_lr(1e-2, True), capturable=True)
    for step in range(2):
        for p, q, g in zip(ps, fresh_ps, _grads(step)):
            p.grad, q.grad = g.to(dtype), g.to(dtype)
        opt.step()
        fresh.step()
    for p, q in zip(ps, fresh_ps):
        assert torch.equal(p, q) and torch.equal(opt.state[p][MASTER_KEY], fresh.state[q][MASTER_KEY])


def _scaler(scale):
    scaler = torch.amp.GradScaler(DEVICE, init_scale=scale, growth_interval=1000)
    scaler.scale(torch.ones((), device=DEVICE))  # creates its scale tensor, as scaling the loss does
    return scaler


@pytest.mark.parametrize("capturable", [False, True])
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_grad_scaler_unscales_in_the_kernel_and_skips_inf_steps(name, capturable):
    """fp16 parameters under torch.amp.GradScaler: scaler.step hands the scale to the optimizer
    (_step_supports_amp_scaling), the kernel unscales the fp16 gradients as it reads them; a step
    with an inf gradient changes nothing (parameters, master, state, step count) and the scaler
    backs off. Its usual unscale_ (before clipping) refuses the fp16 gradients."""
    Fused, Ref, keys, rtol = ALGORITHMS[name]
    dtype = torch.float16
    half = [nn.Parameter(w.to(dtype)) for w in _weights()]
    ref = [nn.Parameter(w.to(dtype).float()) for w in _weights()]
    opt = Fused(_groups(half), lr=_lr(1e-2, capturable), capturable=capturable)
    ref_opt = Ref(_groups(ref), lr=1e-2)
    scaler = _scaler(2.0 ** 10)
    for step in range(4):
        scale = scaler.get_scale()
        scaled = [(g * scale).to(dtype) for g in _grads(step)]  # what backward of a scaled loss gives
        if step == 2:
            scaled[1][0] = float("inf")
            before = [(p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()}) for p in half]
        for p, g in zip(half, scaled):
            p.grad = g
        scaler.step(opt)
        scaler.update()
        if step == 2:
            assert scaler.get_scale() == scale / 2
            for p, (w, st) in zip(half, before):
                assert torch.equal(p.detach(), w)
                assert all(torch.equal(opt.state[p][k], v) for k, v in st.items())
            continue
        for q, g in zip(ref, scaled):
            q.grad = g.float() * (1.0 / scale)
        ref_opt.step()
    for p, q in zip(half, ref):
        assert float(opt.state[p]["step"]) == 3
        _close(opt.state[p][MASTER_KEY], q, rtol)
        assert torch.equal(p.detach(), opt.state[p][MASTER_KEY].to(dtype))
    for p, g in zip(half, _grads(5)):
        p.grad = (g * scaler.get_scale()).to(dtype)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler.unscale_(opt)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_grad_scaler_with_unscale_and_clipping_on_fp32_parameters(name):
    """fp32 parameters (fp16 autocast): the training loop's unscale_ -> clip_grad_norm_ ->
    scaler.step runs as with torch's optimizers (only found_inf is left for the step)."""
    Fused, Ref, _, rtol = ALGORITHMS[name]
    ps = [nn.Parameter(w) for w in _weights()]
    ref = [nn.Parameter(w) for w in _weights()]
    opt, ref_opt = Fused(_groups(ps), lr=1e-2), Ref(_groups(ref), lr=1e-2)
    scalers = _scaler(2.0 ** 8), _scaler(2.0 ** 8)
    for step in range(3):
        for params, o, scaler in ((ps, opt, scalers[0]), (ref, ref_opt, scalers[1])):
            for p, g in zip(params, _grads(step)):
                p.grad = g * scaler.get_scale()
            scaler.unscale_(o)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            scaler.step(o)
            scaler.update()
    for p, q in zip(ps, ref):
        _close(p, q, rtol)


@jit
def _store_rounded(P, W, N: tl.constexpr):
    offs = tl.arange(0, N)
    store_param(P, W, offs, offs < N, tl.load(P + offs), True)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the interpreter's fp16 of 3.4e38: inf
def test_the_workspace_is_rounded_to_nearest_even_as_torch_rounds():
    """The kernels' fp32 -> half write (store_param) on values where rounding modes differ: ties
    (to even), just above and below them, the top of the range (to inf), subnormals, inf, NaN."""
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF818000, 0x7F7FFFFF,
                         0x00008000, 0x00018000, 0x7F800000, 0xFF800000, 0x7FFFFFFF, 0x3F800000],
                        dtype=torch.int64).to(torch.int32)
    g = torch.Generator().manual_seed(0)
    values = torch.cat([bits.view(torch.float32), torch.randn(52, generator=g) * 100]).to(DEVICE)
    for dtype in (torch.bfloat16, torch.float16):
        w = torch.zeros(64, dtype=dtype, device=DEVICE)
        _store_rounded[(1,)](values.clone(), w, N=64)
        expected = values.to(dtype)
        assert torch.equal(w.isnan(), expected.isnan())
        ok = ~expected.isnan()
        assert torch.equal(w[ok].view(torch.int16), expected[ok].view(torch.int16)), dtype


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_capturable_bf16_step_replays_from_a_cuda_graph(name):
    """capturable=True with bf16 parameters: the step (master, workspace, state, step count and lr
    on the device) captured once after the step-graph loop's reset and replayed equals an eager
    capturable instance step for step, lr changes included."""
    Fused = ALGORITHMS[name][0]
    dtype = torch.bfloat16
    lr, eager_lr = torch.tensor(1e-2, device=DEVICE), torch.tensor(1e-2, device=DEVICE)
    ps = [nn.Parameter(w.to(dtype)) for w in _weights()]
    eager_ps = [nn.Parameter(w.to(dtype)) for w in _weights()]
    opt = Fused(_groups(ps), lr=lr, capturable=True)
    eager = Fused(_groups(eager_ps), lr=eager_lr, capturable=True)
    for p in ps:
        p.grad = torch.zeros_like(p)
    init = [p.detach().clone() for p in ps]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager warm-up (builds the buffers, compiles), then the reset
        opt.step()
    torch.cuda.current_stream().wait_stream(side)
    restore_first_step(ps, init, opt)  # as StepGraphs.capture leaves it
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for step in range(4):
        lr.fill_(1e-2 * (1 - 0.1 * step))
        eager_lr.fill_(1e-2 * (1 - 0.1 * step))
        for p, q, g in zip(ps, eager_ps, _grads(step)):
            p.grad.copy_(g.to(dtype))
            q.grad = g.to(dtype)
        graph.replay()
        eager.step()
    torch.cuda.synchronize()
    for p, q in zip(ps, eager_ps):
        assert torch.equal(p, q) and torch.equal(opt.state[p][MASTER_KEY], eager.state[q][MASTER_KEY])
        assert float(opt.state[p]["step"]) == 4
