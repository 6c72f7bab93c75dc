"""Module swap: replace every BERT self-attention with one that calls xFormers or our Triton kernel.

The replacement copies the query/key/value weights and biases, so the model computes the same
function; only the softmax(QK^T)V core changes. The model itself is built with
attn_implementation="eager", whose additive 4-D mask becomes a [B, S] key-padding mask here.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn


def key_padding_mask(attention_mask: Optional[torch.Tensor], bsz: int, seq: int) -> Optional[torch.Tensor]:
    """[B, S] bool (True = attend) from HF's mask: None; a 2-D 0/1 mask; or 4-D [B, 1, 1|S, S],
    additive float (0 = attend) or bool (True = attend). BERT's masks are key-padding masks, so
    one query row says it all. No data-dependent branch: torch.compile traces it without breaks."""
    if attention_mask is None:
        return None
    m = attention_mask
    if m.dim() == 2:
        return m != 0
    m = m[:, 0, 0, :]
    if m.dtype == torch.bool:
        return m
    return m > torch.finfo(m.dtype).min / 2


def _xformers_bias(keep: torch.Tensor, heads: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive [B, H, S, S] bias; its storage is padded to a multiple of 8 columns, as xFormers'
    memory-efficient kernels require aligned bias rows."""
    bsz, seq = keep.shape
    padded = (seq + 7) // 8 * 8
    bias = torch.zeros(bsz, heads, seq, padded, dtype=dtype, device=keep.device)[..., :seq]
    bias.masked_fill_(~keep[:, None, None, :], float("-inf"))
    return bias


class FusedSelfAttention(nn.Module):
    """Drop-in for transformers' BertSelfAttention (same forward signature and outputs)."""

    def __init__(self, src: nn.Module, backend: str):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}")
        self.backend = backend
        self.num_heads = src.num_attention_heads
        self.head_dim = src.attention_head_size
        self.scaling = src.scaling
        self.dropout_p = src.dropout.p
        # Own copies of the projections: the swapped model computes the same function.
        self.query, self.key, self.value = (copy.deepcopy(m) for m in (src.query, src.key, src.value))
        self.train(src.training)  # a new module starts in training mode: keep the model's mode

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                past_key_values: Any = None, **kwargs: Any):
        if past_key_values is not None:
            raise NotImplementedError("fused attention is for encoder training: no KV cache")
        bsz, seq, _ = hidden_states.shape
        shape = (bsz, seq, self.num_heads, self.head_dim)
        q, k, v = (proj(hidden_states).view(shape) for proj in (self.query, self.key, self.value))
        keep = key_padding_mask(attention_mask, bsz, seq)
        p = self.dropout_p if self.training else 0.0
        out = BACKENDS[self.backend].core(q, k, v, keep, p, self.scaling)
        return out.reshape(bsz, seq, -1), None


def _triton_core(q, k, v, keep, p: float, scaling: float) -> torch.Tensor:
    from .triton_attention import fused_attention

    return fused_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keep, p, scaling).transpose(1, 2)


def _xformers_core(q, k, v, keep, p: float, scaling: float) -> torch.Tensor:
    import xformers.ops as xops

    bias = None if keep is None else _xformers_bias(keep, q.shape[2], q.dtype)
    return xops.memory_efficient_attention(q, k, v, attn_bias=bias, p=p, scale=scaling)


def swap_attention(model: nn.Module, backend: str) -> int:
    """Replace each encoder layer's self-attention in place; returns how many were swapped."""
    layers = model.base_model.encoder.layer
    for layer in layers:
        layer.attention.self = FusedSelfAttention(layer.attention.self, backend)
    return len(layers)


def xformers_unusable(device: torch.device) -> Optional[str]:
    """None when xFormers' memory_efficient_attention runs on this device, else the exact reason."""
    try:
        import xformers.ops as xops
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken extension raising anything
        return (f"attention=xformers: xformers is not importable ({type(e).__name__}: {e}); "
                "install it with `pip install -e .[xformers]` (pins the torch it was built for)")
    if device.type != "cuda":
        return "attention=xformers needs a CUDA GPU (xFormers has no CPU kernels)"
    try:
        q = torch.zeros(1, 8, 1, 64, device=device, dtype=torch.float16)
        xops.memory_efficient_attention(q, q, q)
    except Exception as e:  # noqa: BLE001
        import xformers

        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (f"attention=xformers: xformers {xformers.__version__} is installed but unusable with torch "
                f"{torch.__version__}: {first[:300]}")
    return None


def triton_unusable(device: torch.device) -> Optional[str]:
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        return "attention=triton needs the triton package (pip install triton)"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return ("attention=triton needs a CUDA GPU; on a CPU the kernel only runs in Triton's "
                "interpreter (TRITON_INTERPRET=1), which is for correctness tests, not training")
    return None


@dataclass(frozen=True)
class Backend:
    """One swap backend: its attention core ([B, S, H, D] q/k/v, [B, S] keep mask or None,
    dropout p, scale -> [B, S, H, D]) and its "can this machine run it" check."""
    core: Callable[..., torch.Tensor]
    unusable: Callable[[torch.device], Optional[str]]


# The swap backends an attention option may name (conf/attention/*.yaml `swap:`).
BACKENDS = {"xformers": Backend(_xformers_core, xformers_unusable),
            "triton": Backend(_triton_core, triton_unusable)}
