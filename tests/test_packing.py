"""Packed tokens (bertaccel/attention/packing.py): the padding removed once per batch, and put back."""
from __future__ import annotations

import pytest
import torch

from bertaccel.attention.packing import Packing, key_padding_mask, pack_exact, pack_static, pack_tokens, unpack_tokens


def _keep(lengths, seq):
    return torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]


def _blocks(packing: Packing):
    cu = packing.cu_seqlens.tolist()
    return [(a, b) for a, b in zip(cu, cu[1:])]


def test_exact_packing_keeps_only_real_tokens_row_by_row():
    keep = _keep([5, 1, 0, 7], 7)
    hidden = torch.randn(4, 7, 3)
    p = pack_exact(keep)
    assert p.tokens == 13 and p.seqlens_py == [5, 1, 0, 7] and p.max_seqlen == 7
    assert p.cu_seqlens.dtype == torch.int32 and p.cu_seqlens.tolist() == [0, 5, 6, 6, 13]
    packed = pack_tokens(hidden, p)
    assert packed.shape == (1, 13, 3)
    for row, (a, b) in enumerate(_blocks(p)):  # sequence i of the packing is row i's real tokens, in order
        assert torch.equal(packed[0, a:b], hidden[row, :b - a])
    back = unpack_tokens(packed, p)
    assert torch.equal(back[keep], hidden[keep])
    assert not back[~keep].any()  # padding comes back as 0


def test_exact_packing_of_any_mask_pattern_keeps_token_order():
    keep = torch.tensor([[0, 1, 1, 0, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)  # left and gappy padding
    hidden = torch.randn(2, 5, 4)
    p = pack_exact(keep)
    packed = pack_tokens(hidden, p)
    assert torch.equal(packed[0, :3], hidden[0, [1, 2, 4]]) and torch.equal(packed[0, 3], hidden[1, 0])
    assert torch.equal(unpack_tokens(packed, p)[keep], hidden[keep])


def test_static_packing_is_a_permutation_with_real_tokens_first():
    lengths, seq = [5, 1, 0, 7], 7
    keep = _keep(lengths, seq)
    hidden = torch.randn(4, seq, 3)
    p = pack_static(keep)
    assert p.tokens == 4 * seq and p.max_seqlen == seq and p.seqlens_py is None
    assert sorted(p.index.tolist()) == list(range(4 * seq))
    blocks = _blocks(p)
    # 2B sequences: each row's real tokens, then each row's padding, none longer than S.
    assert [b - a for a, b in blocks] == lengths + [seq - n for n in lengths]
    packed = pack_tokens(hidden, p)
    for row, (a, b) in enumerate(blocks[:4]):
        assert torch.equal(packed[0, a:b], hidden[row, :lengths[row]])
    assert torch.equal(unpack_tokens(packed, p), hidden)  # a permutation: everything comes back


def test_packing_gradients_reach_only_real_tokens():
    keep = _keep([3, 2], 4)
    hidden = torch.randn(2, 4, 3, requires_grad=True)
    out = unpack_tokens(pack_tokens(hidden, pack_exact(keep)) * 2, pack_exact(keep))
    out.sum().backward()
    assert torch.equal(hidden.grad, 2.0 * keep[..., None].float().expand(2, 4, 3))


def _attention_per_sequence(q, k, v, packing):
    out = torch.zeros_like(q)
    for a, b in _blocks(packing):
        if b > a:
            s = torch.einsum("thd,uhd->htu", q[a:b], k[a:b]).softmax(-1)
            out[a:b] = torch.einsum("htu,uhd->thd", s, v[a:b])
    return out


@pytest.mark.parametrize("packer", [pack_exact, pack_static])
def test_attention_over_packed_sequences_equals_masked_attention(packer):
    """What the backends compute per sequence equals padded attention with a key-padding mask."""
    torch.manual_seed(0)
    keep = _keep([6, 2, 5], 6)
    q, k, v = (torch.randn(3, 6, 2, 4, dtype=torch.float64) for _ in range(3))
    scores = torch.einsum("bshd,bthd->bhst", q, k).masked_fill(~keep[:, None, None, :], float("-inf"))
    want = torch.einsum("bhst,bthd->bshd", scores.softmax(-1), v)
    p = packer(keep)
    flat = [t.reshape(-1, 2, 4).index_select(0, p.index) for t in (q, k, v)]
    got = unpack_tokens(_attention_per_sequence(*flat, p).reshape(1, p.tokens, 8), p).view(3, 6, 2, 4)
    torch.testing.assert_close(got[keep], want[keep])


def test_key_padding_mask_from_hf_masks():
    keep = torch.tensor([[1, 1, 0], [1, 0, 0]])
    additive = (1 - keep[:, None, None, :].float()) * torch.finfo(torch.float32).min
    assert torch.equal(key_padding_mask(additive.expand(2, 1, 3, 3), 2, 3), keep.bool())
    assert torch.equal(key_padding_mask(keep[:, None, None, :].bool(), 2, 3), keep.bool())
    assert torch.equal(key_padding_mask(keep, 2, 3), keep.bool())  # 2-D 0/1
    assert key_padding_mask(None, 2, 3) is None


@pytest.mark.parametrize("packer", [pack_exact, pack_static])
def test_xformers_block_diagonal_mask_from_a_packing(packer):
    """The BlockDiagonalMask handed to xFormers describes the packing's sequences (built on CPU:
    the object, not the kernel)."""
    pytest.importorskip("xformers.ops.fmha.attn_bias")
    from bertaccel.attention.kernels.xformers import _xformers_prepare

    keep = _keep([4, 1, 3], 4)
    p = packer(keep)
    mask = _xformers_prepare(p)
    for info in (mask.q_seqinfo, mask.k_seqinfo):
        assert info.seqstart is p.cu_seqlens  # the device tensor itself: refreshed in place under CUDA graphs
        assert info.max_seqlen == p.max_seqlen
        assert info.seqstart_py[-1] == p.tokens and len(info.seqstart_py) == len(p.cu_seqlens)
    if p.seqlens_py is not None:
        assert mask.q_seqinfo.seqstart_py == p.cu_seqlens.tolist()
        dense = mask.materialize((p.tokens, p.tokens))
        same_seq = torch.block_diag(*(torch.ones(n, n) for n in [4, 1, 3])).bool()
        assert torch.equal(dense == 0, same_seq)


def test_a_model_built_from_the_swapped_config_computes_the_same_function():
    """The plan builds a model from the run's model config (on the meta device); with the swapped
    model's mask name in that config Hugging Face must accept it, and the model it builds must
    compute what the eager one does (sdpa over the handed-through key-padding mask)."""
    from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

    from bertaccel.attention.swap import swap_attention

    cfg = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     num_labels=2)
    torch.manual_seed(0)
    eager = BertForSequenceClassification._from_config(cfg, attn_implementation="eager").eval()
    swapped = BertForSequenceClassification._from_config(cfg, attn_implementation="eager")
    swapped.load_state_dict(eager.state_dict())
    swap_attention(swapped, "triton")
    rebuilt = AutoModelForSequenceClassification.from_config(swapped.config)
    rebuilt.load_state_dict(eager.state_dict())
    ids = torch.randint(1, 60, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(input_ids=ids, attention_mask=mask).logits,
                                   eager(input_ids=ids, attention_mask=mask).logits)
