"""Gradient accumulation: k micro-batches of b give the gradients of one batch of k*b."""
from __future__ import annotations

import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.data import PadCollator
from bertaccel.options.precision import Precision
from bertaccel.train.forward import Forward, model_inputs
from bertaccel.train.step import accumulate_window, windows


def _model():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, num_labels=3)
    model = BertForSequenceClassification(cfg)
    return model.eval()  # dropout off, so both paths compute the same function


def _samples(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(3, 20, (1,), generator=g))  # ragged: dynamic padding differs per batch
        out.append((torch.randint(1, 120, (length,), generator=g), torch.randint(0, 3, (1,), generator=g)[0]))
    return out


def _grads(model, window):
    model.zero_grad(set_to_none=True)
    accumulate_window(Forward(model, Precision("fp32", torch.device("cpu")), torch.device("cpu")), window)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_k_micro_batches_equal_one_large_batch():
    model, collate = _model(), PadCollator(0)
    samples = _samples(16)
    big = _grads(model, [collate(samples)])
    small = _grads(model, [collate(samples[i:i + 4]) for i in range(0, 16, 4)])  # k=4, b=4
    _assert_same(big, small)


def test_partial_last_micro_batch_is_weighted_exactly():
    model, collate = _model(), PadCollator(0)
    samples = _samples(10)
    big = _grads(model, [collate(samples)])
    uneven = _grads(model, [collate(samples[:4]), collate(samples[4:8]), collate(samples[8:])])  # 4+4+2
    _assert_same(big, uneven)


def test_windows_group_k_and_keep_the_partial_tail():
    sizes = [len(w) for w in windows(range(10), 4)]
    assert sizes == [4, 4, 2]
    assert [len(w) for w in windows(range(8), 1)] == [1] * 8


def test_filler_rows_change_nothing():
    """Compiled runs fill a short batch up to a fixed row count (label -100): same gradients."""
    model = _model()
    samples = _samples(5)
    plain = _grads(model, [PadCollator(0)(samples)])
    filled_batch = PadCollator(0, rows=8)(samples)
    assert filled_batch["input_ids"].shape[0] == 8 and (filled_batch["labels"][5:] == -100).all()
    filled = _grads(model, [filled_batch])
    _assert_same(plain, filled)


def test_a_batch_without_padding_runs_with_no_mask_and_the_same_gradients():
    # model_inputs drops an all-ones mask (so SDPA can take flash attention); the gradients must
    # be those of the masked call, and a padded batch must keep its mask.
    model, collate = _model(), PadCollator(0)
    g = torch.Generator().manual_seed(3)
    equal = [(torch.randint(1, 120, (12,), generator=g), torch.tensor(i % 3)) for i in range(6)]
    batch = collate(equal)
    assert bool(batch["attention_mask"].all())
    assert model_inputs(batch, torch.device("cpu"))["attention_mask"] is None
    assert model_inputs(collate(_samples(6)), torch.device("cpu"))["attention_mask"] is not None

    no_mask = _grads(model, [batch])
    model.zero_grad(set_to_none=True)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.nn.functional.cross_entropy(out, batch["labels"]).backward()
    with_mask = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    _assert_same(no_mask, with_mask)
