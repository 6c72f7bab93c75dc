"""Activation checkpointing (train.gradient_checkpointing; seed 001 section III-E).

- none: every activation kept for the backward.
- every: each encoder layer is a checkpoint (Hugging Face's gradient_checkpointing_enable; for
  encoder=fused, segments of one layer): the backward keeps only each layer's input and recomputes
  the layer. The fused layer's dropout seeds are drawn from torch's generator, whose state the
  checkpoint restores, so the recompute draws the same masks too.
- sqrt: the encoder's L layers in segments of round(sqrt(L)) layers, each segment one
  checkpoint (Chen et al. 2016, the seed's "every sqrt(L) layers"): only sqrt(L) segment inputs
  are kept, and a segment's internals exist only while it is recomputed.
Checkpoints are non-reentrant (they work with frozen inputs, layer-wise freezing and
torch.compile) and restore the RNG state, so dropout draws the same masks in the recompute:
the gradients equal those without checkpointing.
"""
from __future__ import annotations

import math
import types
from typing import Any, Callable, Optional

import torch
from torch.utils.checkpoint import checkpoint


def apply_checkpointing(model: torch.nn.Module, mode: str) -> None:
    if mode == "none":
        return
    from bertaccel.encoder.swap import FusedEncoder

    # (Any: the encoder's layers and forward are reached as attributes, which torch types as Tensor | Module)
    base: Any = model.base_model
    encoder: Any = base.encoder
    # encoder=fused's layers are ours, not Hugging Face's checkpointable layers: "every" is then
    # segments of one layer over its layer loop, the same checkpoints.
    fused = isinstance(encoder, FusedEncoder)
    if mode == "every" and not fused:
        # (a PreTrainedModel's method; typed here as an nn.Module attribute)
        model.gradient_checkpointing_enable(  # type: ignore[operator]
            gradient_checkpointing_kwargs={"use_reentrant": False})
        return
    size = 1 if mode == "every" else max(1, round(math.sqrt(len(encoder.layer))))
    # The encoder's own forward loops over its layers; this one loops over segments. It keeps
    # the call signature (hidden states, mask, then keyword arguments) that BertModel uses.
    # attention=xformers|triton's packed encoder (attention/packing.py) runs Hugging Face's loop as
    # its `layers_forward` function, between packing and unpacking: that loop is the one replaced.
    if hasattr(encoder, "layers_forward"):
        encoder.layers_forward = _segmented_forward(size, encoder.layers_forward)
        return
    encoder.forward = types.MethodType(_segmented_forward(size, type(encoder).forward), encoder)


def _segmented_forward(size: int, original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(self: Any, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                *args: Any, **kwargs: Any) -> Any:
        if not (self.training and torch.is_grad_enabled()) or args:
            return original(self, hidden_states, attention_mask, *args, **kwargs)
        layers = list(self.layer)
        extra = {k: v for k, v in kwargs.items() if k not in ("use_cache", "past_key_values", "output_hidden_states",
                                                              "output_attentions", "return_dict")}

        def run(h: torch.Tensor, mask: Optional[torch.Tensor], segment: Any) -> torch.Tensor:
            for layer in segment:
                out = layer(h, mask, **extra)
                h = out[0] if isinstance(out, tuple) else out
            return h

        for start in range(0, len(layers), size):
            hidden_states = checkpoint(run, hidden_states, attention_mask, layers[start:start + size],
                                       use_reentrant=False)
        from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states)

    return forward
