"""LAMB (seed 003, section 2.4; You et al. 2019, Algorithm 2) against a float64 reference."""
from __future__ import annotations

import copy
import io
import math
from typing import Dict, List, Optional

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertaccel.optimizers.lamb import Lamb

SHAPES = [(7, 5), (5,), (3, 4, 2), (1,), (16,), (2, 3)]
# Two groups, BERT-style: decayed weights, and biases / LayerNorm without decay.
GROUPS = [dict(idx=[0, 2, 4], lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01),
          dict(idx=[1, 3, 5], lr=5e-3, betas=(0.8, 0.99), eps=1e-5, weight_decay=0.0)]


def _reference_step(x: torch.Tensor, g: torch.Tensor, st: Dict, lr: float, betas, eps: float, wd: float,
                    bias_correction: bool) -> torch.Tensor:
    """Algorithm 2 for one tensor, written from the equations, phi = identity."""
    b1, b2 = betas
    st["k"] = st.get("k", 0) + 1
    k = st["k"]
    st["m"] = b1 * st.get("m", torch.zeros_like(x)) + (1 - b1) * g
    st["v"] = b2 * st.get("v", torch.zeros_like(x)) + (1 - b2) * g * g
    m_hat = st["m"] / (1 - b1 ** k) if bias_correction else st["m"]
    v_hat = st["v"] / (1 - b2 ** k) if bias_correction else st["v"]
    r = m_hat / (torch.sqrt(v_hat) + eps) + wd * x
    x_norm = math.sqrt(float((x * x).sum()))
    r_norm = math.sqrt(float((r * r).sum()))
    trust = x_norm / r_norm if x_norm > 0 and r_norm > 0 else 1.0
    return x - lr * trust * r


