"""attention.swap=xformers: xFormers' memory_efficient_attention over packed tokens (a BlockDiagonalMask
built once per batch), as the swap and the fused encoder call it. xFormers is imported inside the
functions: finding this kernel (kernels/__init__.py) imports no xFormers."""
from __future__ import annotations

from typing import Any, Optional

import torch

from bertaccel.attention.kernels import Backend
from bertaccel.attention.packing import Packing
from bertaccel.config import first_line


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


# Listed first (order 0): the first kernel added, as refusals and the config reference name it.
BACKEND = Backend(_xformers_dense, _xformers_packed, _xformers_prepare, xformers_unusable, _xformers_fused, order=0)
