"""Adan with the whole step of a parameter group in ONE Triton kernel launch.

Numerics: Adan (Xie et al. 2022, "Adan: Adaptive Nesterov Momentum Algorithm for Faster
Optimizing Deep Models"), the official sail-sg/Adan restart-free form, per element, step k
from 1, state m, v, n = 0 and pre_grad = the gradient of the parameter's first step:

    diff = g - pre_grad
    m    = b1 * m + (1 - b1) * g               (state "exp_avg")
    v    = b2 * v + (1 - b2) * diff            (state "exp_avg_diff")
    u    = g + b2 * diff
    n    = b3 * n + (1 - b3) * u * u           (state "exp_avg_sq")
    denom = sqrt(n) / sqrt(1 - b3 ** k) + eps
    p    = p - lr / (1 - b1 ** k) * m / denom - lr * b2 / (1 - b2 ** k) * v / denom
    p    = p / (1 + lr * weight_decay)         (the proximal decay of the official no_prox=False)
    pre_grad = g

As in the official implementation the step count k belongs to the parameter group (it counts
the group's steps, whatever tensors had a gradient), a parameter whose gradient is None is left
alone (no update, its state untouched), and a parameter that gets its first gradient at a later
step starts with pre_grad = g (diff = 0) and the group's bias corrections. (bertaccel's Adan keeps
a step count per tensor instead; the two agree whenever every tensor has a gradient at every
step, and AdanFused loads Adan's state_dict and vice versa: same state keys.) The math runs in fp32
whatever the parameter dtype; the state is fp32 for fp16/bf16 parameters (with an fp32 master,
below), else in the parameter's dtype.

Design: bertaccel/optimizers/flat.py (shared with AdamWFused): flat buffers, one kernel launch
per (param group, device, dtype) bucket, gradients read in place while they are views of the flat
gradient buffer, parameters without a gradient skipped, capturable mode for CUDA graphs, fp32
master weights of fp16/bf16 parameters (``master_weights = True``), GradScaler's fused loss
scaling. The kernel is adan_kernel.py.

Cost: 11 words moved per element (read p, g, m, v, n, pre_grad; write p, m, v, n, pre_grad), 44
bytes for an fp32 parameter, the minimum for this state, and 44 too for a half parameter with its
fp32 master (2-byte gradient read, 2-byte workspace write added); the foreach form moves several
times that.

Mixed precision: for a half parameter the state is fp32 like the master (so state_dict holds the
keys above plus ``master_param``). A tensor whose first gradient comes at a later step copies it
into pre_grad before the launch (unscaled with the loss scale); in capturable mode with loss
scaling, if that step is then skipped for inf/NaN gradients, pre_grad keeps that step's gradient.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from . import adan_kernel
from .adan import check_hyperparameters
from .cost import StepCost
from .flat import BLOCK, FlatOptimizer, grad_copies_last_step, kernel_launches_per_step
from .flat_buffers import Bucket

__all__ = ["AdanFused", "kernel_launches_per_step", "grad_copies_last_step", "BLOCK"]


class AdanFused(FlatOptimizer):
    """Adan, one Triton kernel launch per param group (and device/dtype) per step.

    See the module docstring for the update, flat.py for the flat-buffer design.

    Args:
        params: tensors or param groups; a group may set its own lr, betas, eps, weight_decay.
        lr: learning rate (a float, or a one-element tensor on the parameters' device, read by the
            kernel: what capturable mode needs for a schedule inside a CUDA graph).
        betas: (beta1, beta2, beta3) of m, v (gradient difference) and n.
        eps: added to the bias-corrected sqrt(n), > 0.
        weight_decay: p / (1 + lr * weight_decay) after the update (official proximal form).
        capturable: the step count lives on the device and the kernel advances it, so step() does
            no host sync and can be captured in a CUDA graph (take one eager step first).

    ``master_weights = True``: fp16/bf16 parameters are updated from fp32 masters kept here.
    """
    step_cost = StepCost(11, fixed_launches=2)  # one flat kernel per parameter group

    _kernels = adan_kernel
    _state_keys = ("exp_avg", "exp_avg_diff", "exp_avg_sq", "pre_grad")  # m, v, n, pre_grad (Adan's keys)
    _fallback = "Adan(foreach=True)"
    _counts_empty_steps = True  # official Adan: the group's step count advances with every step

    def __init__(self, params: Iterable[Any], lr: Any = 1e-3,
                 betas: Tuple[float, float, float] = (0.98, 0.92, 0.99), eps: float = 1e-8,
                 weight_decay: float = 0.0, capturable: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas) if isinstance(betas, (tuple, list)) else betas,
                                      eps=eps, weight_decay=weight_decay, capturable=capturable))

    def _check_group(self, group: Dict[str, Any]) -> None:
        """Adan's rules (adan.check_hyperparameters) plus the capturable switch."""
        check_hyperparameters(group["lr"], group["betas"], group["eps"], group["weight_decay"], who="AdanFused")
        if not isinstance(group["capturable"], bool):
            raise ValueError(f"AdanFused: capturable must be a bool, got {group['capturable']!r}")

    def _bias_corrections(self, betas: Tuple[float, ...], k: int) -> Tuple[float, ...]:
        beta1, beta2, beta3 = betas
        return 1.0 / (1.0 - beta1 ** k), beta2 / (1.0 - beta2 ** k), math.sqrt(1.0 - beta3 ** k)

    def _hyperparameters(self, group: Dict[str, Any]) -> Tuple[float, ...]:
        betas = [float(b) for b in group["betas"]]
        return (*betas, *(1.0 - b for b in betas), float(group["eps"]), float(group["weight_decay"]))

    def _prepare(self, b: Bucket, newcomers: List[int], grad_scale: Optional[torch.Tensor]) -> int:
        if b.host_k == 0:
            return 0  # the group's first step: the kernel sets diff = 0 itself
        # First gradient after the group's first step: pre_grad = g (diff = 0), unscaled as the
        # kernel unscales g.
        pre = [b.view(b.state["pre_grad"], i) for i in newcomers]
        torch._foreach_copy_(pre, [b.gviews[i] for i in newcomers])
        if grad_scale is not None:
            torch._foreach_mul_(pre, grad_scale.double().reciprocal().float())
        return 1
