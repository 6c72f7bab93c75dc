"""Module swap: replace every BERT self-attention with one that calls xFormers or our Triton kernel.

The replacement copies the query/key/value weights and biases, so the model computes the same
function; only the softmax(QK^T)V core changes. The encoder is replaced too, by one that removes
the padding once per batch (attention/packing.py): the swapped attentions then see packed tokens
and the sequence starts, which is how xFormers (BlockDiagonalMask) and our Triton kernel (packed
mode) are meant to be used for BERT, with no padding mask and no work on padding. The kernels
themselves are attention/kernels/<name>.py, one module each (BACKENDS: found, not listed).
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from bertaccel.attention.hf_model import HFModule
from bertaccel.attention.kernels import BACKENDS
from bertaccel.attention.packing import (PackedEncoder, Packing, key_padding_mask, pack, pack_tokens,
                                         pass_masks_through, unpack_tokens)


class FusedSelfAttention(nn.Module):
    """Drop-in for transformers' BertSelfAttention (same forward signature and outputs)."""

    def __init__(self, src: HFModule, backend: str):
        """src: a Hugging Face BERT-family self-attention (BertSelfAttention's structure)."""
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}")
        self.backend = backend
        self.num_heads: int = src.num_attention_heads
        self.head_dim: int = src.attention_head_size
        self.scaling: float = src.scaling
        self.dropout_p: float = src.dropout.p
        # Own copies of the projections: the swapped model computes the same function.
        self.query: nn.Linear = copy.deepcopy(src.query)
        self.key: nn.Linear = copy.deepcopy(src.key)
        self.value: nn.Linear = copy.deepcopy(src.value)
        self.train(src.training)  # a new module starts in training mode: keep the model's mode

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None,
                past_key_values: Any = None, **kwargs: Any):
        """attention_mask: a Packing (PackedEncoder packed the batch: hidden_states is [1, T, D]),
        None (no padding: dense [B, S, D]), or a Hugging Face mask tensor (this layer called on
        its own: packed here, and unpacked after)."""
        if past_key_values is not None:
            raise NotImplementedError("fused attention is for encoder training: no KV cache")
        backend = BACKENDS[self.backend]
        p = self.dropout_p if self.training else 0.0
        if attention_mask is None:
            bsz, seq, _ = hidden_states.shape
            q, k, v = self._qkv(hidden_states, (bsz, seq))
            return backend.dense_core(q, k, v, p, self.scaling).reshape(bsz, seq, -1), None
        if isinstance(attention_mask, Packing):
            q, k, v = self._qkv(hidden_states, (-1,))
            out = backend.packed_core(q, k, v, attention_mask, p, self.scaling)
            return out.reshape(hidden_states.shape), None
        packing = pack(key_padding_mask(attention_mask, *hidden_states.shape[:2]))
        packing.bias = backend.prepare(packing)
        out, _ = self.forward(pack_tokens(hidden_states, packing), packing)
        return unpack_tokens(out, packing), None

    def _qkv(self, hidden_states: torch.Tensor, lead: tuple):
        """The projections viewed as [*lead, H, D] (no copy: the kernels take these strides)."""
        shape = (*lead, self.num_heads, self.head_dim)
        return tuple(proj(hidden_states).view(shape) for proj in (self.query, self.key, self.value))


def swap_attention(model: HFModule, backend: str) -> int:
    """Replace each encoder layer's self-attention in place, and the encoder by one that packs the
    batch's tokens once (attention/packing.py); returns how many attentions were swapped."""
    base = model.base_model
    layers = base.encoder.layer
    for layer in layers:
        layer.attention.self = FusedSelfAttention(layer.attention.self, backend)
    base.encoder = PackedEncoder(base.encoder, BACKENDS[backend].prepare)
    pass_masks_through(model)
    return len(layers)
