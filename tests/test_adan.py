"""Adan (bertaccel.optimizers.adan): against an independent reference, capturable, state, training."""
from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from bertaccel.optimizers.adan import Adan

BETAS = (0.98, 0.92, 0.99)
STEPS = 10


# ---------------------------------------------------------------- independent reference
class RefAdan:
    """Adan written from the equations, one tensor at a time, no in-place tricks."""

    def __init__(self, groups, betas=BETAS, eps=1e-8):
        self.groups = groups  # [(params, lr, weight_decay)]
        self.b1, self.b2, self.b3 = betas
        self.eps = eps
        self.state = {}

    def step(self):
        b1, b2, b3 = self.b1, self.b2, self.b3
        for params, lr, wd in self.groups:
            for p in params:
                g = p.grad
                if g is None:
                    continue
                st = self.state.setdefault(id(p), dict(k=0, m=torch.zeros_like(p), v=torch.zeros_like(p),
                                                       n=torch.zeros_like(p), pre=g.clone()))
                st["k"] += 1
                k = st["k"]
                diff = g - st["pre"]
                st["m"] = b1 * st["m"] + (1 - b1) * g
                st["v"] = b2 * st["v"] + (1 - b2) * diff
                u = g + b2 * diff
                st["n"] = b3 * st["n"] + (1 - b3) * u * u
                denom = torch.sqrt(st["n"]) / math.sqrt(1 - b3 ** k) + self.eps
                new = (p - lr / (1 - b1 ** k) * st["m"] / denom
                       - lr * b2 / (1 - b2 ** k) * st["v"] / denom)
                p.copy_(new / (1 + lr * wd))
                st["pre"] = g.clone()


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.lin = nn.Linear(6, 5)
        self.norm = nn.LayerNorm(5)
        self.conv = nn.Conv1d(5, 3, kernel_size=3)
        self.scale = nn.Parameter(torch.tensor(0.7))
        self.late = nn.Parameter(torch.randn(4, 2))    # no grad on steps 1-2: its state starts later
        self.gappy = nn.Parameter(torch.randn(3))      # no grad on steps 5-6


def make_model(dtype, seed=0):
    torch.manual_seed(seed)
    return Small().to(dtype)


def param_groups(model, lr=(2e-2, 5e-3)):
    decay = [model.emb.weight, model.lin.weight, model.conv.weight, model.late]
    no_decay = [model.lin.bias, model.norm.weight, model.norm.bias, model.conv.bias, model.scale, model.gappy]
    return [dict(params=decay, lr=lr[0], weight_decay=0.1), dict(params=no_decay, lr=lr[1], weight_decay=0.0)]


def fake_grads(model, step, gen):
    """Deterministic gradients for `step` (1-based), with the None pattern described in Small."""
    for name, p in model.named_parameters():
        g = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
        p.grad = g
        if name == "late" and step <= 2:
            p.grad = None
        if name == "gappy" and step in (5, 6):
            p.grad = None


def run_adan(model, opt, steps=STEPS, seed=123, start=1):
    gen = torch.Generator().manual_seed(seed)
    # burn the generator for steps before `start`, so a resumed run sees the same grads
    for step in range(1, start + steps):
        fake_grads(model, step, gen)
        if step >= start:
            opt.step()
    return model


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---------------------------------------------------------------- against the reference
@pytest.mark.parametrize("foreach", [True, False])
def test_float64_matches_reference_step_by_step(foreach):
    ours, ref_model = make_model(torch.float64), make_model(torch.float64)
    opt = Adan(param_groups(ours), betas=BETAS, foreach=foreach)
    groups = param_groups(ref_model)
    ref = RefAdan([(g["params"], g["lr"], g["weight_decay"]) for g in groups])
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    start = flat(ours).clone()
    for step in range(1, STEPS + 1):
        fake_grads(ours, step, gen_a)
        fake_grads(ref_model, step, gen_b)
        opt.step()
        with torch.no_grad():
            ref.step()
        for (name, p), q in zip(ours.named_parameters(), ref_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-14, msg=f"{name} step {step}")
    assert not torch.equal(flat(ours), start)
    # per-parameter step counts: `late` started at step 3, `gappy` skipped two steps
    assert opt.state[ours.late]["step"].item() == STEPS - 2
    assert opt.state[ours.gappy]["step"].item() == STEPS - 2
    assert opt.state[ours.lin.weight]["step"].item() == STEPS
    # the skipped steps really left `gappy` alone
    assert torch.is_tensor(opt.state[ours.gappy]["step"])