def _problem(dtype=torch.float64, steps=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    init = [torch.randn(s, generator=gen, dtype=dtype) * (0.1 + i) for i, s in enumerate(SHAPES)]
    grads: List[List[Optional[torch.Tensor]]] = []
    for t in range(steps):
        # Gradient scales differ by orders of magnitude between tensors; tensor 4 has no grad
        # at steps 3 and 6 (skipped, so its step count lags the others').
        row = [torch.randn(s, generator=gen, dtype=dtype) * 10.0 ** (i - 3) for i, s in enumerate(SHAPES)]
        if t in (3, 6):
            row[4] = None
        grads.append(row)
    return init, grads


def _run_lamb(init, grads, foreach: bool, bias_correction: bool = True):
    params = [p.clone().requires_grad_(True) for p in init]
    groups = [{k: v for k, v in g.items() if k != "idx"} | {"params": [params[i] for i in g["idx"]]}
              for g in GROUPS]
    opt = Lamb(groups, bias_correction=bias_correction, foreach=foreach)
    for row in grads:
        for p, g in zip(params, row):
            p.grad = None if g is None else g.clone()
        opt.step()
    return params, opt


def _run_reference(init, grads, bias_correction: bool = True):
    xs = [p.clone() for p in init]
    states: List[Dict] = [{} for _ in xs]
    for row in grads:
        for grp in GROUPS:
            for i in grp["idx"]:
                if row[i] is not None:
                    xs[i] = _reference_step(xs[i], row[i], states[i], grp["lr"], grp["betas"], grp["eps"],
                                            grp["weight_decay"], bias_correction)
    return xs, states


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("foreach", [True, False])
def test_matches_float64_reference(foreach, bias_correction):
    init, grads = _problem()
    params, opt = _run_lamb(init, grads, foreach, bias_correction)
    ref, ref_states = _run_reference(init, grads, bias_correction)
    for i, (p, x) in enumerate(zip(params, ref)):
        assert not torch.equal(p.detach(), init[i]), f"tensor {i} never moved"
        torch.testing.assert_close(p.detach(), x, rtol=1e-12, atol=1e-14, msg=lambda m: f"tensor {i}: {m}")
        st = opt.state[p]
        assert st["step"] == ref_states[i]["k"]
        torch.testing.assert_close(st["exp_avg"], ref_states[i]["m"], rtol=1e-12, atol=1e-18)
        torch.testing.assert_close(st["exp_avg_sq"], ref_states[i]["v"], rtol=1e-12, atol=1e-24)
    assert opt.state[params[4]]["step"] == 8 and opt.state[params[0]]["step"] == 10


def test_foreach_and_loop_agree_in_float32():
    init, grads = _problem(dtype=torch.float32)
    a, _ = _run_lamb(init, grads, foreach=True)
    b, _ = _run_lamb(init, grads, foreach=False)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_no_decay_group_gets_trust_from_the_bare_adam_direction():
    # Same weights and grads; only the group's weight_decay differs. With decay 0, the first
    # step is x - lr * ||x|| * r / ||r|| with r = g / (|g| + eps) (k = 1, bias-corrected).
    torch.manual_seed(1)
    x0, g = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    a = x0.clone().requires_grad_(True)
    b = x0.clone().requires_grad_(True)
    opt = Lamb([{"params": [a], "weight_decay": 0.0}, {"params": [b]}], lr=0.1, weight_decay=0.5)
    a.grad, b.grad = g.clone(), g.clone()
    opt.step()
    r = g / (g.abs() + 1e-6)
    torch.testing.assert_close(a.detach(), x0 - 0.1 * x0.norm() / r.norm() * r, rtol=1e-12, atol=1e-14)
    r_decay = r + 0.5 * x0
    torch.testing.assert_close(b.detach(), x0 - 0.1 * x0.norm() / r_decay.norm() * r_decay, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("foreach", [True, False])
def test_zero_norm_param_gets_trust_one(foreach):
    g = torch.tensor([0.5, -2.0, 3e-3, -1e-4], dtype=torch.float64)
    zero = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    still = torch.zeros(3, dtype=torch.float64, requires_grad=True)  # zero weights and zero grad
    other = torch.full((4,), 3.0, dtype=torch.float64, requires_grad=True)
    opt = Lamb([zero, still, other], lr=0.01, weight_decay=0.01, foreach=foreach)
    zero.grad, still.grad, other.grad = g.clone(), torch.zeros(3, dtype=torch.float64), g.clone()
    opt.step()
    # ||x|| = 0: trust 1, a plain (bias-corrected) Adam step of lr * g / (|g| + eps).
    torch.testing.assert_close(zero.detach(), -0.01 * g / (g.abs() + 1e-6), rtol=1e-12, atol=0.0)
    assert torch.equal(still.detach(), torch.zeros(3, dtype=torch.float64))  # r = 0: no NaN, no move
    assert torch.isfinite(other).all()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("foreach", [True, False])
def test_update_length_is_lr_times_weight_norm(foreach, weight_decay):
    """Per layer: ||dx|| = lr * ||x|| whatever the tensor's weight or gradient scale."""
    torch.manual_seed(2)
    lr = 3e-3
    scales = [(1e-3, 1e2), (1.0, 1.0), (1e3, 1e-4), (5.0, 1e-8)]  # (weight scale, grad scale)
    params = [(torch.randn(8, 3, dtype=torch.float64) * w).requires_grad_(True) for w, _ in scales]
    opt = Lamb(params, lr=lr, weight_decay=weight_decay, foreach=foreach)
    for step in range(4):
        before = [p.detach().clone() for p in params]
        for p, (_, gs) in zip(params, scales):
            p.grad = torch.randn_like(p) * gs
        opt.step()
        for i, (p, x) in enumerate(zip(params, before)):
            rel = float((p.detach() - x).norm() / x.norm())
            assert rel == pytest.approx(lr, rel=1e-10), f"step {step}, tensor {i}: ||dx||/||x|| = {rel}"


@pytest.mark.parametrize("kwargs", [
    dict(lr=-1e-3), dict(lr=float("nan")), dict(lr=torch.tensor(1e-3)),
    dict(betas=(1.0, 0.999)), dict(betas=(0.9, -0.1)), dict(betas=(0.9,)), dict(betas=0.9),
    dict(eps=0.0), dict(eps=-1e-6), dict(eps=float("inf")),
    dict(weight_decay=-0.01), dict(weight_decay=None),
    dict(bias_correction="yes"), dict(foreach=None),
])
def test_invalid_arguments_raise_one_line(kwargs):
    with pytest.raises(ValueError) as err:
        Lamb([torch.zeros(2, requires_grad=True)], **kwargs)
    assert "\n" not in str(err.value) and str(err.value).startswith("Lamb:")


def test_invalid_group_value_raises():
    with pytest.raises(ValueError, match="weight_decay"):
        Lamb([{"params": [torch.zeros(2, requires_grad=True)], "weight_decay": -1.0}])
    opt = Lamb([torch.zeros(2, requires_grad=True)])
    with pytest.raises(ValueError, match="lr"):
        opt.add_param_group({"params": [torch.zeros(3, requires_grad=True)], "lr": -0.5})
    assert len(opt.param_groups) == 1


def test_grad_none_is_skipped_and_sparse_grad_raises():
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    opt = Lamb([a, b])
    a.grad = torch.ones(3)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(3)) and len(opt.state[b]) == 0
    assert not torch.equal(a.detach(), torch.ones(3))

    emb = torch.nn.Embedding(5, 3, sparse=True)
    opt = Lamb(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


@pytest.mark.parametrize("foreach", [True, False])
def test_state_dict_round_trip(foreach):
    init, grads = _problem(dtype=torch.float64, steps=8, seed=3)
    # Straight through 8 steps ...
    straight, _ = _run_lamb(init, grads, foreach)
    # ... and 4 steps, state saved (through torch.save), a fresh optimizer loaded, 4 more.
    first, opt = _run_lamb(init, grads[:4], foreach)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    saved = copy.deepcopy(opt.state_dict())
    params = [p.detach().clone().requires_grad_(True) for p in first]
    groups = [{"params": [params[i] for i in g["idx"]]} for g in GROUPS]  # hyper-parameters come back
    fresh = Lamb(groups, lr=1.0, weight_decay=0.3, foreach=foreach)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    for grp, loaded in zip(GROUPS, fresh.param_groups):
        assert (loaded["lr"], tuple(loaded["betas"]), loaded["eps"], loaded["weight_decay"]) == \
            (grp["lr"], grp["betas"], grp["eps"], grp["weight_decay"])
    sd = fresh.state_dict()
    assert sd["param_groups"] == saved["param_groups"]
    for k, st in saved["state"].items():
        assert sd["state"][k]["step"] == st["step"]
        assert torch.equal(sd["state"][k]["exp_avg"], st["exp_avg"])
        assert torch.equal(sd["state"][k]["exp_avg_sq"], st["exp_avg_sq"])
    for row in grads[4:]:
        for p, g in zip(params, row):
            p.grad = None if g is None else g.clone()
        fresh.step()
    for p, q in zip(params, straight):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.parametrize("foreach", [True, False])
def test_loss_decreases_on_a_tiny_problem(foreach):
    torch.manual_seed(4)
    x = torch.randn(64, 10)
    y = (x @ torch.randn(10, 1) + 0.1 * torch.randn(64, 1)).squeeze(1)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = Lamb([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=0.02, foreach=foreach)

    def loss_fn():
        return torch.nn.functional.mse_loss(model(x).squeeze(1), y)

    with torch.no_grad():
        first = float(loss_fn())
    for _ in range(150):
        opt.zero_grad()

        def closure():
            loss = loss_fn()
            loss.backward()
            return loss

        opt.step(closure)
    with torch.no_grad():
        last = float(loss_fn())
    assert last < 0.2 * first, (first, last)


class _CountOps(TorchDispatchMode):
    """Counts the ATen calls that do work (views excluded: they launch no kernel)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _ops_per_step(n_tensors: int, foreach: bool) -> int:
    params = [torch.randn(4, 3, requires_grad=True) for _ in range(n_tensors)]
    opt = Lamb(params, foreach=foreach)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # state created
    with _CountOps() as counter:
        opt.step()
    return counter.count


def test_foreach_op_count_does_not_grow_with_the_tensor_count():
    assert _ops_per_step(3, foreach=True) == _ops_per_step(40, foreach=True)
    loop3, loop40 = _ops_per_step(3, foreach=False), _ops_per_step(40, foreach=False)
    assert loop40 - loop3 == 37 * (loop3 // 3) > 0


def test_mixed_dtypes_and_groups_foreach_matches_loop():
    """Buckets of several dtypes across groups: one host copy of all trust ratios, same result."""
    torch.manual_seed(5)
    shapes_dtypes = [((4, 3), torch.float64), ((5,), torch.float32), ((2, 2), torch.float32), ((3,), torch.float64)]
    init = [torch.randn(s, dtype=d) for s, d in shapes_dtypes]
    grads = [[torch.randn_like(x) for x in init] for _ in range(5)]

    def run(foreach):
        ps = [x.clone().requires_grad_(True) for x in init]
        opt = Lamb([{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0, "lr": 0.02}], foreach=foreach)
        for row in grads:
            for p, g in zip(ps, row):
                p.grad = g.clone()
            opt.step()
        return ps

    for p, q in zip(run(True), run(False)):
        assert p.dtype == q.dtype
        tol = 1e-12 if p.dtype == torch.float64 else 1e-6
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)
