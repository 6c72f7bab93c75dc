"""train.batch_size=auto (bertaccel/train/batch_fit.py): the search against a memory limit that raises
torch's own out-of-memory error above a size, real training steps of the tiny model, and the
CPU's one-line refusal."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY

from bertaccel.config import ConfigError
from bertaccel.model import build_model, load_tokenizer
from bertaccel.options.checks import validate
from bertaccel.options.optimizer import build_optimizer
from bertaccel.train.batch_fit import BatchFitError, fit_batch, largest_fitting, training_step


def memory_limit(rows: int, then=lambda size: None):
    """A step that runs out of memory (torch.OutOfMemoryError, CUDA's message) above `rows`."""
    calls = []

    def step(size: int) -> None:
        calls.append(size)
        if size > rows:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")
        then(size)

    step.calls = calls
    return step


@pytest.mark.parametrize("limit,cap,found,tries", [
    (24, 1 << 20, 16, [1, 2, 4, 8, 16, 32]),    # stops at the first size over the limit
    (32, 1 << 20, 32, [1, 2, 4, 8, 16, 32, 64]),  # a power of two exactly at the limit fits
    (10_000, 100, 64, [1, 2, 4, 8, 16, 32, 64]),  # never beyond the cap (the largest power of two <= rows)
])
def test_largest_power_of_two_under_a_memory_limit(limit, cap, found, tries):
    step, released = memory_limit(limit), []
    fit = largest_fitting(step, cap, lambda: released.append(1))
    assert fit.batch_size == found and step.calls == tries
    assert fit.tried == [(b, b <= limit) for b in tries] and len(released) == len(tries)  # freed after every try
    assert "out of memory" in fit.describe() or limit >= cap


def test_nothing_fits_and_other_errors_are_not_taken_for_out_of_memory():
    with pytest.raises(BatchFitError, match="not even a batch of 1 row fits"):
        largest_fitting(memory_limit(0), 64)

    def broken(size):
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape mismatch"):
        largest_fitting(broken, 64)


@pytest.fixture
def tiny(compose_cfg):
    cfg = compose_cfg(TINY)
    tok = load_tokenizer(cfg.model)
    model, _ = build_model(cfg.model, 4, cfg.attention, len(tok))
    return cfg, model


def test_real_training_steps_under_a_fake_limit(tiny):
    """The search over real forward+backward+optimizer steps of the tiny model (CPU), with the
    limit put in front of them: the steps run, and the result is the limit's power of two."""
    cfg, model = tiny
    opt = build_optimizer(model, cfg.optimizer)
    real = training_step(model, cfg, torch.device("cpu"), 24, opt)
    fit = largest_fitting(memory_limit(5, then=real), 64)
    assert fit.batch_size == 4 and fit.tried[-1] == (8, False)
    assert any(s["exp_avg"].abs().sum() > 0 for s in opt.state.values())  # the optimizer really stepped


@pytest.mark.slow
def test_fit_batch_leaves_weights_mode_and_rng_as_they_were(tiny):
    cfg, model = tiny
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    fit = fit_batch(model, cfg, torch.device("cpu"), 16, rows=12)
    assert fit.batch_size == 8 and [b for b, _ in fit.tried] == [1, 2, 4, 8] and fit.seconds > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training and torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())


def test_batch_size_values(compose_cfg):
    validate(compose_cfg(["train.batch_size=auto", "hardware=cpu"]))
    for bad, message in (("train.batch_size=big", "train.batch_size='big' must be an integer >= 1 or auto"),
                         ("train.batch_size=0", "train.batch_size=0 must be an integer >= 1 or auto")):
        with pytest.raises(ConfigError, match=message):
            validate(compose_cfg([bad]))
    with pytest.raises(ConfigError, match="train.batch_size=auto with num_gpus=2: the search runs in one process"):
        validate(compose_cfg(["train.batch_size=auto", "num_gpus=2"]))


@pytest.mark.slow
def test_auto_on_the_cpu_is_one_line_and_exit_2(cli):
    r = cli([*TINY, "train.batch_size=auto"])
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert r.stderr.startswith("error: train.batch_size=auto fits the batch to a GPU's memory, but this run is on cpu")
    assert not (cli.dir / "outputs").exists()