def test_float64_foreach_equals_single():
    a, b = make_model(torch.float64), make_model(torch.float64)
    run_adan(a, Adan(param_groups(a), foreach=True))
    run_adan(b, Adan(param_groups(b), foreach=False))
    torch.testing.assert_close(flat(a), flat(b), rtol=1e-13, atol=1e-15)


def test_float32_foreach_matches_single_within_rounding():
    a, b = make_model(torch.float32), make_model(torch.float32)
    oa, ob = Adan(param_groups(a), foreach=True), Adan(param_groups(b), foreach=False)
    run_adan(a, oa)
    run_adan(b, ob)
    torch.testing.assert_close(flat(a), flat(b), rtol=1e-5, atol=1e-6)
    for p in a.parameters():
        st = oa.state[p]
        assert all(st[k].dtype == torch.float32 for k in ("exp_avg", "exp_avg_diff", "exp_avg_sq", "pre_grad"))
    # and float32 tracks the float64 reference to float32 accuracy
    c = make_model(torch.float64)
    run_adan(c, Adan(param_groups(c), foreach=True))
    torch.testing.assert_close(flat(a).double(), flat(c), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- first step
def test_first_step_difference_is_zero():
    torch.manual_seed(1)
    p = nn.Parameter(torch.randn(20, dtype=torch.float64))
    p0 = p.detach().clone()
    g = torch.randn(20, dtype=torch.float64)
    lr, wd, eps = 1e-2, 0.05, 1e-8
    opt = Adan([p], lr=lr, weight_decay=wd, eps=eps)
    p.grad = g.clone()
    opt.step()
    st = opt.state[p]
    assert torch.count_nonzero(st["exp_avg_diff"]) == 0          # v stays 0: diff = 0
    torch.testing.assert_close(st["exp_avg"], (1 - BETAS[0]) * g)
    torch.testing.assert_close(st["exp_avg_sq"], (1 - BETAS[2]) * g * g)  # u = g
    torch.testing.assert_close(st["pre_grad"], g)
    # bias-corrected: m_hat = g, n_hat = g^2, so the first step is lr*g/(|g|+eps) ~ lr*sign(g)
    torch.testing.assert_close(p.detach(), (p0 - lr * g / (g.abs() + eps)) / (1 + lr * wd), rtol=1e-12, atol=1e-15)
    # second step with the same gradient: still no difference
    p.grad = g.clone()
    opt.step()
    assert torch.count_nonzero(opt.state[p]["exp_avg_diff"]) == 0


# ---------------------------------------------------------------- capturable
@pytest.mark.parametrize("foreach", [True, False])
def test_capturable_tensor_lr_matches_float_lr(foreach):
    a, b = make_model(torch.float64), make_model(torch.float64)
    oa = Adan(param_groups(a), foreach=foreach)
    groups = param_groups(b)
    for g in groups:
        g["lr"] = torch.tensor(g["lr"], dtype=torch.float64)
    ob = Adan(groups, foreach=foreach, capturable=True)
    run_adan(a, oa)
    run_adan(b, ob)
    # same operations, scalars computed in float64 on the device: the same numbers (bitwise on
    # this CPU; the tolerance leaves room for a 1-ulp pow() on other builds)
    torch.testing.assert_close(flat(b), flat(a), rtol=1e-12, atol=1e-15)
    assert not torch.equal(flat(b), flat(make_model(torch.float64)))
    st = ob.state[b.lin.weight]["step"]
    assert torch.is_tensor(st) and st.dtype == torch.float32 and st.device == b.lin.weight.device


def test_capturable_foreach_equals_capturable_single():
    a, b = make_model(torch.float32), make_model(torch.float32)
    lr_a, lr_b = torch.tensor(1e-2), torch.tensor(1e-2)
    run_adan(a, Adan(a.parameters(), lr=lr_a, weight_decay=0.01, foreach=True, capturable=True))
    run_adan(b, Adan(b.parameters(), lr=lr_b, weight_decay=0.01, foreach=False, capturable=True))
    torch.testing.assert_close(flat(a), flat(b), rtol=1e-6, atol=1e-7)
    c = make_model(torch.float32)
    run_adan(c, Adan(c.parameters(), lr=1e-2, weight_decay=0.01, foreach=True))
    torch.testing.assert_close(flat(a), flat(c), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("foreach", [True, False])
def test_capturable_step_makes_no_host_reads(foreach, monkeypatch):
    model = make_model(torch.float32)
    lr = torch.tensor(1e-2)
    opt = Adan(param_groups(model), foreach=foreach, capturable=True)
    for g in opt.param_groups:
        g["lr"] = lr
    run_adan(model, opt, steps=2)                # state exists now
    gen = torch.Generator().manual_seed(9)
    fake_grads(model, 5, gen)

    def no_sync(*_a, **_k):
        raise AssertionError("host read of a tensor inside a capturable step")

    for name in ("item", "__float__", "__bool__", "__int__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, no_sync)
    opt.step()
    monkeypatch.undo()
    # the lr tensor is read on the device at every step: writing 0 into it freezes the params
    fake_grads(model, 6, gen)
    before = flat(model).clone()
    lr.fill_(0.0)
    opt.step()
    assert torch.equal(flat(model), before)


# ---------------------------------------------------------------- kernel (op) count
class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(n_params, foreach, capturable=False):
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(7, 3)) for _ in range(n_params)]
    opt = Adan(params, lr=torch.tensor(1e-3) if capturable else 1e-3, weight_decay=0.01,
               foreach=foreach, capturable=capturable)
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        if _ == 1:
            with CountOps() as c:
                opt.step()
            return c.n
        opt.step()


def test_foreach_op_count_is_independent_of_param_count():
    assert ops_per_step(3, True) == ops_per_step(40, True)
    assert ops_per_step(3, True, capturable=True) == ops_per_step(40, True, capturable=True)
    single_3, single_40 = ops_per_step(3, False), ops_per_step(40, False)
    assert single_40 > 10 * single_3 / 2 and single_40 - single_3 >= 37 * 10
    assert ops_per_step(40, True) < single_40 / 10


# ---------------------------------------------------------------- arguments, grads
@pytest.mark.parametrize("kwargs", [
    dict(lr=-1e-3), dict(lr=torch.tensor(-1.0)), dict(lr=torch.tensor([1e-3, 1e-3])), dict(lr=float("nan")),
    dict(betas=(1.0, 0.92, 0.99)), dict(betas=(0.98, -0.1, 0.99)), dict(betas=(0.98, 0.92, 1.5)),
    dict(betas=(0.9, 0.99)), dict(eps=-1e-8), dict(weight_decay=-0.01),
])
def test_invalid_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        Adan([nn.Parameter(torch.zeros(2))], **kwargs)


def test_invalid_param_group_raises():
    opt = Adan([nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError):
        opt.add_param_group(dict(params=[nn.Parameter(torch.zeros(2))], weight_decay=-1.0))
    assert len(opt.param_groups) == 1


def test_tensor_lr_accepted_without_capturable():
    a, b = make_model(torch.float64), make_model(torch.float64)
    run_adan(a, Adan(a.parameters(), lr=torch.tensor(3e-3, dtype=torch.float64)))
    run_adan(b, Adan(b.parameters(), lr=3e-3))
    assert torch.equal(flat(a), flat(b))


@pytest.mark.parametrize("foreach", [True, False])
def test_sparse_grad_raises(foreach):
    emb = nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        Adan(emb.parameters(), foreach=foreach).step()


def test_params_without_grad_are_untouched():
    a = nn.Parameter(torch.ones(3))
    b = nn.Parameter(torch.ones(3))
    opt = Adan([a, b], lr=0.1, weight_decay=0.5)
    a.grad = torch.ones(3)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(3)) and b not in opt.state
    assert not torch.equal(a.detach(), torch.ones(3))
    assert opt.step() is None  # stale grads are fine; closure-less step returns None


def test_closure_returns_loss():
    w = nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = Adan([w], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w ** 2).sum()
        loss.backward()
        return loss

    assert opt.step(closure).item() == pytest.approx(5.0)


# ---------------------------------------------------------------- state_dict
@pytest.mark.parametrize("foreach,capturable", [(True, False), (False, False), (True, True)])
def test_state_dict_round_trip_resumes_identically(foreach, capturable):
    lr = (lambda v: torch.tensor(v)) if capturable else (lambda v: v)
    full = make_model(torch.float32)
    full_opt = Adan(param_groups(full, lr=(lr(2e-2), lr(5e-3))), foreach=foreach, capturable=capturable)
    run_adan(full, full_opt, steps=12)

    half = make_model(torch.float32)
    half_opt = Adan(param_groups(half, lr=(lr(2e-2), lr(5e-3))), foreach=foreach, capturable=capturable)
    run_adan(half, half_opt, steps=6)
    buf = io.BytesIO()
    torch.save({"model": half.state_dict(), "opt": half_opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    for p in saved["opt"]["state"].values():
        assert torch.is_tensor(p["step"]) and set(p) == {"step", "exp_avg", "exp_avg_diff", "exp_avg_sq", "pre_grad"}

    resumed = make_model(torch.float32, seed=99)          # different init: everything comes from the checkpoint
    resumed.load_state_dict(saved["model"])
    resumed_opt = Adan(param_groups(resumed, lr=(lr(1.0), lr(1.0))), foreach=foreach, capturable=capturable)
    resumed_opt.load_state_dict(saved["opt"])
    assert resumed_opt.param_groups[0]["lr"] == pytest.approx(2e-2)
    run_adan(resumed, resumed_opt, steps=6, start=7)
    assert torch.equal(flat(resumed), flat(full))
    assert resumed_opt.state[resumed.lin.weight]["step"].item() == 12
    assert resumed_opt.state[resumed.late]["step"].item() == 10


def test_deepcopy_and_old_int_step_state():
    model = make_model(torch.float32)
    opt = Adan(model.parameters(), lr=1e-2)
    run_adan(model, opt, steps=3)
    sd = copy.deepcopy(opt.state_dict())
    for st in sd["state"].values():
        st["step"] = int(st["step"].item())     # e.g. a checkpoint written by code with int steps
    opt2 = Adan(model.parameters(), lr=1e-2)
    opt2.load_state_dict(sd)
    assert all(torch.is_tensor(st["step"]) for st in opt2.state.values())


# ---------------------------------------------------------------- it trains
@pytest.mark.slow
@pytest.mark.parametrize("foreach", [True, False])
def test_adan_trains_a_small_classifier(foreach):
    torch.manual_seed(0)
    x = torch.randn(256, 10)
    w_true = torch.randn(10, 3)
    y = (x @ w_true + 0.1 * torch.randn(256, 3)).argmax(dim=1)
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 3))
    opt = Adan(model.parameters(), lr=1e-2, weight_decay=0.01, foreach=foreach)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for _ in range(150):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0]
    assert (model(x).argmax(dim=1) == y).float().mean() > 0.9
