"""attention.swap=triton: our fused Triton attention over packed tokens (attention/triton_attention.py,
triton_kernels.py, triton_launch.py), as the swap and the fused encoder call it. Triton is imported
inside the functions: finding this kernel (kernels/__init__.py) imports no Triton."""
from __future__ import annotations

from typing import Optional

import torch

from bertaccel.attention.kernels import Backend, no_prepare
from bertaccel.attention.packing import Packing


def _triton_dense(q, k, v, p: float, scaling: float) -> torch.Tensor:
    """A batch without padding through the packed kernel too, as B sequences of S tokens: one
    kernel variant family for every batch, so a run's cold warm-up compiles 3 variants (forward and
    backward with dropout, forward without), not 3 more per tile size of the padded kernel."""
    from ..triton_attention import fused_attention_packed

    bsz, seq, heads, dim = q.shape
    cu = torch.arange(0, (bsz + 1) * seq, seq, dtype=torch.int32, device=q.device)
    fq, fk, fv = (t.reshape(bsz * seq, heads, dim) for t in (q, k, v))  # views: [B, S, H*D] projections
    return fused_attention_packed(fq, fk, fv, cu, seq, p, scaling).view(bsz, seq, heads, dim)


def _triton_packed(q, k, v, packing: Packing, p: float, scaling: float) -> torch.Tensor:
    from ..triton_attention import fused_attention_packed

    return fused_attention_packed(q, k, v, packing.cu_seqlens, packing.max_seqlen, p, scaling)


def _triton_fused(qkv: torch.Tensor, packing: Packing, p: float, scale: float,
                  seed: Optional[torch.Tensor] = None) -> torch.Tensor:
    """encoder=fused's core: qkv [T, 3, H, D] as the fused QKV GEMM writes it -> [T, H, D]."""
    from ..triton_attention import fused_attention_packed_qkv

    # The backward writes dQ, dK and dV into one [T, 3, H, D] gradient: the QKV GEMM's backward
    # reads it as it is (no concatenation).
    return fused_attention_packed_qkv(qkv, packing.cu_seqlens, packing.max_seqlen, p, scale,
                                      seed if p > 0 else None)


def triton_unusable(device: torch.device) -> Optional[str]:
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        return "attention=triton needs the triton package (pip install triton)"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return ("attention=triton needs a CUDA GPU; on a CPU the kernel only runs in Triton's "
                "interpreter (TRITON_INTERPRET=1), which is for correctness tests, not training")
    return None


# Listed after xformers (order 1): the order the kernels were added, which refusals and the
# config reference keep.
BACKEND = Backend(_triton_dense, _triton_packed, no_prepare, triton_unusable, _triton_fused, order=1,
                  jit_per_run=True)
