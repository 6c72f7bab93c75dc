"""The Triton kernel of AdanFused (adan_fused.py): one launch applies Adan's whole update to a
bucket's flat buffers, the numerics as adan_fused.py's docstring gives them. What every
flat-buffer kernel shares (element ranges, lr, step number, master/workspace reads and writes,
loss scale, capturable step count) is flat_kernel.py; the host side is flat.py. The 1 - beta
factors come from the host in fp64, rounded once (1 - fp32(beta) in fp32 is off by up to 1e-6
relative for these betas)."""
from __future__ import annotations

# triton and TRITON_ERROR too: the optimizer asks its kernel's module whether Triton imported.
from .flat_kernel import (TRITON_ERROR, beta_powers, block_offsets, jit, learning_rate,  # noqa: F401
                          load_grad, load_param, step_number, store_param, tl, triton)


@jit(do_not_specialize=["k_host"])
def adan_step(P, W, G, M, V, N, PRE, Blocks, Step, Lr, Betas64, GradScale, FoundInf,
         lr_f, k_host, c1_f, c2_f, bc3s_f, beta1, beta2, beta3, one_minus_beta1, one_minus_beta2, one_minus_beta3,
         eps, weight_decay,
         BLOCK: tl.constexpr, USE_TABLE: tl.constexpr, CAPTURABLE: tl.constexpr, LR_PTR: tl.constexpr,
         MASTER: tl.constexpr, UNSCALE: tl.constexpr, SKIP_INF: tl.constexpr):
    offs, mask = block_offsets(Blocks, FoundInf, BLOCK, USE_TABLE, SKIP_INF)
    lr = learning_rate(Lr, lr_f, LR_PTR)
    k = step_number(Step, k_host, CAPTURABLE)
    if CAPTURABLE:  # the bias corrections from the device step count (host: c1_f, c2_f, bc3s_f)
        pow1, pow2, pow3 = beta_powers(Betas64, k, 3)
        c1 = (1.0 / (1.0 - pow1)).to(tl.float32)
        c2 = (tl.load(Betas64 + 1) / (1.0 - pow2)).to(tl.float32)
        bc3s = tl.sqrt_rn((1.0 - pow3).to(tl.float32))
    else:
        c1 = c1_f
        c2 = c2_f
        bc3s = bc3s_f
    is_first = k == 1

    p = load_param(P, W, offs, mask, is_first, MASTER)
    g = load_grad(G, offs, mask, GradScale, UNSCALE)
    m = tl.load(M + offs, mask=mask).to(tl.float32)
    v = tl.load(V + offs, mask=mask).to(tl.float32)
    n = tl.load(N + offs, mask=mask).to(tl.float32)
    pre = tl.load(PRE + offs, mask=mask).to(tl.float32)

    diff = tl.where(is_first, 0.0, g - pre)
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * diff
    u = g + beta2 * diff
    n = beta3 * n + one_minus_beta3 * u * u
    denom = tl.div_rn(tl.sqrt_rn(n), bc3s) + eps
    upd = tl.div_rn((lr * c1) * m + (lr * c2) * v, denom)
    p = tl.div_rn(p - upd, 1.0 + lr * weight_decay)

    store_param(P, W, offs, mask, p, MASTER)
    tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
    tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)
    tl.store(N + offs, n.to(N.dtype.element_ty), mask=mask)
    tl.store(PRE + offs, g.to(PRE.dtype.element_ty), mask=mask)


# The name flat.py launches. A kernel's function name is what profilers show: adan_step falls in
# the optimizer category of bertaccel/measure/profiling.py ("step" fell in "other").
step = adan_step
