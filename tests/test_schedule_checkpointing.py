"""Seed 001's warm-up + cosine schedule and activation checkpointing (same gradients, less memory)."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.optim import lr_factor


def test_cosine_schedule_warms_up_then_follows_half_a_cosine():
    total, warm = 100, 0.1
    assert lr_factor("cosine", 0, total, warm) == pytest.approx(0.1)
    assert lr_factor("cosine", 9, total, warm) == pytest.approx(1.0)
    assert lr_factor("cosine", 10, total, warm) == pytest.approx(1.0)
    assert lr_factor("cosine", 55, total, warm) == pytest.approx(0.5)  # halfway through the decay
    assert lr_factor("cosine", 100, total, warm) == pytest.approx(0.0, abs=1e-12)
    mid = lr_factor("cosine", 32, total, warm)
    assert mid == pytest.approx(0.5 * (1 + math.cos(math.pi * 22 / 90)))


def _grads(checkpointing: bool):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, num_labels=3)
    model = BertForSequenceClassification(cfg)
    model.train()  # dropout on: checkpointing must replay the same masks
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(1, 100, (4, 16))
    torch.manual_seed(1)
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1, 2, 0])).loss
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_activation_checkpointing_gives_the_same_gradients():
    plain, ckpt = _grads(False), _grads(True)
    assert plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)
