"""AdanFused (one Triton launch per param group): against Adan (foreach) and a float64 reference,
flat-buffer parameters that still behave as parameters, state_dict, capturable, training.

On a machine without CUDA the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set
before anything imports Triton, as conftest.py does too); sizes are kept small for it.
"""
from __future__ import annotations

import copy
import io
import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from torch import nn  # noqa: E402

pytest.importorskip("triton")

from bertaccel.optimizers import adan_fused as AF  # noqa: E402
from bertaccel.optimizers import adan_kernel  # noqa: E402
from bertaccel.optimizers.adan import Adan  # noqa: E402
from bertaccel.optimizers.adan_fused import AdanFused, grad_copies_last_step, kernel_launches_per_step  # noqa: E402
from bertaccel.train.step_graph import restore_first_step  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BETAS = (0.98, 0.92, 0.99)
# Several shapes, one spanning two kernel blocks and one a single element.
SHAPES = [(3, 5), (7,), (2, 3, 4), (1,), (AF.BLOCK + 37,)]
RTOL, ATOL = 1e-5, 1e-6


def _params(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=g).to(DEVICE, dtype)) for s in SHAPES]


def _groups(ps, lr=None):
    """Two groups, different weight decay (BERT's decay / no-decay split); the second sets its own lr."""
    return [{"params": ps[:3], "weight_decay": 0.1}, {"params": ps[3:], "weight_decay": 0.0, "lr": 2e-2}]


def _grads(step, shapes=SHAPES, seed=100):
    g = torch.Generator().manual_seed(seed + step)
    return [torch.randn(s, generator=g).to(DEVICE) for s in shapes]


class Ref64:
    """Adan from the equations in float64, the official per-group step count: k counts the group's
    steps; a tensor without a gradient is skipped; a tensor's first gradient sets pre_grad = g."""

    def __init__(self, groups, betas=BETAS, eps=1e-8):
        self.groups = [(list(ps), lr, wd) for ps, lr, wd in groups]  # float64 tensors
        self.b1, self.b2, self.b3 = betas
        self.eps = eps
        self.k = [0] * len(groups)
        self.st = {}

    def step(self, grads):  # grads: per group, a list of float64 tensors or None
        b1, b2, b3 = self.b1, self.b2, self.b3
        for gi, ((ps, lr, wd), gs) in enumerate(zip(self.groups, grads)):
            self.k[gi] += 1
            k = self.k[gi]
            for j, (p, g) in enumerate(zip(ps, gs)):
                if g is None:
                    continue
                s = self.st.setdefault((gi, j), dict(m=torch.zeros_like(p), v=torch.zeros_like(p),
                                                     n=torch.zeros_like(p), pre=g.clone()))
                diff = g - s["pre"]
                s["m"] = b1 * s["m"] + (1 - b1) * g
                s["v"] = b2 * s["v"] + (1 - b2) * diff
                u = g + b2 * diff
                s["n"] = b3 * s["n"] + (1 - b3) * u * u
                denom = s["n"].sqrt() / math.sqrt(1 - b3 ** k) + self.eps
                p -= lr / (1 - b1 ** k) * s["m"] / denom + lr * b2 / (1 - b2 ** k) * s["v"] / denom
                p /= 1 + lr * wd
                s["pre"] = g.clone()


