"""accumulation=adaptive (seed 001 eq. 6-7): k from the variance of the micro-batch gradients."""
from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.config import ConfigError
from bertaccel.data import PadCollator
from bertaccel.options.accumulation import GradVariance, next_k
from bertaccel.options.checks import validate
from bertaccel.options.precision import Precision
from bertaccel.train.forward import Forward
from bertaccel.train.step import accumulate_window, windows

CPU = torch.device("cpu")


def _model():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, num_labels=3)
    return BertForSequenceClassification(cfg).eval()


def _sigma2(model, window):
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    gv = GradVariance(params)
    gv.begin()
    accumulate_window(Forward(model, Precision("fp32", CPU), CPU), window, grad_variance=gv)
    return gv.sigma2(), params


def _rows(seed, n, label=None):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(1, 120, (10,), generator=g),
             torch.tensor(label if label is not None else int(torch.randint(0, 3, (1,), generator=g))))
            for _ in range(n)]


def test_sigma2_is_eq7_over_the_micro_batch_gradients():
    model, collate = _model(), PadCollator(0)
    micro = [collate(_rows(s, 4)) for s in (1, 2, 3)]
    sigma2, params = _sigma2(model, micro)
    # eq. 7 by hand: each micro-batch's own mean-loss gradient, their mean, the spread
    grads = []
    for b in micro:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits,
                                          b["labels"]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in params]))
    mean = torch.stack(grads).mean(0)
    expected = sum(float((g - mean).pow(2).sum()) for g in grads) / (len(grads) - 1)
    assert sigma2 == pytest.approx(expected, rel=1e-4)


def test_identical_micro_batches_have_no_variance_and_get_the_smallest_k():
    model, collate = _model(), PadCollator(0)
    same = collate(_rows(5, 4))
    sigma2, _ = _sigma2(model, [same, same, same])
    # (float32 cancellation: mean of squares minus square of means left -1.5e-8 on a CI-like box,
    # 2^-26, where the noisy micro-batches of the next test give variances orders of magnitude above)
    assert sigma2 == pytest.approx(0.0, abs=1e-6)
    assert next_k(sigma2, target_variance=1e-3, k_max=8) == 2


def test_noisy_gradients_raise_k_and_calm_ones_lower_it():
    model, collate = _model(), PadCollator(0)
    # all rows of one micro-batch share a label, the labels differ between micro-batches: noisy
    noisy, _ = _sigma2(model, [collate(_rows(7 + j, 4, label=j)) for j in range(3)])
    calm, _ = _sigma2(model, [collate(_rows(20, 4)), collate(_rows(20, 4)), collate(_rows(21, 4))])
    assert noisy > calm >= 0
    target = (noisy + calm) / 8
    assert next_k(noisy, target, k_max=8) > next_k(calm, target, k_max=8)
    assert next_k(noisy, target / 1000, k_max=8) == 8  # bounded by accumulation_max
    assert next_k(1.0, 0.25, k_max=8) == 4  # eq. 6: ceil(sigma^2 / sigma_target^2)


def test_windows_follow_a_changing_k():
    ks = iter([2, 3, 1])
    assert [len(w) for w in windows(range(8), lambda: next(ks, 2))] == [2, 3, 1, 2]


@pytest.mark.parametrize("overrides, message", [
    (["accumulation=four"], "must be an integer >= 1 or adaptive"),
    (["accumulation=0"], "must be an integer >= 1 or adaptive"),
    (["accumulation=adaptive", "accumulation_max=1"], "accumulation_max=1 must be >= 2"),
    (["accumulation=adaptive", "num_gpus=2"], "accumulation=adaptive needs num_gpus=1"),
])
def test_bad_accumulation_settings_fail_in_one_line(compose_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(overrides))
