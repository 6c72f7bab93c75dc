"""The Triton kernel of AdamWFused (adamw_flat.py): one launch applies torch.optim.AdamW's whole
update to a bucket's flat buffers, in the order torch's single-tensor AdamW computes it:

    p     = p * (1 - lr * weight_decay)               (decoupled weight decay, first)
    m     = m + (1 - b1) * (g - m)                    (exp_avg.lerp_(g, 1 - b1))
    v     = b2 * v + (1 - b2) * g * g                 (exp_avg_sq)
    denom = sqrt(v) / sqrt(1 - b2 ** k) + eps         (eps outside the square root)
    p     = p - lr / (1 - b1 ** k) * (m / denom)

1 - b1 and 1 - b2 come from the host, computed in fp64 and rounded once, as torch's scalars are: in
fp32 here, 1 - fp32(0.999) would be 1.3e-5 off in relative terms. What every flat-buffer kernel
shares is flat_kernel.py; the host side is flat.py."""
from __future__ import annotations

# triton and TRITON_ERROR too: the optimizer asks its kernel's module whether Triton imported.
from .flat_kernel import (TRITON_ERROR, beta_powers, block_offsets, jit, learning_rate,  # noqa: F401
                          load_grad, load_param, step_number, store_param, tl, triton)


@jit(do_not_specialize=["k_host"])
def adamw_step(P, W, G, M, V, Blocks, Step, Lr, Betas64, GradScale, FoundInf,
         lr_f, k_host, c1_f, bc2s_f, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay,
         BLOCK: tl.constexpr, USE_TABLE: tl.constexpr, CAPTURABLE: tl.constexpr, LR_PTR: tl.constexpr,
         MASTER: tl.constexpr, UNSCALE: tl.constexpr, SKIP_INF: tl.constexpr):
    offs, mask = block_offsets(Blocks, FoundInf, BLOCK, USE_TABLE, SKIP_INF)
    lr = learning_rate(Lr, lr_f, LR_PTR)
    k = step_number(Step, k_host, CAPTURABLE)
    if CAPTURABLE:  # the bias corrections from the device step count (host: c1_f, bc2s_f)
        pow1, pow2, _ = beta_powers(Betas64, k, 2)
        c1 = (1.0 / (1.0 - pow1)).to(tl.float32)
        bc2s = tl.sqrt_rn((1.0 - pow2).to(tl.float32))
    else:
        c1 = c1_f
        bc2s = bc2s_f

    p = load_param(P, W, offs, mask, k == 1, MASTER)
    g = load_grad(G, offs, mask, GradScale, UNSCALE)
    m = tl.load(M + offs, mask=mask).to(tl.float32)
    v = tl.load(V + offs, mask=mask).to(tl.float32)

    p = p * (1.0 - lr * weight_decay)
    m = m + one_minus_beta1 * (g - m)
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.div_rn(tl.sqrt_rn(v), bc2s) + eps
    p = p - (lr * c1) * tl.div_rn(m, denom)

    store_param(P, W, offs, mask, p, MASTER)
    tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
    tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)


# The name flat.py launches. A kernel's function name is what profilers show: adamw_step falls in
# the optimizer category of bertaccel/measure/profiling.py ("step" fell in "other").
step = adamw_step
