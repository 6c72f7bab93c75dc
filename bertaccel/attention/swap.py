"""Module swap: replace every BERT self-attention with one that calls xFormers or our Triton kernel.

The replacement copies the query/key/value weights and biases, so the model computes the same
function; only the softmax(QK^T)V core changes. The encoder is replaced too, by one that removes
the padding once per batch (attention/packing.py): the swapped attentions then see packed tokens
and the sequence starts, which is how xFormers (BlockDiagonalMask) and our Triton kernel (packed
mode) are meant to be used for BERT, with no padding mask and no work on padding.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from bertaccel.attention.packing import (PackedEncoder, Packing, key_padding_mask, pack, pack_tokens,
                                         pass_masks_through, unpack_tokens)
from bertaccel.config import first_line


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


# The backends' cores. dense_core: q/k/v [B, S, H, D], no padding -> [B, S, H, D].
# packed_core: q/k/v [T, H, D] of the Packing's sequences -> [T, H, D]. prepare: the backend's
# per-batch object, built once per batch by PackedEncoder (not per layer).
def _triton_dense(q, k, v, p: float, scaling: float) -> torch.Tensor:
    """A batch without padding through the packed kernel too, as B sequences of S tokens: one
    kernel variant family for every batch, so a run's cold warm-up compiles 3 variants (forward and
    backward with dropout, forward without), not 3 more per tile size of the padded kernel."""
    from .triton_attention import fused_attention_packed

    bsz, seq, heads, dim = q.shape
    cu = torch.arange(0, (bsz + 1) * seq, seq, dtype=torch.int32, device=q.device)
    flat = (t.reshape(bsz * seq, heads, dim) for t in (q, k, v))  # views: [B, S, H*D] projections
    return fused_attention_packed(*flat, cu, seq, p, scaling).view(bsz, seq, heads, dim)


def _triton_packed(q, k, v, packing: Packing, p: float, scaling: float) -> torch.Tensor:
    from .triton_attention import fused_attention_packed

    return fused_attention_packed(q, k, v, packing.cu_seqlens, packing.max_seqlen, p, scaling)


def _triton_fused(qkv: torch.Tensor, packing: Packing, p: float, scale: float,
                  seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """encoder=fused's core: qkv [T, 3, H, D] as the fused QKV GEMM writes it -> [T, H, D]."""
    from .triton_attention import fused_attention_packed_qkv

    # The backward writes dQ, dK and dV into one [T, 3, H, D] gradient: the QKV GEMM's backward
    # reads it as it is (no concatenation).
    return fused_attention_packed_qkv(qkv, packing.cu_seqlens, packing.max_seqlen, p, scale,
                                      seed if p > 0 else None)


def _xformers_ops(q: torch.Tensor):
    """The (forward, backward) operators named rather than chosen per call: xFormers' dispatcher
    otherwise asks every operator whether it supports the inputs, at every call. Flash takes
    fp16/bf16 on sm80 and newer; fp32, and GPUs before sm80, go to the CUTLASS kernels."""
    import xformers.ops as xops

    if (q.dtype in (torch.float16, torch.bfloat16) and q.is_cuda
            and torch.cuda.get_device_capability(q.device) >= (8, 0)):
        return xops.MemoryEfficientAttentionFlashAttentionOp
    return xops.MemoryEfficientAttentionCutlassOp


def _xformers_dense(q, k, v, p: float, scaling: float) -> torch.Tensor:
    import xformers.ops as xops

    return xops.memory_efficient_attention(q, k, v, p=p, scale=scaling, op=_xformers_ops(q))


def _xformers_packed(q, k, v, packing: Packing, p: float, scaling: float) -> torch.Tensor:
    import xformers.ops as xops

    out = xops.memory_efficient_attention(q[None], k[None], v[None], attn_bias=packing.bias, p=p, scale=scaling,
                                          op=_xformers_ops(q))
    return out[0]


