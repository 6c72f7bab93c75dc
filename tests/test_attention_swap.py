"""Swapping eager -> sdpa -> xformers -> triton on the same weights gives the same logits."""
from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.attention.kernels.xformers import xformers_unusable
from bertaccel.attention.swap import FusedSelfAttention, swap_attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _model(attn: str, state=None):
    cfg = BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, num_labels=3)
    torch.manual_seed(0)
    model = BertForSequenceClassification._from_config(cfg, attn_implementation=attn)
    if state is not None:
        model.load_state_dict(state)
    return model.to(DEVICE).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 200, (3, 29), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    mask[2, 5:] = 0
    return ids.to(DEVICE), mask.to(DEVICE)


@pytest.mark.parametrize("backend", ["sdpa", "triton", "xformers"])
def test_backends_give_eager_logits_on_the_same_weights(backend):
    eager = _model("eager")
    ids, mask = _batch()
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask).logits
    if backend == "sdpa":
        other = _model("sdpa", eager.state_dict())
    else:
        if backend == "xformers":
            reason = xformers_unusable(DEVICE)
            if reason:
                pytest.skip(reason)
        pytest.importorskip("triton") if backend == "triton" else None
        other = _model("eager", eager.state_dict())
        assert swap_attention(other, backend) == 2
        assert all(isinstance(layer.attention.self, FusedSelfAttention) for layer in other.bert.encoder.layer)
        # The swapped modules hold copies of the projections, equal to the originals.
        assert torch.equal(other.bert.encoder.layer[0].attention.self.query.weight,
                           eager.bert.encoder.layer[0].attention.self.query.weight)
    with torch.no_grad():
        got = other(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_triton_swap_trains_with_dropout_and_gradients_flow():
    pytest.importorskip("triton")
    model = _model("eager")
    swap_attention(model, "triton")
    model.train()
    ids, mask = _batch()
    loss = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 2], device=DEVICE)).loss
    loss.backward()
    q = model.bert.encoder.layer[0].attention.self.query.weight
    assert q.grad is not None and torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0
