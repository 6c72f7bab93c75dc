"""LAMB: Adam's update, rescaled per layer by a trust ratio (You et al. 2019, Algorithm 2).

"Large Batch Optimization for Deep Learning: Training BERT in 76 minutes" (arXiv:1904.00962)
takes Adam's direction and, for every layer separately, sets the step's length by the ratio
of the layer's weight norm to the norm of its update. A "layer" here is one parameter tensor
(a weight matrix, a bias, a LayerNorm gain), as in the reference implementations. For the
parameters x of one tensor, its gradient g and the step count k (1 at the first step):

    m      = beta1 * m + (1 - beta1) * g
    v      = beta2 * v + (1 - beta2) * g * g
    m_hat  = m / (1 - beta1 ** k)                  (bias correction; bias_correction=False
    v_hat  = v / (1 - beta2 ** k)                   uses m and v themselves)
    r      = m_hat / (sqrt(v_hat) + eps) + weight_decay * x
    trust  = phi(||x||) / ||r||   if ||x|| > 0 and ||r|| > 0, else 1
    x      = x - lr * trust * r

Why per layer: one global learning rate fits the layers badly when the ratio ||x|| / ||update||
differs by orders of magnitude between them, and large batches (large learning rates) make the
worst layer diverge first. Normalising each tensor's update to a length of lr * phi(||x||)
makes every layer move by the same relative amount, lr, whatever its gradients' scale; Adam's
per-element normalisation stays inside r. The norm of r includes the decay term: a group with
weight_decay=0 (BERT's biases and LayerNorm weights) gets its trust ratio from the bare Adam
direction. A tensor of zeros (or a zero update) gets trust 1, i.e. a plain Adam step.

Decisions (documented, not configurable, to keep the signature the study's):
  * phi is the identity. The paper defines phi(z) = min(max(z, gamma_l), gamma_u) and proves
    its bounds with it; the implementations used for BERT (TensorFlow's LAMB, NVIDIA Apex's
    FusedLAMB) use the identity with the "both norms > 0, else 1" rule, and so does this one.
    Some PyTorch ports clamp ||x|| to [0, 10]; that is not done here.
  * Bias correction is on by default, as in the paper's Algorithm 2; bias_correction=False
    drops it (Apex's FusedLAMB has the same switch).
  * No global gradient-norm pre-normalisation. NVIDIA Apex's LAMB (seed 003's reference [62],
    whose LAMBStage1/LAMBStage2 kernels the seed profiles) first divides all gradients by
    their global L2 norm when it exceeds max_grad_norm, which is why the seed notes that LAMB
    "must perform the L2 Norm (reduction) across all the model's gradients before it can
    update any parameter". That is gradient clipping, not part of Algorithm 2: call
    torch.nn.utils.clip_grad_norm_ before step() to get it.
  * eps must be > 0: an element whose gradient has always been zero (a padding token's
    embedding row) would otherwise give 0 / 0.

Seed 003 (section 2.4, 3.2.3, takeaway 7) observes that LAMB runs independently for every layer
with no data reuse between layers, reads about 4x the model's size (weights, gradients, m, v)
and does few element-wise operations on it: it is memory-bound, 7-25% of a BERT pre-training
step, and does not speed up in mixed precision since the update stays in FP32. So its cost is
bytes moved and kernel launches, not arithmetic. foreach=True runs each of the update's
operations as one torch._foreach_* call over all tensors of a (device, dtype) bucket, the
per-tensor norms with torch._foreach_norm and the trust ratios as one vector, so the number of
launches does not grow with the tensor count as the per-tensor loop's (foreach=False, about 20
ATen calls per tensor) does. (On CUDA one multi-tensor launch takes some tens of tensors and
some millions of elements, so a call over a large model is a few launches, growing in steps of
tens of tensors, not per tensor.) The price: the trust ratios are copied to the host once per
step and device (see _apply_foreach), a synchronisation the loop does not need.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union, overload

import torch

from bertaccel.optimizers.cost import StepCost

# A foreach op's list of tensors: ATen returns a list, torch's stubs type the result a tuple.
TensorList = Union[List[torch.Tensor], Tuple[torch.Tensor, ...]]

__all__ = ["Lamb"]


def _check_hyperparameters(lr: Any, betas: Any, eps: Any, weight_decay: Any,
                           bias_correction: Any, foreach: Any) -> None:
    """Raise a one-line ValueError for the first invalid hyper-parameter."""
    def real(x: Any) -> bool:
        return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)

    if not real(lr) or lr < 0.0:
        raise ValueError(f"Lamb: lr must be a finite float >= 0, got {lr!r}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"Lamb: betas must be a pair (beta1, beta2), got {betas!r}")
    for i, b in enumerate(betas):
        if not real(b) or not 0.0 <= b < 1.0:
            raise ValueError(f"Lamb: betas[{i}] must be in [0, 1), got {b!r}")
    if not real(eps) or eps <= 0.0:
        raise ValueError(f"Lamb: eps must be a finite float > 0, got {eps!r}")
    if not real(weight_decay) or weight_decay < 0.0:
        raise ValueError(f"Lamb: weight_decay must be a finite float >= 0, got {weight_decay!r}")
    if not isinstance(bias_correction, bool):
        raise ValueError(f"Lamb: bias_correction must be a bool, got {bias_correction!r}")
    if not isinstance(foreach, bool):
        raise ValueError(f"Lamb: foreach must be a bool, got {foreach!r}")


class Lamb(torch.optim.Optimizer):
    """LAMB with a per-tensor trust ratio; see the module docstring for the update.

    Args:
        params: tensors or param groups; a group may set its own lr, betas, eps, weight_decay,
            bias_correction and foreach (BERT: weight_decay=0 for biases and LayerNorm weights).
        lr: learning rate; with the trust ratio it is the relative step length ||dx|| / ||x||.
        betas: decay rates of the first and second moment estimates.
        eps: added to sqrt(v_hat), > 0.
        weight_decay: lambda of the decoupled decay term added to r before the trust ratio.
        bias_correction: divide m and v by (1 - beta ** k).
        foreach: multi-tensor torch._foreach_* kernels (True) or a loop over tensors (False).
    """
    step_cost = StepCost(24, foreach_ops=11.5, fixed_launches=15)  # + the trust ratios' small ops

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True,
                 foreach: bool = True) -> None:
        _check_hyperparameters(lr, betas, eps, weight_decay, bias_correction, foreach)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, foreach=foreach)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        try:
            _check_hyperparameters(g["lr"], g["betas"], g["eps"], g["weight_decay"], g["bias_correction"],
                                   g["foreach"])
        except ValueError:
            self.param_groups.pop()  # leave the optimizer as it was
            raise

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("bias_correction", True)
            group.setdefault("foreach", True)

    # torch's Optimizer.step is overloaded: no closure, no loss; a closure, its loss.
    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # foreach groups: every bucket's direction r and trust ratios first, then one copy of all
        # trust ratios to the host per device, then the updates (see _apply_foreach).
        pending: List[Tuple[List[torch.Tensor], TensorList, torch.Tensor, float]] = []
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if not params:
                continue
            beta1, beta2 = group["betas"]
            kw = dict(beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
                      bias_correction=group["bias_correction"])
            if group["foreach"]:
                # foreach ops need one device and dtype per call.
                buckets: Dict[Tuple[torch.device, torch.dtype], List[int]] = {}
                for i, p in enumerate(params):
                    buckets.setdefault((p.device, p.dtype), []).append(i)
                for idx in buckets.values():
                    bucket = [params[i] for i in idx]
                    r, trust = _foreach_direction(bucket, [grads[i] for i in idx], [exp_avgs[i] for i in idx],
                                                  [exp_avg_sqs[i] for i in idx], [steps[i] for i in idx], **kw)
                    pending.append((bucket, r, trust, group["lr"]))
            else:
                _lamb_loop(params, grads, exp_avgs, exp_avg_sqs, steps, lr=group["lr"], **kw)
        _apply_foreach(pending)
        return loss


def _lamb_loop(params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
               exp_avg_sqs: List[torch.Tensor], steps: List[int], *, lr: float, beta1: float, beta2: float,
               eps: float, weight_decay: float, bias_correction: bool) -> None:
    """One tensor at a time: about 20 ATen calls (kernels on a GPU) per tensor."""
    for p, g, m, v, k in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        m.lerp_(g, 1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        denom = v.sqrt()
        if bias_correction:
            denom.div_(math.sqrt(1.0 - beta2 ** k))
        denom.add_(eps)
        r = torch.div(m, denom)
        if bias_correction:
            r.div_(1.0 - beta1 ** k)
        if weight_decay != 0.0:
            r.add_(p, alpha=weight_decay)
        w_norm = torch.linalg.vector_norm(p)
        r_norm = torch.linalg.vector_norm(r)
        # phi = identity; stays on the device (no host sync).
        trust = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, torch.ones_like(w_norm))
        r.mul_(trust * -lr)
        p.add_(r)


def _foreach_direction(params: List[torch.Tensor], grads: List[torch.Tensor], exp_avgs: List[torch.Tensor],
                       exp_avg_sqs: List[torch.Tensor], steps: List[int], *, beta1: float, beta2: float,
                       eps: float, weight_decay: float,
                       bias_correction: bool) -> Tuple[TensorList, torch.Tensor]:
    """Moments, r and the trust ratios of one device-and-dtype bucket, in multi-tensor calls."""
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sqs)
    if bias_correction:
        # Steps may differ between tensors (one that had no grad for a while): a scalar per tensor.
        torch._foreach_div_(denom, [math.sqrt(1.0 - beta2 ** k) for k in steps])
    torch._foreach_add_(denom, eps)
    r = torch._foreach_div(exp_avgs, denom)
    del denom
    if bias_correction:
        torch._foreach_div_(r, [1.0 - beta1 ** k for k in steps])
    if weight_decay != 0.0:
        torch._foreach_add_(r, params, alpha=weight_decay)
    w_norm = torch.stack(torch._foreach_norm(params))
    r_norm = torch.stack(torch._foreach_norm(r))
    # phi = identity; the bucket's trust ratios as one vector.
    trust = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, torch.ones_like(w_norm))
    return r, trust


def _apply_foreach(pending: List[Tuple[List[torch.Tensor], TensorList, torch.Tensor, float]]) -> None:
    """x -= lr * trust * r for every bucket.

    A multi-tensor call takes its per-tensor factors as host scalars: a list of 0-d device
    tensors against tensors of other shapes makes torch._foreach_mul_ fall back to one kernel
    per tensor on CUDA. So the trust ratios of all buckets on a device come to the host in one
    copy (one synchronisation per step and device, which also makes this path unfit for CUDA
    graph capture); the per-tensor loop (foreach=False) keeps them on the device instead.
    """
    by_device: Dict[torch.device, List[int]] = {}
    for i, (_, _, trust, _) in enumerate(pending):
        by_device.setdefault(trust.device, []).append(i)
    for idx in by_device.values():
        # cat promotes to the widest dtype, so float64 buckets keep their precision.
        host = torch.cat([pending[i][2] for i in idx]).tolist()
        start = 0
        for i in idx:
            params, r, _, lr = pending[i]
            torch._foreach_mul_(r, [-lr * t for t in host[start:start + len(params)]])
            torch._foreach_add_(params, r)
            start += len(params)
