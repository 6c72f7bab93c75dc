"""The optimizer's first step is warmed up before the window and leaves no trace on training.

On 4 H200s (2026-11-27) an eager run's first step took 0.4-1.8 s against a ~36 ms median: our
fused optimizers compile their Triton kernel there. The warm-up takes that step on zero gradients
before the window, undoes it and starts a fresh optimizer. These tests train a tiny BERT on real
AG News rows with and without it and require the same weights and optimizer state to the bit.
That the loop takes it (runs that warm up) and says so: tests/test_compile_warmup.py.
"""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_training

from bertaccel.train.events import FreezingSchedule
from bertaccel.train.loop import _prepare
from bertaccel.train.step import windows
from bertaccel.train.warmup import warm_first_update

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

CPU = torch.device("cpu")
STEPS = 3


def _cfg(compose_cfg, tmp_path, optimizer, precision="fp32"):
    return compose_cfg(["model=tiny", "train.device=cpu", "dataset.train_subset=48", "dataset.test_subset=16",
                        "train.batch_size=16", "dataset.max_length=32", f"optimizer={optimizer}",
                        f"precision={precision}", f"cache_dir={tmp_path}"])


def _train_steps(run, batches, warm: bool):
    """The loop's first epoch start, optionally the warm-up's first update, then STEPS steps."""
    FreezingSchedule().epoch_start(run, 0)
    if warm:
        params = [p for p in run.model.parameters() if p.requires_grad]
        assert warm_first_update(run.step.update, params, run.step.precision.scaler, CPU) > 0
        run.step.renew_optimizer()
    run.step.epoch_start(run, 0)
    torch.manual_seed(7)  # the same dropout draws in both runs
    for window in batches[:STEPS]:
        run.step(window)
    return run


def _state(optimizer):
    return [v for st in optimizer.state_dict()["state"].values() for v in st.values() if torch.is_tensor(v)]


@pytest.mark.parametrize("optimizer,precision", [("adamw", "fp32"), ("adan", "fp32"), ("lamb", "fp32"),
                                                 ("adamw_fused", "fp32"), ("adamw", "fp16")])
def test_the_warmed_first_update_leaves_training_bit_identical(compose_cfg, tmp_path, optimizer, precision):
    cfg = _cfg(compose_cfg, tmp_path, optimizer, precision)
    model, (tr, te), _ = tiny_training(cfg)
    batches = list(windows(tr, 1))
    twin = copy.deepcopy(model)
    plain = _train_steps(_prepare(model, tr, te, cfg, CPU, lambda m: None), batches, warm=False)
    warmed = _train_steps(_prepare(twin, tr, te, cfg, CPU, lambda m: None), batches, warm=True)
    for (name, a), b in zip(plain.model.named_parameters(), warmed.model.parameters()):
        assert torch.equal(a, b), name
    for a, b in zip(_state(plain.step.optimizer), _state(warmed.step.optimizer)):
        assert torch.equal(a, b)
    if precision == "fp16":  # the scaler's scale and growth count were put back
        assert plain.step.precision.scaler.state_dict() == warmed.step.precision.scaler.state_dict()


def test_keeping_the_warmed_optimizer_would_change_training(compose_cfg, tmp_path):
    """The control: the warm-up's own optimizer (its step count 1) gives other weights, so the
    test above can fail."""
    cfg = _cfg(compose_cfg, tmp_path, "adamw")
    model, (tr, te), _ = tiny_training(cfg)
    batches = list(windows(tr, 1))
    twin = copy.deepcopy(model)
    plain = _train_steps(_prepare(model, tr, te, cfg, CPU, lambda m: None), batches, warm=False)
    kept = _prepare(twin, tr, te, cfg, CPU, lambda m: None)
    FreezingSchedule().epoch_start(kept, 0)
    warm_first_update(kept.step.update, list(kept.model.parameters()), kept.step.precision.scaler, CPU)
    kept.step.epoch_start(kept, 0)
    torch.manual_seed(7)
    for window in batches[:STEPS]:
        kept.step(window)
    assert not all(torch.equal(a, b) for a, b in zip(plain.model.parameters(), kept.model.parameters()))

