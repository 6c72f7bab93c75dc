"""Attention cores of the fused layer: softmax(QK^T)V over packed tokens, taking the one fused
Q/K/V projection as it comes out of its GEMM.

Every core takes qkv [T, 3, H, D] (a view of the [T, 3*H*D] GEMM output: no copy, no reshape
kernel: the head split is the view) and the batch's `Packing`, and returns [T, H, D]. Which core
runs is the attention group's choice (conf/attention/): triton (ours, and attention=eager, which
names no kernel of its own), xformers, or sdpa, which here is torch's own varlen kernels (flash
for fp16/bf16, memory-efficient for fp32), the kernels torch's sdpa dispatches to for dense batches.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from bertaccel.attention.kernels import BACKENDS, no_prepare
from bertaccel.attention.packing import Packing


def _sdpa_varlen(qkv: torch.Tensor, packing: Packing, p: float, scale: float,
                 seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """torch's varlen kernels (what sdpa runs per batch, over sequence starts instead of padding):
    flash for fp16/bf16, memory-efficient (CUTLASS) for fp32, which flash does not take. Both
    have autograd formulas in torch (derivatives.yaml) and draw dropout from torch's generator,
    capture-safe as sdpa's are (so `seed`, ours, is not theirs: unused, as xFormers')."""
    q, k, v = qkv.unbind(1)
    cu, n = packing.cu_seqlens, packing.max_seqlen
    if qkv.dtype in (torch.float16, torch.bfloat16):
        out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, n, n, p, False, False, scale=scale)
        return out[0]
    out = torch.ops.aten._efficient_attention_forward(q[None], k[None], v[None], None, cu, cu, n, n, p, 0, True,
                                                      scale=scale)
    return out[0][0]


def core(name: str) -> Callable[..., torch.Tensor]:
    """The fused layer's attention core named `name`: (qkv, packing, dropout p, scale, seed or None)
    -> [T, H, D]. A swap kernel's own (attention/kernels/: the one registry of kernels, read when
    first asked), or sdpa's, torch's varlen kernels."""
    return _sdpa_varlen if name == "sdpa" else BACKENDS[name].fused_core


def prepare(core: str) -> Callable[[Packing], Any]:
    """The core's per-batch object, built once per batch by the encoder: the swap backend's own
    (xFormers' block-diagonal mask; nothing for ours); torch's varlen kernels need none."""
    return BACKENDS[core].prepare if core in BACKENDS else no_prepare


def core_unusable(core: str, device: torch.device) -> Optional[str]:
    """Why this machine cannot run the core (a skip), or None."""
    if core in BACKENDS:
        return BACKENDS[core].unusable(device)
    if device.type != "cuda":
        return "attention=sdpa with encoder=fused runs torch's varlen flash / memory-efficient kernels: CUDA GPU only"
    return None
