"""Model FLOPs of BERT training, counted analytically, and model FLOPs utilization (MFU).

Only matrix multiplications count (the usual MFU convention: layer norms, softmax, GELU and
the optimizer are left out). Per encoder layer, with P = the layer's Linear weight count
(4H^2 + 2*H*I), T = tokens and A = sum over batches of B*S^2:
  forward             2*P*T + 4*A*H       (QK^T and P@V: 2*B*S^2*H each)
  weight gradients    2*P*T               (for the Linear weights that train)
  input gradients     2*P*T + 8*A*H       (when something below the layer trains)
which is the familiar 6*P*T + 12*A*H per layer when everything trains. Layer-wise freezing
makes the backward stop at the lowest trainable layer, and the count follows it. The pooler
and classifier run on one row per sequence. T and A are the *padded* shapes, the work the
GPU actually did (dynamic padding keeps them close to the real token count, logged beside).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

import torch
from torch import nn

from bertaccel.attention.hf_model import HFModule

# The Linear layers that read an encoder layer's input: their input gradient is only needed
# when something below the layer trains.
_INPUT_LINEARS = ("attention.self.query", "attention.self.key", "attention.self.value",
                  "qkv")  # encoder=fused: Q, K and V as one Linear (encoder/layer.py)


@dataclass
class TokenCounts:
    sequences: int = 0
    padded_tokens: int = 0     # sum of B*S over the batches trained on
    real_tokens: int = 0       # sum of the attention masks
    attention_pairs: int = 0   # sum of B*S^2 (padded)
    real_attention_pairs: int = 0   # sum of L^2 over the rows (packed: each row's real tokens)
    split_attention_pairs: int = 0  # sum of L^2 + (S-L)^2 (the static packed layout: padding apart)

    def add(self, batch: Mapping[str, torch.Tensor]) -> None:
        b, s = batch["input_ids"].shape
        self.sequences += b
        self.padded_tokens += b * s
        # Filler rows (compiled runs fill a short batch up; label -100) attend to one token each:
        # computed, so in B*S, but not real text.
        fillers = int((batch["labels"] < 0).sum()) if "labels" in batch else 0
        lengths = batch["attention_mask"].sum(1)
        self.real_tokens += int(lengths.sum()) - fillers
        self.attention_pairs += b * s * s
        self.real_attention_pairs += int((lengths * lengths).sum())
        self.split_attention_pairs += int((lengths * lengths + (s - lengths) * (s - lengths)).sum())

    def __iadd__(self, other: "TokenCounts") -> "TokenCounts":
        self.sequences += other.sequences
        self.padded_tokens += other.padded_tokens
        self.real_tokens += other.real_tokens
        self.attention_pairs += other.attention_pairs
        self.real_attention_pairs += other.real_attention_pairs
        self.split_attention_pairs += other.split_attention_pairs
        return self


def _linears(module: nn.Module):
    return [(name, m) for name, m in module.named_modules() if isinstance(m, nn.Linear)]


def _macs(linears, trainable_only: bool = False) -> int:
    return sum(m.in_features * m.out_features for _, m in linears
               if not trainable_only or m.weight.requires_grad)


def _trains(module: Optional[nn.Module]) -> bool:
    return module is not None and any(p.requires_grad for p in module.parameters())


def computed_shapes(model: HFModule, counts: TokenCounts) -> Tuple[int, int]:
    """(T, A): the tokens and attention pairs the encoder computed, by the layout it last packed
    in (attention/packing.py's PackedEncoder and encoder=fused's FusedEncoder say which), else the
    padded ones."""
    layout = getattr(model.base_model.encoder, "layout", None)
    if layout == "exact":
        return counts.real_tokens, counts.real_attention_pairs
    if layout == "static":
        return counts.padded_tokens, counts.split_attention_pairs
    return counts.padded_tokens, counts.attention_pairs


def bert_train_flops(model: HFModule, counts: TokenCounts) -> float:
    """Matmul FLOPs of forward+backward over `counts`, for the model's current requires_grad."""
    backbone = model.base_model
    hidden = backbone.config.hidden_size
    t, a = computed_shapes(model, counts)
    below = _trains(backbone.embeddings)  # does the gradient have to flow below this point?
    total = 0
    for layer in backbone.encoder.layer:
        linears = _linears(layer)
        p_all = _macs(linears)
        p_input = _macs([(n, m) for n, m in linears if n in _INPUT_LINEARS])
        layer_trains = _trains(layer)
        total += 2 * p_all * t + 4 * a * hidden                 # forward
        total += 2 * _macs(linears, trainable_only=True) * t     # weight gradients
        if below:
            total += 2 * p_all * t + 8 * a * hidden             # input gradients, whole layer
        elif layer_trains:
            total += 2 * (p_all - p_input) * t + 8 * a * hidden  # stops at the Q/K/V inputs
        below = below or layer_trains
    # Head: pooler (first token) then classifier, one row per sequence.
    rows = counts.sequences
    for module in (getattr(backbone, "pooler", None), getattr(model, "classifier", None)):
        if module is None:
            continue
        linears = _linears(module)
        total += 2 * _macs(linears) * rows
        total += 2 * _macs(linears, trainable_only=True) * rows
        if below:
            total += 2 * _macs(linears) * rows
        below = below or _trains(module)
    return float(total)


def peak_tflops(profile: Mapping[str, Any], precision: str) -> Tuple[Optional[float], str]:
    """(peak dense TFLOP/s per GPU for the precision, where it came from) or (None, why)."""
    key = f"peak_tflops_{precision}"
    value = profile.get(key)
    if value is None:
        return None, f"hardware profile '{profile.get('name')}' has no {key}"
    note = " (fp32 matmuls without TF32, torch's default)" if precision == "fp32" else ""
    return float(value), f"{key}={value} from hardware profile '{profile.get('name')}'{note}"


def mfu(model_flops: float, seconds: float, peak_tflops_per_gpu: float, num_gpus: int) -> float:
    return model_flops / seconds / (peak_tflops_per_gpu * 1e12 * num_gpus)
