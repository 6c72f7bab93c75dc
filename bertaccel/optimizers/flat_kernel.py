"""Device code shared by the flat-buffer optimizers' Triton kernels (adan_kernel.py,
adamw_kernel.py): which elements a program owns, the learning rate, the step number, the
parameter and gradient reads and writes of both modes (plain, or fp32 master + half workspace),
loss-scale handling, and the capturable step count's advance (its own launch). Each optimizer's kernel is its
update rule between these calls; the host side is flat.py (its buffers: flat_buffers.py).

Triton is optional for the package: without it this module still imports (`jit` then leaves the
functions undecorated; they are never launched, since the optimizers refuse to be built) and
`TRITON_ERROR` says why. The functions are decorated when this module is imported, which is when
triton.jit chooses between compiling and Triton's CPU interpreter: set TRITON_INTERPRET before
importing bertaccel's optimizers (tests/conftest.py does), as for the attention kernels.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

try:
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


def jit(fn: Optional[Callable] = None, **kwargs: Any) -> Any:
    """triton.jit (bare or with arguments) where Triton imports; the plain function elsewhere."""
    if triton is None:
        return fn if fn is not None else (lambda f: f)
    return triton.jit(fn, **kwargs) if fn is not None else triton.jit(**kwargs)


@jit
def block_offsets(Blocks, FoundInf, BLOCK: tl.constexpr, USE_TABLE: tl.constexpr, SKIP_INF: tl.constexpr):
    """(offsets, mask) of this program's BLOCK elements. Every tensor's segment starts at a multiple
    of BLOCK, so a program belongs to one tensor. USE_TABLE: some tensors have no gradient and the
    program runs the block listed at its index. SKIP_INF: the loss scaler found inf/NaN gradients,
    no element is read or written (the update is skipped on the device, no host sync)."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    if USE_TABLE:
        offs = tl.load(Blocks + pid).to(tl.int64) * BLOCK + lanes
    else:
        offs = pid.to(tl.int64) * BLOCK + lanes
    mask = lanes < BLOCK
    if SKIP_INF:  # (tl.where, not &: Triton's interpreter turns bool & bool into integers)
        mask = tl.where(tl.load(FoundInf) == 0, mask, False)
    return offs, mask


@jit
def learning_rate(Lr, lr_f, LR_PTR: tl.constexpr):
    """lr from device memory (a tensor lr: a schedule can change it inside a CUDA graph), or the
    float the host passed."""
    if LR_PTR:
        lr = tl.load(Lr).to(tl.float32)
    else:
        lr = lr_f
    return lr


@jit
def step_number(Step, k_host, CAPTURABLE: tl.constexpr):
    """The number k (from 1) of the step being taken: capturable, the device step count + 1 (no
    host sync, graph-replayable); otherwise the host's."""
    if CAPTURABLE:
        k = (tl.load(Step) + 1.0).to(tl.int32)
    else:
        k = k_host
    return k


@jit
def beta_powers(Betas64, k, N: tl.constexpr):
    """(beta1 ** k, beta2 ** k, beta3 ** k) of the N (2 or 3; with 2 the third is 1) fp64 betas at
    Betas64, k an int32 >= 0, by binary exponentiation: multiplies only (no transcendental), so
    the capturable bias corrections match the host's fp64 ones. One loop for all: the chains are
    independent and overlap (separate loops made the capturable Adan step 5% slower on an H100)."""
    b1 = tl.load(Betas64)
    b2 = tl.load(Betas64 + 1)
    p1 = b1 * 0.0 + 1.0
    p2 = p1
    p3 = p1
    b3 = p1
    if N == 3:
        b3 = tl.load(Betas64 + 2)
    for i in tl.static_range(31):
        odd = ((k >> i) & 1) != 0
        p1 = tl.where(odd, p1 * b1, p1)
        p2 = tl.where(odd, p2 * b2, p2)
        b1 = b1 * b1
        b2 = b2 * b2
        if N == 3:
            p3 = tl.where(odd, p3 * b3, p3)
            b3 = b3 * b3
    return p1, p2, p3


@jit
def load_param(P, W, offs, mask, is_first, MASTER: tl.constexpr):
    """The parameter in fp32. MASTER: P is the fp32 master and W the half workspace the model
    computes with; at a first step the master is (re)seeded from the workspace, so zeroing the
    state restarts from the weights the parameters hold now (the step-graph capture puts the
    weights back in place and zeroes every state tensor, the master included). On other steps the
    master is the truth and W is not read. Otherwise P holds the parameter itself."""
    if MASTER:
        from_w = tl.load(W + offs, mask=tl.where(is_first, mask, False))
        from_p = tl.load(P + offs, mask=tl.where(is_first, False, mask))
        p = tl.where(is_first, from_w.to(tl.float32), from_p.to(tl.float32))
    else:
        p = tl.load(P + offs, mask=mask).to(tl.float32)
    return p


@jit
def load_grad(G, offs, mask, GradScale, UNSCALE: tl.constexpr):
    """The gradient in fp32 (a half gradient converted here: no separate cast). UNSCALE: times
    1 / loss scale, the reciprocal taken in fp64 and rounded to fp32 as GradScaler.unscale_ does,
    so the result is the same as unscaling first."""
    g = tl.load(G + offs, mask=mask).to(tl.float32)
    if UNSCALE:
        g = g * (1.0 / tl.load(GradScale).to(tl.float64)).to(tl.float32)
    return g


@jit
def round_to(p, dtype: tl.constexpr):
    """fp32 p rounded to nearest even in `dtype`, as Tensor.to rounds. bf16 by integer arithmetic
    on the bits (c10's own bf16 rounding, NaN kept a NaN): Triton's interpreter truncates fp32 ->
    bf16 casts, and the same code on the GPU keeps the CPU tests about the GPU's arithmetic."""
    if dtype == tl.bfloat16:
        bits = p.to(tl.uint32, bitcast=True)
        bits = bits + (((bits >> 16) & 1) + 0x7FFF)
        half = tl.where(p != p, 0x7FC0, (bits >> 16).to(tl.uint16))
        out = half.to(tl.bfloat16, bitcast=True)
    else:
        out = p.to(dtype)
    return out


@jit
def store_param(P, W, offs, mask, p, MASTER: tl.constexpr):
    """Write the updated fp32 parameter: to P (the master, or the parameter in its dtype) and,
    MASTER, rounded once to the workspace's half dtype in the same pass."""
    tl.store(P + offs, round_to(p, P.dtype.element_ty), mask=mask)
    if MASTER:
        tl.store(W + offs, round_to(p, W.dtype.element_ty), mask=mask)


@jit
def optimizer_advance_step(Step, FoundInf, SKIP_INF: tl.constexpr):
    """Capturable: the bucket's step count k - 1 -> k (left as it was if the loss scaler skipped
    the step), in a one-program launch after the update's: stream order puts it after every
    program of the update has read the old count. The update itself once did this hand-over with
    an acq_rel atomic count of finished programs, the last one writing k: a release fence and one
    contended atomic in each of ~100,000 programs (BERT-base), which made the capturable update
    1.46 ms against torch's fused AdamW's 0.87 on an H200 (benchmarks/step_kernels.py, 2026-11-30)."""
    k = tl.load(Step) + 1.0
    if SKIP_INF:
        k = k - (tl.load(FoundInf) != 0).to(tl.float32)
    tl.store(Step, k.to(Step.dtype.element_ty))
