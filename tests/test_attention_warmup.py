"""The Triton JIT warm-up: which lengths it compiles for, and when it has nothing to do."""
from __future__ import annotations

import torch
from transformers import BertConfig, BertForSequenceClassification

from contextlib import nullcontext

from bertaccel.attention.swap import FusedSelfAttention, swap_attention
from bertaccel.attention.warmup import (exercise_shapes, padded_lengths, reset_kernel_caches,
                                        warm_up_triton_attention)
from bertaccel.data import PadCollator


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


def _tiny(attn: str):
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, num_labels=2)
    return BertForSequenceClassification._from_config(cfg, attn_implementation=attn)


def test_exercise_runs_every_length_through_the_triton_layers_and_leaves_no_trace():
    # On the CPU the kernels run in Triton's interpreter (conftest): the same launches, no compile.
    model = _tiny("eager")
    swap_attention(model, "triton")
    model.eval()
    seen = []
    for m in model.modules():
        if isinstance(m, FusedSelfAttention):
            m.register_forward_hook(lambda mod, args, kwargs, out: seen.append(
                (mod.training, args[0].shape[1], kwargs.get("attention_mask") is None)), with_kwargs=True)
    rng = torch.get_rng_state()
    exercise_shapes(model, nullcontext, [8, 16], torch.device("cpu"))
    # Per length: train step + evaluation, with a padded row and without padding (HF then passes
    # no mask at all: a kernel variant of its own).
    assert seen == [(True, 8, False), (False, 8, False), (True, 8, True), (False, 8, True),
                    (True, 16, False), (False, 16, False), (True, 16, True), (False, 16, True)]
    assert all(p.grad is None for p in model.parameters())
    assert not model.training  # mode restored
    assert torch.equal(torch.get_rng_state(), rng)  # dropout draws did not move the run's RNG


def test_nothing_to_warm_gives_null_with_the_reason():
    seconds, source = warm_up_triton_attention(_tiny("sdpa"), nullcontext, [8], torch.device("cpu"))
    assert seconds is None and "no attention=triton" in source
    model = _tiny("eager")
    swap_attention(model, "triton")
    seconds, source = warm_up_triton_attention(model, nullcontext, [8], torch.device("cpu"))
    assert seconds is None and "interpreter" in source
    reset_kernel_caches()  # also safe where the kernels are interpreted (no compiled cache)
