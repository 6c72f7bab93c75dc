"""AdamWFused (flat buffers, one Triton launch per param group): against torch.optim.AdamW
(single-tensor), weight-decay groups, parameters without a gradient, capturable mode with a tensor
lr, state_dict both ways with torch's AdamW, argument checks.

On a machine without CUDA the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set
before anything imports Triton, as conftest.py does too); sizes are kept small for it.
"""
from __future__ import annotations

import copy
import io
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from torch import nn  # noqa: E402

pytest.importorskip("triton")

from bertaccel.optimizers import adamw_kernel  # noqa: E402
from bertaccel.optimizers.adamw_flat import AdamWFused  # noqa: E402
from bertaccel.optimizers.flat import BLOCK, grad_copies_last_step, kernel_launches_per_step  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = [(3, 5), (7,), (2, 3, 4), (1,), (BLOCK + 37,)]  # one spans two kernel blocks
# fp32 rounding: the kernel and torch order a few operations differently (lr * c1 in fp32 against
# torch's fp64 step size, 1 - lr * wd in fp32), a few ulps after several steps.
RTOL, ATOL = 2e-6, 1e-7


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [nn.Parameter(torch.randn(s, generator=g).to(DEVICE)) for s in SHAPES]


def _groups(ps):
    """BERT's decay / no-decay split; the second group sets its own lr."""
    return [{"params": ps[:3], "weight_decay": 0.1}, {"params": ps[3:], "weight_decay": 0.0, "lr": 2e-2}]


def _grads(step, seed=100):
    g = torch.Generator().manual_seed(seed + step)
    return [torch.randn(s, generator=g).to(DEVICE) for s in SHAPES]


def _close(a, b, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("capturable", [False, True])
def test_matches_torch_adamw_single_tensor(capturable):
    """Several steps, two weight-decay groups (one with its own lr), an lr schedule: parameters and
    state equal torch.optim.AdamW(foreach=False) within fp32 rounding; one launch per group."""
    lr = 1e-2
    fused_ps, torch_ps = _params(), _params()
    fused_lr = torch.tensor(lr, device=DEVICE) if capturable else lr  # capturable: the kernel reads lr
    fused = AdamWFused(_groups(fused_ps), lr=fused_lr, betas=(0.9, 0.999), eps=1e-8, capturable=capturable)
    ref = torch.optim.AdamW(_groups(torch_ps), lr=lr, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    for step in range(6):
        lr_now = lr * (1 - 0.1 * step)
        if capturable:
            fused.param_groups[0]["lr"].fill_(lr_now)
        else:
            fused.param_groups[0]["lr"] = lr_now
        ref.param_groups[0]["lr"] = lr_now
        for p, q, g in zip(fused_ps, torch_ps, _grads(step)):
            p.grad, q.grad = g.clone(), g.clone()
        fused.step()
        ref.step()
        for p, q in zip(fused_ps, torch_ps):
            _close(p, q)
    for p, q in zip(fused_ps, torch_ps):
        for key in ("exp_avg", "exp_avg_sq"):
            _close(fused.state[p][key], ref.state[q][key])
        assert float(fused.state[p]["step"]) == float(ref.state[q]["step"]) == 6
    # one update launch per param group; capturable, each followed by its step count's advance
    assert kernel_launches_per_step(fused) == 2 * (1 + capturable)
    assert grad_copies_last_step(fused) == 2     # fresh grad tensors: one foreach copy per group


def test_parameters_without_a_gradient_are_left_alone():
    """A tensor that never gets a gradient is untouched and the others follow torch exactly (as in
    torch, which skips it); a tensor without a gradient at one step keeps its value and state
    through that step."""
    ps, torch_ps = _params(), _params()
    fused = AdamWFused(_groups(ps), lr=1e-2)
    ref = torch.optim.AdamW(_groups(torch_ps), lr=1e-2, foreach=False)
    never = 1
    for step in range(4):
        for i, (p, q, g) in enumerate(zip(ps, torch_ps, _grads(step))):
            p.grad, q.grad = (None, None) if i == never else (g.clone(), g.clone())
        fused.step()
        ref.step()
    assert torch.equal(ps[never].detach().cpu(), _params()[never].detach().cpu())
    assert torch.count_nonzero(fused.state[ps[never]]["exp_avg"]) == 0
    for p, q in zip(ps, torch_ps):
        _close(p, q)
    # One step with no gradient for tensor 0: value and state as before that step.
    before = (ps[0].detach().clone(), fused.state[ps[0]]["exp_avg"].clone(), fused.state[ps[0]]["exp_avg_sq"].clone())
    for i, (p, g) in enumerate(zip(ps, _grads(9))):
        p.grad = None if i in (0, never) else g
    fused.step()
    assert kernel_launches_per_step(fused) == 2
    after = (ps[0].detach(), fused.state[ps[0]]["exp_avg"], fused.state[ps[0]]["exp_avg_sq"])
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert not torch.equal(ps[2].detach(), torch_ps[2].detach())  # the others moved


def test_a_step_without_any_gradient_does_not_count():
    """As in torch (a tensor's step advances only with a gradient): nothing launched, count unchanged."""
    for capturable in (False, True):
        ps = _params()
        before = [p.detach().clone() for p in ps]
        lr = torch.tensor(1e-2, device=DEVICE) if capturable else 1e-2
        opt = AdamWFused([{"params": ps}], lr=lr, capturable=capturable)
        opt.step()
        assert kernel_launches_per_step(opt) == 0
        assert float(opt.state[ps[0]]["step"]) == 0
        assert all(torch.equal(p, q) for p, q in zip(ps, before))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)).to(DEVICE)


