"""Seed 001's warm-up + cosine schedule and activation checkpointing (same gradients, less memory)."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.options.optimizer import lr_factor
from bertaccel.train.checkpointing import apply_checkpointing


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


def _grads_and_layer_calls(mode: str, layers: int = 4, swap=None):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=64, num_labels=3)
    model = BertForSequenceClassification._from_config(cfg, attn_implementation="eager")
    if swap is not None:  # our attention on packed tokens (attention/packing.py's encoder)
        from bertaccel.attention.swap import swap_attention

        swap_attention(model, swap)
    model.train()  # dropout on: the recompute must draw the same masks
    apply_checkpointing(model, mode)
    calls = [0] * layers
    for i, layer in enumerate(model.bert.encoder.layer):
        # on the layer's attention, with a pre-hook: Hugging Face's every-layer checkpoint
        # recomputes the layer's forward without the layer's own hooks, and the recompute stops
        # as soon as the saved tensors are back (torch's early stop), before a forward returns
        layer.attention.register_forward_pre_hook(lambda m, a, i=i: calls.__setitem__(i, calls[i] + 1))
    ids = torch.randint(1, 100, (4, 16), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, 10:] = 0
    torch.manual_seed(1)
    loss = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 2, 0])).loss
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, calls


@pytest.mark.slow
@pytest.mark.parametrize("mode, swap", [("every", None), ("sqrt", None), ("every", "triton"), ("sqrt", "triton")])
def test_checkpointing_modes_give_the_same_gradients_and_really_recompute(mode, swap):
    plain, plain_calls = _grads_and_layer_calls("none", swap=swap)
    ckpt, calls = _grads_and_layer_calls(mode, swap=swap)
    assert plain_calls == [1, 1, 1, 1]
    assert calls == [2, 2, 2, 2]  # each layer ran again in the backward: checkpointed, not skipped
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-6, msg=name)


def test_sqrt_checkpointing_keeps_fewer_boundaries_than_every_layer():
    # Saved activations during the forward, counted by autograd's pack hook: every-layer keeps
    # each layer's input; sqrt(L) segments keep one input per segment (L=9: 3 vs 9).
    def saved(mode):
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=9, num_attention_heads=4,
                         intermediate_size=64, num_labels=3)
        model = BertForSequenceClassification(cfg).train()
        apply_checkpointing(model, mode)
        ids = torch.randint(1, 100, (2, 8))
        count = [0]

        def pack(t):
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=torch.tensor([0, 1])).loss
        return count[0]

    none, every, sqrt = saved("none"), saved("every"), saved("sqrt")
    assert none > every > sqrt


@pytest.mark.slow
def test_checkpointing_benchmark_prints_the_three_modes():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "checkpointing.py"
    out = subprocess.run([sys.executable, str(script), "--device", "cpu", "--tiny", "--batch", "4", "--seq", "32",
                          "--steps", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    saved = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in out.stdout.splitlines()
             if line.startswith("| ") and not line.startswith("| mode")}
    assert saved["none"] > saved["every"] > saved["sqrt"] > 0
