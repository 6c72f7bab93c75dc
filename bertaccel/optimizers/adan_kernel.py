"""The Triton kernel of AdanFused (adan_fused.py): one launch applies Adan's whole update to a
bucket's flat buffers, the numerics and the capturable step count as adan_fused.py's docstring
gives them. Kept apart from the optimizer's bookkeeping (buckets, views, state_dict), which is
plain PyTorch; the kernel is defined on first use, once per interpreter mode."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

try:  # Triton is optional for the package; only this optimizer needs it.
    import triton
    import triton.language as tl
    TRITON_ERROR: Optional[BaseException] = None
except Exception as e:  # noqa: BLE001 - ImportError, or a broken install raising anything
    triton = None
    tl = None
    TRITON_ERROR = e


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1) right now."""
    if triton is None:
        return False
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


_KERNELS: Dict[bool, Any] = {}


def kernel() -> Any:
    """The jitted kernel, defined on first use: triton.jit picks the interpreter when the function
    is decorated, so TRITON_INTERPRET set after this module was imported still counts."""
    mode = interpreting()
    if mode not in _KERNELS:
        _KERNELS[mode] = _define_kernel()
    return _KERNELS[mode]


def _define_kernel() -> Any:
    @triton.jit(do_not_specialize=["first"])
    def _adan_step(P, G, M, V, N, PRE, Blocks, Step, Count, Lr, Betas64,
                   lr_f, c1_f, c2_f, bc3s_f, first,
                   beta1, beta2, beta3, eps, weight_decay,
                   BLOCK: tl.constexpr, USE_TABLE: tl.constexpr, CAPTURABLE: tl.constexpr,
                   LR_PTR: tl.constexpr):
        pid = tl.program_id(0)
        lanes = tl.arange(0, BLOCK)
        if USE_TABLE:  # some tensors have no gradient: programs run only the listed blocks
            blk = tl.load(Blocks + pid)
            offs = tl.maximum(blk, 0).to(tl.int64) * BLOCK + lanes
            mask = lanes < tl.where(blk >= 0, BLOCK, 0)  # -1: a placeholder program (capturable, no grads)
        else:
            offs = pid.to(tl.int64) * BLOCK + lanes
            mask = None

        if LR_PTR:
            lr = tl.load(Lr).to(tl.float32)
        else:
            lr = lr_f
        if CAPTURABLE:
            # k from device memory (graph-replayable, no host sync); beta ** k by binary
            # exponentiation in fp64 on the exact (fp64) betas: only multiplies, no transcendental.
            k = tl.load(Step) + 1.0
            ki = k.to(tl.int32)
            base1 = tl.load(Betas64)
            base2 = tl.load(Betas64 + 1)
            base3 = tl.load(Betas64 + 2)
            pow1 = base1 * 0.0 + 1.0
            pow2 = pow1
            pow3 = pow1
            for i in tl.static_range(31):
                odd = ((ki >> i) & 1) != 0
                pow1 = tl.where(odd, pow1 * base1, pow1)
                pow2 = tl.where(odd, pow2 * base2, pow2)
                pow3 = tl.where(odd, pow3 * base3, pow3)
                base1 = base1 * base1
                base2 = base2 * base2
                base3 = base3 * base3
            c1 = (1.0 / (1.0 - pow1)).to(tl.float32)
            c2 = (tl.load(Betas64 + 1) / (1.0 - pow2)).to(tl.float32)
            bc3s = tl.sqrt_rn((1.0 - pow3).to(tl.float32))
            is_first = ki == 1
        else:
            c1 = c1_f
            c2 = c2_f
            bc3s = bc3s_f
            is_first = first != 0

        p_raw = tl.load(P + offs, mask=mask)
        p = p_raw.to(tl.float32)
        g = tl.load(G + offs, mask=mask).to(tl.float32)
        m = tl.load(M + offs, mask=mask).to(tl.float32)
        v = tl.load(V + offs, mask=mask).to(tl.float32)
        n = tl.load(N + offs, mask=mask).to(tl.float32)
        pre = tl.load(PRE + offs, mask=mask).to(tl.float32)

        diff = tl.where(is_first, 0.0, g - pre)
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * diff
        u = g + beta2 * diff
        n = beta3 * n + (1.0 - beta3) * u * u
        denom = tl.div_rn(tl.sqrt_rn(n), bc3s) + eps
        upd = tl.div_rn((lr * c1) * m + (lr * c2) * v, denom)
        p = tl.div_rn(p - upd, 1.0 + lr * weight_decay)

        tl.store(P + offs, p.to(p_raw.dtype), mask=mask)
        tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
        tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)
        tl.store(N + offs, n.to(N.dtype.element_ty), mask=mask)
        tl.store(PRE + offs, g.to(PRE.dtype.element_ty), mask=mask)

        if CAPTURABLE:
            # Every thread of this program has read k (its value fed the stores above) before the
            # barrier; the program's arrival is then counted. The last to arrive has seen all
            # arrivals (acq_rel), so every program has read k: it writes k + 1 and resets the count.
            tl.debug_barrier()
            arrived = tl.atomic_add(Count, 1, sem="acq_rel")
            last = arrived == tl.num_programs(0) - 1
            tl.store(Step, k.to(Step.dtype.element_ty), mask=last)
            tl.store(Count, 0, mask=last)

    return _adan_step
