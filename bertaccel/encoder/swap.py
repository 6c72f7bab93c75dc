"""Put our fused layers into a built Hugging Face BERT (as LightSeq's inject_ls_layer did): every
BertLayer replaced by a FusedBertLayer holding a copy of its weights, and the encoder by one that
packs the batch's real tokens once, runs the layers on them and scatters the result back to
[B, S, D]. Everything outside the encoder (embeddings, pooler, classifier, config, save_pretrained)
stays Hugging Face's.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, cast

import torch
from torch import nn

from bertaccel.attention.hf_model import HFModule
from bertaccel.attention.packing import (Packing, key_padding_mask, pack, pack_static, pack_tokens,
                                         pass_masks_through, unpack_tokens)
from bertaccel.encoder.attention import core as core_of
from bertaccel.encoder.attention import prepare
from bertaccel.config import AttentionConfig, EncoderConfig
from bertaccel.encoder.layer import FusedBertLayer, unfusable


def run_layers(encoder: FusedEncoder, hidden_states: torch.Tensor, packing: Packing, *args: Any, **kwargs: Any):
    """The layer loop, a plain function of the encoder (activation checkpointing replaces it, and
    DataParallel replicas run their own layers). The dropout seeds of every layer (attention and
    the two LayerNorm kernels) are drawn in one launch per forward, not three per layer: at BERT
    sizes a launch costs the host more than the kernel costs the GPU. Between two FP8 layers the
    first's last LayerNorm kernel also writes its output's FP8 rows, which the second's Q/K/V GEMM
    takes instead of casting its input again (encoder/fp8_ops.py)."""
    from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

    seeds = None
    if encoder.training and any(layer.draws_dropout() for layer in encoder.layers()):
        seeds = torch.randint(0, 2 ** 31 - 1, (len(encoder.layer), 3), device=hidden_states.device,
                              dtype=torch.int64)
    layers = list(encoder.layers())
    rows = None
    for i, layer in enumerate(layers):
        rows_out: Optional[List[Tuple[torch.Tensor, torch.Tensor]]] = [] if layer.fp8 and i + 1 < len(layers) and layers[i + 1].fp8 else None
        hidden_states = layer(hidden_states, packing, seeds=None if seeds is None else seeds[i], x_rows=rows,
                              rows_out=rows_out)
        rows = rows_out[0] if rows_out else None
    return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states)


def _uniform(rows: int, length: int, device: torch.device) -> Packing:
    """A batch without padding as `rows` sequences of `length` tokens: the tokens are already in
    packed order, so nothing is gathered (index None)."""
    cu = torch.arange(0, (rows + 1) * length, length, dtype=torch.int32, device=device)
    return Packing(None, cu, length, rows, length, [length] * rows)


class FusedEncoder(nn.Module):
    """BERT's encoder as our fused layers over packed tokens. packed=False: every padded token runs
    through the layers (pack_static's layout: each row's padding a sequence of its own, so the
    result is the same) - the "no work on padding" technique switched off."""

    def __init__(self, encoder: HFModule, core: str, packed: bool, fused_kernels: bool):
        super().__init__()
        self.config = encoder.config
        self.core = core
        self.packed = packed
        self.layer = nn.ModuleList(FusedBertLayer(layer, core_of(core), fused_kernels) for layer in encoder.layer)
        self.layers_forward: Callable[..., Any] = run_layers
        self.prepare = prepare(core)
        # The layout the last padded batch ran in, for the FLOP count (measure/flops.py).
        self.layout: Optional[str] = None

    def layers(self) -> Sequence[FusedBertLayer]:
        """The fused layers, typed: torch types an nn.ModuleList's items as Module, and __init__
        fills this one with FusedBertLayers only (a cast: nothing is checked at run time)."""
        return cast(Sequence[FusedBertLayer], self.layer)

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                *args: Any, **kwargs: Any):
        rows, length, dim = hidden_states.shape
        device_type = hidden_states.device.type
        if torch.is_autocast_enabled(device_type):
            # The residual stream in the autocast dtype from here on, cast once (embeddings come
            # out fp32 from their LayerNorm): the fused kernels take one dtype for x and residual.
            hidden_states = hidden_states.to(torch.get_autocast_dtype(device_type))
        if attention_mask is None:
            packing = _uniform(rows, length, hidden_states.device)
            packed = hidden_states.reshape(1, rows * length, dim)
            unpack = lambda h: h.view(rows, length, dim)  # noqa: E731
        else:
            keep = key_padding_mask(attention_mask, rows, length)
            packing = pack(keep) if self.packed else pack_static(keep)
            self.layout = "exact" if packing.seqlens_py is not None and self.packed else "static"
            packed = pack_tokens(hidden_states, packing)
            unpack = lambda h: unpack_tokens(h, packing)  # noqa: E731
        packing.bias = self.prepare(packing)
        out = self.layers_forward(self, packed, packing, *args, **kwargs)
        out.last_hidden_state = unpack(out.last_hidden_state)
        return out


def fuse_encoder(model: HFModule, encoder: EncoderConfig, attention: AttentionConfig) -> str:
    """Replace the model's encoder in place; returns what was done, in a few words. encoder: the
    encoder option's settings; attention: the attention option's (which core runs)."""
    why = unfusable(model.config)
    if why:
        raise ValueError(why)
    base = model.base_model
    from bertaccel.attention.option import fused_core_name

    core = fused_core_name(attention)
    base.encoder = FusedEncoder(base.encoder, core, encoder.packed, encoder.fused_kernels)
    pass_masks_through(model)
    return f"{len(base.encoder.layer)} layers fused (attention core {core})"
