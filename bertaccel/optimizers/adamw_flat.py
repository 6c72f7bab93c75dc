"""AdamW with the whole step of a parameter group in ONE Triton kernel launch over flat buffers.

Numerics: torch.optim.AdamW's (decoupled weight decay p *= 1 - lr * weight_decay first, then
Adam with bias corrections, eps added outside the square root), in the order adamw_kernel.py
writes out; within fp32 rounding of torch.optim.AdamW whatever its implementation. amsgrad and
maximize are not supported. State keys are torch's, "step", "exp_avg", "exp_avg_sq" (plus
``master_param`` for a half parameter), so AdamWFused resumes from torch.optim.AdamW's state_dict
and the other way round.

One difference from torch: the step count belongs to the parameter group (flat.py's bucket), not
to each tensor. A tensor without a gradient is left alone (no update, its state untouched) as in
torch, but the group's count still advances when other tensors step, so a tensor that misses steps
and comes back (or gets its first gradient late) uses the group's bias corrections, where torch
would use its own count. The two agree whenever every tensor has a gradient at every step (a
step where no tensor of the group has one does not count, as in torch).

Design, shared with AdanFused: bertaccel/optimizers/flat.py (flat buffers, one launch per
(param group, device, dtype) bucket, gradients read in place, capturable mode for CUDA graphs,
fp32 master weights of fp16/bf16 parameters, GradScaler's fused loss scaling).

Cost: 7 words per element (read p, g, m, v; write p, m, v), 28 bytes for an fp32 parameter and 28
for a half one with its fp32 master, as torch's fused AdamW (which has no master: its fp16/bf16
parameters are updated in their own dtype).
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Tuple

from . import adamw_kernel
from .adan import _real, check_lr
from .cost import StepCost
from .flat import FlatOptimizer

__all__ = ["AdamWFused"]


class AdamWFused(FlatOptimizer):
    """torch.optim.AdamW's update, one Triton kernel launch per param group (and device/dtype).

    Args:
        params: tensors or param groups; a group may set its own lr, betas, eps, weight_decay.
        lr: learning rate (a float, or a one-element tensor on the parameters' device, read by the
            kernel: what capturable mode needs for a schedule inside a CUDA graph).
        betas: (beta1, beta2) of the first and second moment.
        eps: added to the bias-corrected sqrt of the second moment, >= 0.
        weight_decay: decoupled, p *= 1 - lr * weight_decay before the update (torch's default 0.01).
        amsgrad: only False (a ValueError otherwise; torch.optim.AdamW has it).
        capturable: the step count lives on the device and the kernel advances it, so step() does
            no host sync and can be captured in a CUDA graph (take one eager step first).

    ``master_weights = True``: fp16/bf16 parameters are updated from fp32 masters kept here.
    """
    step_cost = StepCost(7, fixed_launches=2)  # one flat kernel per parameter group (2 launches measured on an H200)

    _kernels = adamw_kernel
    _state_keys = ("exp_avg", "exp_avg_sq")  # torch.optim.AdamW's keys
    _fallback = "torch.optim.AdamW"
    _counts_empty_steps = False  # torch advances a tensor's step only when it has a gradient

    def __init__(self, params: Iterable[Any], lr: Any = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 capturable: bool = False) -> None:
        if amsgrad is not False:
            raise ValueError(f"AdamWFused: amsgrad is not supported, got amsgrad={amsgrad!r} "
                             "(torch.optim.AdamW has it)")
        super().__init__(params, dict(lr=lr, betas=tuple(betas) if isinstance(betas, (tuple, list)) else betas,
                                      eps=eps, weight_decay=weight_decay, capturable=capturable))

    def _check_group(self, group: Dict[str, Any]) -> None:
        """torch.optim.AdamW's rules, as one-line ValueErrors naming this class."""
        check_lr(group["lr"], "AdamWFused")
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"AdamWFused: betas must be a pair (beta1, beta2), got {betas!r}")
        for i, b in enumerate(betas):
            if not _real(b) or not 0.0 <= b < 1.0:
                raise ValueError(f"AdamWFused: betas[{i}] must be in [0, 1), got {b!r}")
        if not _real(group["eps"]) or group["eps"] < 0.0:
            raise ValueError(f"AdamWFused: eps must be a finite float >= 0, got {group['eps']!r}")
        if not _real(group["weight_decay"]) or group["weight_decay"] < 0.0:
            raise ValueError(f"AdamWFused: weight_decay must be a finite float >= 0, got {group['weight_decay']!r}")
        if not isinstance(group["capturable"], bool):
            raise ValueError(f"AdamWFused: capturable must be a bool, got {group['capturable']!r}")

    def _bias_corrections(self, betas: Tuple[float, ...], k: int) -> Tuple[float, ...]:
        beta1, beta2 = betas
        return 1.0 / (1.0 - beta1 ** k), math.sqrt(1.0 - beta2 ** k)

    def _hyperparameters(self, group: Dict[str, Any]) -> Tuple[float, ...]:
        beta1, beta2 = (float(b) for b in group["betas"])
        return 1.0 - beta1, beta2, 1.0 - beta2, float(group["eps"]), float(group["weight_decay"])