def _bert_groups(model, wd=0.01):
    return [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": wd},
            {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g).to(DEVICE)
        loss = nn.functional.mse_loss(model(x), x[:, :2] * 2 - x[:, 2:] + 0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("capturable", [False, True])
def test_state_dict_round_trip_resumes_identically(capturable):
    def lr():
        return torch.tensor(1e-2, device=DEVICE) if capturable else 1e-2

    model = _model()
    opt = AdamWFused(_bert_groups(model), lr=lr(), capturable=capturable)
    _train(model, opt, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert {k for st in saved["opt"]["state"].values() for k in st} == {"step", "exp_avg", "exp_avg_sq"}
    model2 = _model()
    model2.load_state_dict(saved["model"])
    opt2 = AdamWFused(_bert_groups(model2), lr=lr(), capturable=capturable)
    opt2.load_state_dict(saved["opt"])
    _train(model, opt, 2, seed=7)
    _train(model2, opt2, 2, seed=7)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert float(opt2.state[next(model2.parameters())]["step"]) == 5


def test_state_dicts_move_between_torch_adamw_and_adamw_fused():
    """Same state keys as torch.optim.AdamW: a run moves from one to the other mid-training, both
    ways (each parameter gets its own step tensor: torch advances it in place per parameter)."""
    m_torch, m_fused = _model(), _model()
    torch_opt = torch.optim.AdamW(_bert_groups(m_torch), lr=1e-2, foreach=False)
    fused = AdamWFused(_bert_groups(m_fused), lr=1e-2)
    _train(m_torch, torch_opt, 3)
    _train(m_fused, fused, 3)
    # torch -> fused and fused -> torch, each on a copy of the other's model
    m_tf, m_ft = copy.deepcopy(m_torch), copy.deepcopy(m_fused)
    tf = AdamWFused(_bert_groups(m_tf), lr=1e-2)
    tf.load_state_dict(copy.deepcopy(torch_opt.state_dict()))
    ft = torch.optim.AdamW(_bert_groups(m_ft), lr=1e-2, foreach=False)
    ft.load_state_dict(copy.deepcopy(fused.state_dict()))
    for model, opt in ((m_torch, torch_opt), (m_tf, tf), (m_fused, fused), (m_ft, ft)):
        _train(model, opt, 2, seed=5)
    for a, b, c, d in zip(m_torch.parameters(), m_tf.parameters(), m_fused.parameters(), m_ft.parameters()):
        _close(b, a)
        _close(d, c)
    assert all(float(st["step"]) == 5 for st in ft.state.values())


def test_bad_arguments_raise_one_line():
    p = [nn.Parameter(torch.zeros(3, device=DEVICE))]
    for kwargs, match in [(dict(lr=-1.0), "lr"), (dict(betas=(0.9, 0.99, 0.9)), "betas"),
                          (dict(betas=(0.9, 1.0)), r"betas\[1\]"), (dict(eps=-1e-8), "eps"),
                          (dict(weight_decay=-0.1), "weight_decay"), (dict(amsgrad=True), "amsgrad"),
                          (dict(capturable=1), "capturable")]:
        with pytest.raises(ValueError, match=f"^AdamWFused: {match}[^\n]*$"):
            AdamWFused(p, **kwargs)
    with pytest.raises(TypeError):
        AdamWFused(p, fused=True)  # no implementation switch: the step is always one kernel


def test_without_triton_the_constructor_says_so(monkeypatch):
    monkeypatch.setattr(adamw_kernel, "triton", None)
    monkeypatch.setattr(adamw_kernel, "TRITON_ERROR", ImportError("No module named 'triton'"))
    with pytest.raises(RuntimeError, match=r"^AdamWFused needs Triton, which cannot be imported here "
                                           r"\(No module named 'triton'\); use torch.optim.AdamW instead$"):
        AdamWFused([nn.Parameter(torch.zeros(3))])