def _close(a, b, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(a.detach().double().cpu(), b.detach().double().cpu(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("capturable", [False, True])
def test_matches_adan_foreach_and_float64_reference(capturable):
    lr = 1e-2
    fused_ps, adan_ps = _params(), _params()
    ref_ps = [p.detach().double().clone() for p in _params()]
    fused_lr = torch.tensor(lr, device=DEVICE) if capturable else lr  # capturable: the kernel reads lr
    fused = AdanFused(_groups(fused_ps), lr=fused_lr, betas=BETAS, capturable=capturable)
    adan = Adan(_groups(adan_ps), lr=lr, betas=BETAS, foreach=True)
    ref = Ref64([(ref_ps[:3], lr, 0.1), (ref_ps[3:], 2e-2, 0.0)])
    for step in range(5):
        gs = _grads(step)
        for p, q, g in zip(fused_ps, adan_ps, gs):
            p.grad, q.grad = g.clone(), g.clone()
        fused.step()
        adan.step()
        ref.step([[g.double() for g in gs[:3]], [g.double() for g in gs[3:]]])
        for p, q, r in zip(fused_ps, adan_ps, ref_ps):
            _close(p, q)
            _close(p, r)
    for p, q in zip(fused_ps, adan_ps):
        for key in ("exp_avg", "exp_avg_diff", "exp_avg_sq", "pre_grad"):
            _close(fused.state[p][key], adan.state[q][key])
        assert float(fused.state[p]["step"]) == float(adan.state[q]["step"]) == 5
    # one update launch per param group; capturable, each followed by its step count's advance
    assert kernel_launches_per_step(fused) == 2 * (1 + capturable)
    assert grad_copies_last_step(fused) == 2     # fresh grad tensors: one foreach copy per group


def test_params_are_views_of_flat_buffers_and_still_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to(DEVICE)
    opt = AdanFused(_bert_groups(model), lr=1e-2)
    assert kernel_launches_per_step(opt) == 2  # planned, before any step
    x, y = torch.randn(16, 4, device=DEVICE), torch.randn(16, 2, device=DEVICE)
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    # Every parameter now lives in its group's flat buffer, still the same nn.Parameter.
    for group, buckets in zip(opt.param_groups, opt._buckets):
        (bucket,) = buckets
        for p in group["params"]:
            assert isinstance(p, nn.Parameter) and p.is_leaf and p.requires_grad
            assert p.untyped_storage().data_ptr() == bucket.p.untyped_storage().data_ptr()
            assert p.grad.untyped_storage().data_ptr() == bucket.g.untyped_storage().data_ptr()
            assert (opt.state[p]["exp_avg"].untyped_storage().data_ptr()
                    == bucket.state["exp_avg"].untyped_storage().data_ptr())
    # Gradients kept as views (zero_grad(set_to_none=False)): backward accumulates into the flat
    # buffer and the step copies nothing.
    opt.zero_grad(set_to_none=False)
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    assert (kernel_launches_per_step(opt), grad_copies_last_step(opt)) == (2, 0)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # torch's default zero_grad: grads None, fresh grads next backward, copied in by the step.
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    assert grad_copies_last_step(opt) == 2
    # Module state_dict round trip (in-place copies keep the views).
    sd = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.load_state_dict(sd)
    assert all(torch.equal(p, sd[k]) for k, p in model.named_parameters())


def _bert_groups(model, wd=0.01):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g).to(DEVICE)
        y = x[:, :2] * 2 - x[:, 2:] + 0.5
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("capturable", [False, True])
def test_state_dict_round_trip_resumes_identically(capturable):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to(DEVICE)
    opt = AdanFused(_bert_groups(model), lr=1e-2, capturable=capturable)
    _train(model, opt, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert {k for st in saved["opt"]["state"].values() for k in st} == {
        "step", "exp_avg", "exp_avg_diff", "exp_avg_sq", "pre_grad"}  # Adan's state keys
    model2 = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to(DEVICE)
    model2.load_state_dict(saved["model"])
    opt2 = AdanFused(_bert_groups(model2), lr=1e-2, capturable=capturable)
    opt2.load_state_dict(saved["opt"])
    a, b = _train(model, opt, 2, seed=7), _train(model2, opt2, 2, seed=7)
    assert a == b
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert float(opt2.state[next(model2.parameters())]["step"]) == 5


def test_resumes_from_adan_state_dict():
    """Same state keys as Adan: a run can move from Adan to AdanFused mid-training."""
    torch.manual_seed(0)
    m_adan = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to(DEVICE)
    m_fused = copy.deepcopy(m_adan)
    adan = Adan(_bert_groups(m_adan), lr=1e-2)
    _train(m_adan, adan, 3)
    m_fused.load_state_dict(m_adan.state_dict())
    fused = AdanFused(_bert_groups(m_fused), lr=1e-2)
    fused.load_state_dict(copy.deepcopy(adan.state_dict()))  # (a loaded state shares tensors)
    _train(m_adan, adan, 2, seed=5)
    _train(m_fused, fused, 2, seed=5)
    for p, q in zip(m_fused.parameters(), m_adan.parameters()):
        _close(p, q)


@pytest.mark.parametrize("capturable", [False, True])
def test_missing_grads_are_skipped_and_late_tensors_start_fresh(capturable):
    """A tensor without a gradient is untouched (its blocks are left out of the launch); one that
    gets its first gradient at step 3 starts with diff = 0 and the group's step count."""
    lr = 1e-2
    ps = _params()
    ref_ps = [p.detach().double().clone() for p in ps]
    opt = AdanFused([{"params": ps, "weight_decay": 0.05}], lr=lr, capturable=capturable)
    ref = Ref64([(ref_ps, lr, 0.05)])
    never, late = 1, 4
    for step in range(5):
        gs = _grads(step)
        use = [g if (i != never and (i != late or step >= 2)) else None for i, g in enumerate(gs)]
        for p, g in zip(ps, use):
            p.grad = None if g is None else g.clone()
        opt.step()
        ref.step([[None if g is None else g.double() for g in use]])
        assert kernel_launches_per_step(opt) == 1 + capturable
        for p, r in zip(ps, ref_ps):
            _close(p, r)
    assert torch.equal(ps[never].detach().cpu(), _params()[never].detach().cpu())
    assert float(opt.state[ps[0]]["step"]) == 5


def test_capturable_bias_corrections_at_a_late_step():
    """The capturable kernel computes beta ** k itself (fp64 binary exponentiation): resumed at
    step 37 (an exponent of several bits) it gives the host-computed (non-capturable) update."""
    out = []
    for capturable in (False, True):
        ps = _params()
        opt = AdanFused([{"params": ps, "weight_decay": 0.1}], lr=1e-2, capturable=capturable)
        for p, g in zip(ps, _grads(0)):
            p.grad = g.clone()
        opt.step()
        for st in opt.state.values():
            st["step"].fill_(36)
        for p, g in zip(ps, _grads(1)):
            p.grad = g.clone()
        opt.step()
        assert float(opt.state[ps[0]]["step"]) == 37
        out.append([p.detach().clone() for p in ps])
    for a, b in zip(*out):
        _close(a, b)


def test_a_step_without_any_gradient_still_counts():
    """Official Adan counts the group's steps whatever had a gradient; capturable mode launches
    only the step count's advance for it (no update: no tensor has a gradient)."""
    for capturable in (False, True):
        ps = _params()
        before = [p.detach().clone() for p in ps]
        opt = AdanFused([{"params": ps}], lr=1e-2, capturable=capturable)
        opt.step()
        assert kernel_launches_per_step(opt) == int(capturable)
        assert float(opt.state[ps[0]]["step"]) == 1
        assert all(torch.equal(p, q) for p, q in zip(ps, before))


def test_replaced_storage_is_detected_and_rebuilt():
    """If something replaces a parameter's storage (model.to(), p.data = ...), the next step copies
    it into new flat buffers instead of updating a buffer the parameter no longer uses."""
    lr = 1e-2
    ps = _params()
    ref_ps = [p.detach().double().clone() for p in ps]
    opt = AdanFused([{"params": ps}], lr=lr)
    ref = Ref64([(ref_ps, lr, 0.0)])
    for step in range(4):
        if step == 2:
            ps[0].data = ps[0].data.clone()
        gs = _grads(step)
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
        ref.step([[g.double() for g in gs]])
    for p, r in zip(ps, ref_ps):
        _close(p, r)


def test_zeroed_state_restarts_like_a_fresh_optimizer():
    """The step-graph loop resets the optimizer by zeroing every state tensor (step included)
    after its eager warm-up step; the next step must then be a first step again."""
    ps, fresh_ps = _params(), _params()
    opt = AdanFused([{"params": ps}], lr=1e-2, capturable=True)
    for p, g in zip(ps, _grads(9)):
        p.grad = g.clone()
    opt.step()
    restore_first_step(ps, fresh_ps, opt)  # as StepGraphs.capture leaves it
    fresh = AdanFused([{"params": fresh_ps}], lr=1e-2, capturable=True)
    for step in range(2):
        for p, q, g in zip(ps, fresh_ps, _grads(step)):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        fresh.step()
    for p, q in zip(ps, fresh_ps):
        assert torch.equal(p, q)


def test_mixed_dtypes_launch_once_per_dtype():
    """A group holding fp32 and fp16 tensors: one flat buffer and one launch per dtype; the fp16
    update is computed in fp32 from an fp32 master (fp32 state) and rounded once."""
    lr = 1e-2
    p32 = nn.Parameter(torch.randn(5, 3, device=DEVICE))
    p16 = nn.Parameter(torch.randn(9, device=DEVICE).half())
    r32, r16 = p32.detach().double().clone(), p16.detach().double().clone()
    opt = AdanFused([p32, p16], lr=lr, weight_decay=0.1)
    ref = Ref64([([r32, r16], lr, 0.1)])
    for step in range(3):
        g32, g16 = _grads(step, shapes=[(5, 3), (9,)])
        p32.grad, p16.grad = g32.clone(), g16.half()
        opt.step()
        ref.step([[g32.double(), g16.half().double()]])
    assert kernel_launches_per_step(opt) == 2
    assert p16.dtype == torch.float16 and opt.state[p16]["exp_avg"].dtype == torch.float32
    assert opt.state[p16]["master_param"].dtype == torch.float32 and "master_param" not in opt.state[p32]
    _close(p32, r32)
    _close(p16, r16, rtol=2e-3, atol=2e-3)


def test_loss_decreases_on_a_tiny_regression():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)).to(DEVICE)
    opt = AdanFused(_bert_groups(model), lr=3e-2)
    losses = _train(model, opt, 40)
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < 0.3 * sum(losses[:5]) / 5


def test_bad_arguments_raise_one_line():
    p = [nn.Parameter(torch.zeros(3, device=DEVICE))]
    for kwargs, match in [(dict(lr=-1.0), "lr"), (dict(betas=(0.9, 0.99)), "betas"),
                          (dict(betas=(0.9, 1.0, 0.9)), r"betas\[1\]"), (dict(eps=0.0), "eps"),
                          (dict(weight_decay=-0.1), "weight_decay")]:
        with pytest.raises(ValueError, match=f"^AdanFused: {match}[^\n]*$"):
            AdanFused(p, **kwargs)
    with pytest.raises(TypeError):
        AdanFused(p, foreach=True)  # no foreach switch: the step is always one kernel


def test_without_triton_the_constructor_says_so(monkeypatch):
    monkeypatch.setattr(adan_kernel, "triton", None)
    monkeypatch.setattr(adan_kernel, "TRITON_ERROR", ImportError("No module named 'triton'"))
    with pytest.raises(RuntimeError, match=r"^AdanFused needs Triton, which cannot be imported here "
                                           r"\(No module named 'triton'\); use Adan\(foreach=True\) instead$"):
        AdanFused([nn.Parameter(torch.zeros(3))])


def test_launch_count_of_other_optimizers_is_unknown():
    assert kernel_launches_per_step(torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=0.1)) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_capturable_step_replays_from_a_cuda_graph():
    """capturable=True: the step (kernel reading lr and k from device memory, k advanced by the
    kernel) captured once and replayed matches eager Adan step for step, lr changes included."""
    lr = torch.tensor(1e-2, device=DEVICE)
    ps, adan_ps = _params(), _params()
    opt = AdanFused(_groups(ps), lr=lr, capturable=True)
    adan = Adan(_groups(adan_ps), lr=1e-2)
    for p in ps:
        p.grad = torch.zeros_like(p)
    # Eager warm-up step on a side stream (builds the flat buffers, compiles), then reset.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    init = [p.detach().clone() for p in ps]
    with torch.cuda.stream(side):
        opt.step()
    torch.cuda.current_stream().wait_stream(side)
    restore_first_step(ps, init, opt)  # as StepGraphs.capture leaves it
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    for step in range(5):
        lr_now = 1e-2 * (1 - 0.1 * step)
        lr.fill_(lr_now)
        adan.param_groups[0]["lr"] = lr_now  # the second group's own float lr stays 2e-2 in both
        for p, q, g in zip(ps, adan_ps, _grads(step)):
            p.grad.copy_(g)
            q.grad = g.clone()
        graph.replay()
        adan.step()
    torch.cuda.synchronize()
    for p, q in zip(ps, adan_ps):
        _close(p, q)
    assert float(opt.state[ps[0]]["step"]) == 5