def _xformers_fused(qkv: torch.Tensor, packing: Packing, p: float, scale: float,
                    seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """encoder=fused's core (its dropout draws from xFormers' own generator: `seed` unused)."""
    import xformers.ops as xops

    # xops.unbind: views whose gradients autograd stacks into one tensor without a copy when they
    # are slices of one storage, as here.
    q, k, v = xops.unbind(qkv, dim=1)
    return xops.memory_efficient_attention(q[None], k[None], v[None], attn_bias=packing.bias, p=p, scale=scale,
                                           op=_xformers_ops(q))[0]


def _xformers_prepare(packing: Packing) -> Any:
    """xFormers' BlockDiagonalMask over the packed sequences, on the Packing's device cu_seqlens.
    Built from the sequence-start tensor rather than from host lengths: the static layout (CUDA
    graphs, torch.compile) has none on the host, and xFormers reads only the tensor and max_seqlen
    in its kernels (its from_seqlens_inplace exists for CUDA graphs on the same ground). The host
    starts it keeps are then the exact ones where known, else a placeholder of the right total."""
    from xformers.ops.fmha.attn_bias import BlockDiagonalMask, _SeqLenInfo

    if packing.seqlens_py is not None:
        starts = [0]
        for n in packing.seqlens_py:
            starts.append(starts[-1] + n)
        low = min(packing.seqlens_py, default=0)
    else:
        n_seq = packing.cu_seqlens.shape[0] - 1
        total = packing.tokens
        starts = [min(i * packing.max_seqlen, total) for i in range(n_seq)] + [total]
        low = 0
    info = _SeqLenInfo(seqstart=packing.cu_seqlens, max_seqlen=packing.max_seqlen, min_seqlen=low, seqstart_py=starts)
    return BlockDiagonalMask(q_seqinfo=info, k_seqinfo=info)


def swap_attention(model: nn.Module, backend: str) -> int:
    """Replace each encoder layer's self-attention in place, and the encoder by one that packs the
    batch's tokens once (attention/packing.py); returns how many attentions were swapped."""
    base = model.base_model
    layers = base.encoder.layer
    for layer in layers:
        layer.attention.self = FusedSelfAttention(layer.attention.self, backend)
    base.encoder = PackedEncoder(base.encoder, BACKENDS[backend].prepare)
    pass_masks_through(model)
    return len(layers)


# xFormers' PyPI wheels are built for one torch (0.0.35: torch 2.10 with CUDA 12.8); on any other
# torch the extension does not load. Built from its source against the torch at hand it does:
# 0.0.35 compiles only a small extension (attention runs on torch's own CUTLASS and flash
# kernels): 68 s on 16 cores, a 1.9 MB wheel (H200 machine, torch 2.11+cu130, 2026-11-24).
XFORMERS_INSTALL = ('TORCH_CUDA_ARCH_LIST="9.0" pip install --no-build-isolation --no-binary xformers '
                    'xformers==0.0.35  (9.0: your GPU\'s compute capability, '
                    'torch.cuda.get_device_capability(); about a minute to build)')


def xformers_unusable(device: torch.device) -> Optional[str]:
    """None when xFormers' memory_efficient_attention runs on this device, else the exact reason,
    naming the install line that fixes it."""
    try:
        import xformers
        import xformers.ops as xops
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken extension raising anything
        return (f"attention=xformers: xformers is not importable ({type(e).__name__}: {str(e)[:200]}); "
                f"build it for your torch with: {XFORMERS_INSTALL}")
    if not getattr(xformers, "_has_cpp_library", True):  # the extension built for another torch
        load_error = str(getattr(getattr(xformers, "_cpp_lib", None), "_cpp_library_load_exception", "") or "")
        detail = next((ln.strip() for ln in load_error.splitlines() if "PyTorch" in ln), "")
        return (f"attention=xformers: xformers {xformers.__version__}'s extension does not load with torch "
                f"{torch.__version__}{' (built for ' + detail + ')' if detail else ''}; "
                f"rebuild it for this torch with: {XFORMERS_INSTALL}")
    if device.type != "cuda":
        return "attention=xformers needs a CUDA GPU (xFormers has no CPU kernels)"
    try:
        q = torch.zeros(1, 8, 1, 64, device=device, dtype=torch.float16)
        xops.memory_efficient_attention(q, q, q)
    except Exception as e:  # noqa: BLE001
        first = first_line(e)
        return (f"attention=xformers: xformers {xformers.__version__} is installed but does not run with torch "
                f"{torch.__version__}: {first[:300]}; rebuild it for this torch with: {XFORMERS_INSTALL}")
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


def _no_prepare(packing: Packing) -> None:
    return None


@dataclass(frozen=True)
class Backend:
    """One attention kernel, everything the package asks of it: its cores for the swapped Hugging
    Face layer (dense and packed, above) and for our fused layer (encoder/attention.py CORES:
    qkv [T, 3, H, D] -> [T, H, D]), its per-batch preparation, and its "can this machine run it"
    check. A new kernel is one entry here (its cores in a module of its own) and its YAML file in
    conf/attention/ (`swap: <name>`): the attention option, the fused encoder and the machine
    check all read this one table."""
    dense_core: Callable[..., torch.Tensor]
    packed_core: Callable[..., torch.Tensor]
    prepare: Callable[[Packing], Any]
    unusable: Callable[[torch.device], Optional[str]]
    fused_core: Callable[..., torch.Tensor]


# The attention kernels an attention option may name (conf/attention/*.yaml `swap:`).
BACKENDS = {"xformers": Backend(_xformers_dense, _xformers_packed, _xformers_prepare, xformers_unusable, _xformers_fused),
            "triton": Backend(_triton_dense, _triton_packed, _no_prepare, triton_unusable, _triton_fused)}
