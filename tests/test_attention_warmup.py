"""The warm-up's shape set, and what it runs through the Triton attention layers."""
from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from bertaccel.attention.swap import FusedSelfAttention, swap_attention
from bertaccel.attention.warmup import reset_kernel_caches
from bertaccel.data import Batching, PadCollator, TokenizedSplit, make_loader
from bertaccel.options.precision import Precision
from bertaccel.train.forward import Forward
from bertaccel.train.step import accumulate_window, eval_batch
from bertaccel.train.warmup import WarmupPlan, data_lengths, padded_lengths, run_warmup


def test_padded_lengths_cover_every_length_the_collator_produces():
    g = torch.Generator().manual_seed(0)
    for max_length, multiple in [(128, 8), (77, 8), (40, 1), (512, 64)]:
        lengths = set(padded_lengths(max_length, multiple))
        assert len(lengths) == -(-max_length // multiple)
        collate = PadCollator(pad_token_id=0, multiple=multiple)
        for _ in range(200):
            sizes = torch.randint(1, max_length + 1, (int(torch.randint(1, 5, (1,), generator=g)),), generator=g)
            batch = [(torch.ones(int(n), dtype=torch.long), torch.tensor(0)) for n in sizes]
            assert collate(batch)["input_ids"].shape[1] in lengths, (max_length, multiple, sizes.tolist())


def test_data_lengths_cover_every_batch_shape_of_a_real_loader():
    """Every (rows, S) a fixed-row loader yields over several epochs is in the warm-up plan."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 100, (333,), generator=g)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    split = TokenizedSplit(torch.ones(int(offsets[-1]), dtype=torch.int32), offsets,
                           torch.zeros(len(lengths), dtype=torch.long))
    for multiple in (1, 8, 32):
        plan = set(data_lengths(split.lengths, multiple))
        assert plan <= set(padded_lengths(100, multiple))
        loader = make_loader(split, Batching(16, multiple, group_by_length=True, fixed_rows=True), 0, True, 0)
        seen = {tuple(b["input_ids"].shape) for _ in range(3) for b in loader}
        assert {rows for rows, _ in seen} == {16}  # the short last batch is filled up
        assert {s for _, s in seen} <= plan


def _tiny(attn: str):
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, num_labels=2)
    return BertForSequenceClassification._from_config(cfg, attn_implementation=attn)


@pytest.mark.slow
def test_warmup_runs_every_shape_through_the_triton_layers_and_leaves_no_trace():
    # On the CPU the kernels run in Triton's interpreter (conftest): the same launches, no compile.
    model = _tiny("eager")
    swap_attention(model, "triton")
    model.eval()
    seen = []
    for m in model.modules():
        if isinstance(m, FusedSelfAttention):
            m.register_forward_hook(lambda mod, args, kwargs, out: seen.append(
                (mod.training, tuple(args[0].shape[:2]), kwargs.get("attention_mask") is None)), with_kwargs=True)
    cpu = torch.device("cpu")
    prec = Precision("fp32", cpu)
    rng = torch.get_rng_state()
    plan = WarmupPlan(train_rows=3, eval_rows=5, train_lengths=[8, 16], eval_lengths=[8])
    forward = Forward(model, prec, cpu)
    seconds = run_warmup(model, plan, lambda b: accumulate_window(forward, [b]), lambda b: eval_batch(forward, b), cpu)
    assert seconds > 0
    # Per train length: a step with a padded row, then one without (HF then passes no mask at
    # all: the dense path); then evaluation per eval length, at the eval rows. A padded batch
    # reaches the attention packed, as one row of its real tokens (the last row is half padding).
    def packed(rows, s):
        return (1, rows * s - (s - s // 2 - 1))
    assert seen == [(True, packed(3, 8), False), (True, (3, 8), True), (True, packed(3, 16), False),
                    (True, (3, 16), True), (False, packed(5, 8), False), (False, (5, 8), True)]
    assert all(p.grad is None for p in model.parameters())
    assert not model.training  # mode restored
    assert torch.equal(torch.get_rng_state(), rng)  # dropout draws did not move the run's RNG
    reset_kernel_caches()  # also safe where the kernels are interpreted (no compiled cache)
