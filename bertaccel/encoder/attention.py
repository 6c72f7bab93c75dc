"""Attention cores of the fused layer: softmax(QK^T)V over packed tokens, taking the one fused
Q/K/V projection as it comes out of its GEMM.

Every core takes qkv [T, 3, H, D] (a view of the [T, 3*H*D] GEMM output: no copy, no reshape
kernel: the head split is the view) and the batch's `Packing`, and returns [T, H, D]. Which core
runs is the attention group's choice (conf/attention/): triton (ours, and attention=eager, which
names no kernel of its own), xformers, or sdpa, which here is torch's own varlen kernels (flash
for fp16/bf16, memory-efficient for fp32), the kernels torch's sdpa dispatches to for dense batches.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from bertaccel.attention.packing import Packing

def _triton(qkv: torch.Tensor, packing: Packing, p: float, scale: float,
            seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    from bertaccel.attention.triton_attention import fused_attention_packed_qkv

    # The backward writes dQ, dK and dV into one [T, 3, H, D] gradient: the QKV GEMM's backward
    # reads it as it is (no concatenation).
    return fused_attention_packed_qkv(qkv, packing.cu_seqlens, packing.max_seqlen, p, scale,
                                      seed if p > 0 else None)


def _xformers(qkv: torch.Tensor, packing: Packing, p: float, scale: float,
              seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    import xformers.ops as xops

    from bertaccel.attention.swap import _xformers_ops

    # xops.unbind: views whose gradients autograd stacks into one tensor without a copy when they
    # are slices of one storage, as here.
    q, k, v = xops.unbind(qkv, dim=1)
    return xops.memory_efficient_attention(q[None], k[None], v[None], attn_bias=packing.bias, p=p, scale=scale,
                                           op=_xformers_ops(q))[0]


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


# (qkv, packing, dropout p, scale, seed or None) -> [T, H, D]
CORES: Dict[str, Callable[..., torch.Tensor]] = {
    "triton": _triton, "xformers": _xformers, "sdpa": _sdpa_varlen}


def prepare(core: str) -> Callable[[Packing], Any]:
    """The core's per-batch object, built once per batch by the encoder: the swap backend's own
    (xFormers' block-diagonal mask; nothing for ours); torch's varlen kernels need none."""
    from bertaccel.attention.swap import BACKENDS, _no_prepare

    return BACKENDS[core].prepare if core in BACKENDS else _no_prepare


def core_unusable(core: str, device: torch.device) -> Optional[str]:
    """Why this machine cannot run the core (a skip), or None."""
    from bertaccel.attention.swap import BACKENDS

    if core in BACKENDS:
        return BACKENDS[core].unusable(device)
    if device.type != "cuda":
        return "attention=sdpa with encoder=fused runs torch's varlen flash / memory-efficient kernels: CUDA GPU only"
    return None
