"""The analytic FLOP count against torch's FlopCounterMode on a tiny BERT, and MFU."""
from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.measure.flops import TokenCounts, bert_train_flops, mfu, peak_tflops
from bertaccel.options.freezing import apply_freezing


def _model(attn: str) -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=120, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=96, num_labels=4, attn_implementation=attn)
    return BertForSequenceClassification(cfg)


def _batch(b: int, s: int, real: int):
    ids = torch.randint(1, 120, (b, s))
    mask = torch.zeros(b, s, dtype=torch.long)
    mask[:, :real] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("freezing,epoch", [("none", 0), ("layerwise", 0), ("layerwise", 1), ("layerwise", 2)])
def test_analytic_flops_match_flop_counter(attn, freezing, epoch):
    model = _model(attn)
    apply_freezing(model, freezing, epoch)
    batches = [_batch(4, 24, 17), _batch(3, 40, 40)]  # two padded shapes, as dynamic padding gives
    counts = TokenCounts()
    with FlopCounterMode(display=False) as counter:
        for batch in batches:
            counts.add(batch)
            logits = model(**batch).logits
            logits.float().pow(2).sum().backward()
    assert counter.get_total_flops() > 0
    assert bert_train_flops(model, counts) == counter.get_total_flops()


def test_frozen_backbone_costs_less_and_full_training_is_6PT_plus_attention():
    model = _model("eager")
    counts = TokenCounts()
    counts.add(_batch(8, 32, 30))
    full = bert_train_flops(model, counts)
    apply_freezing(model, "layerwise", 0)  # only the top layer + head train
    assert bert_train_flops(model, counts) < full
    h, inter, layers = 48, 96, 3
    p_layer = 4 * h * h + 2 * h * inter
    t, a = 8 * 32, 8 * 32 * 32
    head = 6 * (h * h + h * 4) * 8
    assert full == 6 * p_layer * t * layers + 12 * a * h * layers + head


def test_token_counts():
    c = TokenCounts()
    c.add(_batch(4, 24, 17))
    assert (c.sequences, c.padded_tokens, c.real_tokens, c.attention_pairs) == (4, 96, 68, 4 * 24 * 24)
    assert (c.real_attention_pairs, c.split_attention_pairs) == (4 * 17 * 17, 4 * (17 * 17 + 7 * 7))


def test_packed_encoders_count_the_tokens_they_computed():
    """attention=triton packs the tokens (attention/packing.py): eagerly the FLOPs are the real
    tokens' (T = real tokens, A = sum of L^2); in the static layout of CUDA graphs, the padded
    tokens with each row's padding attending only to itself (A = sum of L^2 + (S-L)^2)."""
    import dataclasses

    from bertaccel.attention import packing
    from bertaccel.attention.swap import swap_attention

    def bert():  # head dim 16, which the kernel takes
        torch.manual_seed(0)
        cfg = BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, num_labels=4)
        return BertForSequenceClassification._from_config(cfg, attn_implementation="eager")

    model = bert()
    counts = TokenCounts()
    counts.add(_batch(8, 32, 30))
    padded = bert_train_flops(model, counts)
    swap_attention(model, "triton")
    assert bert_train_flops(model, counts) == padded  # nothing packed yet
    ids, mask = _batch(2, 9, 4).values()
    for static, tokens, pairs in ((False, "real_tokens", "real_attention_pairs"),
                                  (True, "padded_tokens", "split_attention_pairs")):
        old = packing.must_be_static
        packing.must_be_static = lambda: static  # as under CUDA-graph capture / torch.compile
        try:
            with torch.no_grad():
                model.eval()(input_ids=ids, attention_mask=mask)
        finally:
            packing.must_be_static = old
        assert model.bert.encoder.layout == ("static" if static else "exact")
        as_computed = dataclasses.replace(counts, padded_tokens=getattr(counts, tokens),
                                          attention_pairs=getattr(counts, pairs))
        assert bert_train_flops(model, counts) == bert_train_flops(bert(), as_computed)
    assert bert_train_flops(model, counts) < padded


def test_mfu_and_missing_peak():
    assert mfu(2e15, 2.0, 1000.0, 1) == pytest.approx(1.0)
    assert mfu(2e15, 2.0, 500.0, 2) == pytest.approx(1.0)
    peak, why = peak_tflops({"name": "cpu", "peak_tflops_fp32": None}, "fp32")
    assert peak is None and "no peak_tflops_fp32" in why
    peak, src = peak_tflops({"name": "h200", "peak_tflops_bf16": 989.4}, "bf16")
    assert peak == 989.4 and "h200" in src
