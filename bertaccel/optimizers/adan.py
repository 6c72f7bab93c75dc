"""Adan: Adaptive Nesterov Momentum (Xie et al. 2022, arXiv:2208.06677), as seed 004 uses it.

Adan replaces Nesterov momentum's look-ahead gradient ``grad L(theta - alpha*beta*m)`` by the
stored gradient difference ``g_k - g_{k-1}`` (seed 004, eqs. 2.9 -> 2.10), so it needs one
gradient per step like Adam.  It keeps three moving averages: of the gradient (m), of the
gradient difference (v) and of the squared Nesterov-corrected gradient (n), and applies a
proximal (decoupled) weight decay.

Numerics: exactly those of the authors' official PyTorch code (sail-sg/Adan, ``adan.py``:
``_single_tensor_adan`` / ``_multi_tensor_adan``), restart-free (no restart condition), with the
official defaults ``no_prox=False`` and ``max_grad_norm=0`` (no global clipping).  Per parameter,
with the step counter k starting at 1 and m, v, n starting at zero::

    diff = g_k - g_{k-1}                       (g_0 := g_1, so diff = 0 at the first step)
    m    = beta1*m + (1 - beta1)*g_k
    v    = beta2*v + (1 - beta2)*diff
    u    = g_k + beta2*diff
    n    = beta3*n + (1 - beta3)*u*u
    bias_correction1 = 1 - beta1**k ; bias_correction2 = 1 - beta2**k
    bias_correction3_sqrt = sqrt(1 - beta3**k)
    denom          = sqrt(n)/bias_correction3_sqrt + eps
    step_size      = lr / bias_correction1
    step_size_diff = lr*beta2 / bias_correction2
    theta = theta - step_size * m/denom - step_size_diff * v/denom
    theta = theta / (1 + lr*weight_decay)      (proximal weight decay; skipped when it is 0)

State per parameter: ``step`` (a float tensor), ``exp_avg`` (m), ``exp_avg_diff`` (v),
``exp_avg_sq`` (n), all in the parameter's dtype, and ``pre_grad`` (the previous gradient;
during a step it is reused in place as the scratch buffer for diff and u, as the official code
does with its ``neg_pre_grad``, so Adan needs no extra per-step full-size buffer beyond denom).

Conventions.  ``betas`` follow the official code, ``(0.98, 0.92, 0.99)`` -- the thesis' setting
(seed 004, sec. 4.1: beta1=0.98, beta2=0.92, beta3=0.99, lr=1e-4, wd=0.01).  The arXiv paper's
Algorithm 1 writes the same coefficients as ``(0.02, 0.08, 0.01)`` = ``1 - betas``.

Where the seed's text and the official code differ (the official code is followed):

* Seed eq. 2.11 is the paper's bias-free form: ``eta_k = eta/(sqrt(n_k) + eps)``,
  ``theta_{k+1} = (1 + lambda*eta)^-1 [theta_k - eta_k o (m_k + beta2*v_k)]``.  The official
  code bias-corrects m, v and n separately (``bias_correction1/2/3`` above), which is what the
  thesis ran (sec. 3.1 profiles that code; A.1 points to its repository).  Without bias
  correction the first steps would be ~50x too small for beta1=0.98.
* The seed does not say how g_{k-1} is defined at k=1; the official code sets it to g_1, so the
  first difference is 0 (v stays 0 after step 1, and u = g_1).
* The official code keeps one step counter per param group (``group['step']``); here each
  parameter has its own ``state['step']`` tensor (torch.optim convention, needed for
  ``capturable``).  The two are identical while every parameter gets a gradient at every step;
  they differ only for a parameter whose grad is None at some steps (here its bias corrections
  count its own updates, and its pre_grad starts at its first gradient).
* Not implemented: the official ``max_grad_norm`` (global clipping, off by default),
  ``no_prox=True`` (multiplicative decay before the update) and its CUDA-extension ``fused``
  kernels, and the optional restart (``restart_opt``).

Why ``foreach`` (seed 004, secs. 3.1-3.2, table 4.4).  The single-tensor loop (``foreach=False``,
the thesis' "unfused single tensor" baseline) launches about 15 elementwise kernels per
parameter tensor -- thousands per step for BERT's ~200 tensors (the thesis counted 4422 launches
per optimizer step, 3618 of them compute, with the GPU busy only 18% of the step).  The
``foreach=True`` path ("unfused multi tensor", 912 launches in the thesis) issues the same ~15
operations once per (device, dtype) group with ``torch._foreach_*``; on CUDA each is a
multi-tensor kernel that handles many tensors per launch (ATen splits a launch only when its
argument block -- a few dozen tensors -- or its grid fills), so the operation count per step is
fixed and the launch count grows only weakly with the parameter count.  The per-tensor bias
corrections go in as host scalar lists (``step`` stays on the CPU), which keeps the fast path.

``capturable=True``: ``lr`` may be a 0-dim tensor on the parameters' device, ``state['step']``
lives on that device (float32, as in torch.optim), and bias corrections/step sizes are computed
with tensor ops, so a step makes no host syncs and can be captured in a CUDA graph (change the lr
by writing into the tensor).  The per-tensor scalars are computed in float64 (float32 on MPS) and
rounded once to the parameters' dtype, like the Python floats of the host path, so with the same
lr value both paths give the same numbers.  As in ``torch.optim.Adam(capturable=True)`` those
scalars are lists of 0-dim device tensors, and ATen's foreach fast path needs equally sized
tensors in all lists, so on CUDA the three ops that apply them (``denom /= bias_correction3_sqrt``,
``m*step_size``, ``v*step_size_diff``) run per tensor; inside a CUDA graph they cost no host
launches.  With ``capturable=False`` a tensor ``lr`` is read with
``float()`` (a host sync if it lives on a GPU).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, Union, cast

import torch
from torch import Tensor
from torch.optim.optimizer import Optimizer

from bertaccel.optimizers.cost import StepCost
from torch.optim.optimizer import _get_scalar_dtype  # torch >= 2.2 (the package needs 2.5)

__all__ = ["Adan"]

LR = Union[float, Tensor]


def _real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_lr(lr: Any, who: str) -> None:
    """A one-line ValueError unless lr is a finite float >= 0 or a one-element floating-point
    tensor (capturable schedules); also AdamWFused's rule."""
    if isinstance(lr, Tensor):
        if lr.numel() != 1 or not lr.is_floating_point():
            raise ValueError(f"{who}: a tensor lr must be one floating-point element, got shape "
                             f"{tuple(lr.shape)} {lr.dtype}")
        # Its value only where reading it costs no device sync (a GPU lr is set by the schedule).
        if lr.device.type == "cpu" and not float(lr) >= 0.0:
            raise ValueError(f"{who}: lr must be >= 0, got {float(lr)!r}")
    elif not _real(lr) or lr < 0.0:
        raise ValueError(f"{who}: lr must be a finite float >= 0, got {lr!r}")


def check_hyperparameters(lr: Any, betas: Any, eps: Any, weight_decay: Any, who: str = "Adan") -> None:
    """Raise a one-line ValueError for the first invalid Adan hyper-parameter. Shared by Adan and
    AdanFused (`who` names the class in the message): one set of rules for one algorithm."""
    check_lr(lr, who)
    if not isinstance(betas, (tuple, list)) or len(betas) != 3:
        raise ValueError(f"{who}: betas must be a triple (beta1, beta2, beta3), got {betas!r}")
    for i, b in enumerate(betas):
        if not _real(b) or not 0.0 <= b < 1.0:
            raise ValueError(f"{who}: betas[{i}] must be in [0, 1), got {b!r}")
    if not _real(eps) or eps <= 0.0:
        raise ValueError(f"{who}: eps must be a finite float > 0, got {eps!r}")
    if not _real(weight_decay) or weight_decay < 0.0:
        raise ValueError(f"{who}: weight_decay must be a finite float >= 0, got {weight_decay!r}")


class Adan(Optimizer):
    """Adan (restart-free, proximal weight decay), numerically the official sail-sg/Adan code.

    Args:
        params: parameters or param-group dicts (each group may set its own lr, betas, eps,
            weight_decay, foreach, capturable).
        lr: learning rate; a 0-dim tensor is allowed (needed for a schedule inside a CUDA graph).
        betas: (beta1, beta2, beta3) for m, v, n in the official code's convention.
        eps: added to the bias-corrected sqrt(n).
        weight_decay: proximal decoupled weight decay, theta /= 1 + lr*weight_decay.
        foreach: multi-tensor ``torch._foreach_*`` implementation (default) vs a per-tensor loop.
        capturable: keep step on the device and compute with tensors only (no host syncs).
    """
    step_cost = StepCost(42, foreach_ops=15.5)  # foreach: false runs the 15.5 ops per tensor

    def __init__(
        self,
        params: Iterable[Any],
        lr: LR = 1e-3,
        betas: Tuple[float, float, float] = (0.98, 0.92, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        foreach: bool = True,
        capturable: bool = False,
    ) -> None:
        check_hyperparameters(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        foreach=foreach, capturable=capturable)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        merged = {**self.defaults, **param_group}
        check_hyperparameters(merged["lr"], merged["betas"], merged["eps"], merged["weight_decay"])
        super().add_param_group(param_group)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("foreach", True)
            group.setdefault("capturable", False)
            for p in group["params"]:
                st = self.state.get(p, {})
                if len(st) != 0 and not torch.is_tensor(st["step"]):
                    st["step"] = (
                        torch.tensor(float(st["step"]), dtype=_get_scalar_dtype(), device=p.device)
                        if group["capturable"]
                        else torch.tensor(float(st["step"]), dtype=_get_scalar_dtype())
                    )

    def _init_group(self, group: dict, params: List[Tensor], grads: List[Tensor],
                    exp_avgs: List[Tensor], exp_avg_diffs: List[Tensor], exp_avg_sqs: List[Tensor],
                    pre_grads: List[Tensor], steps: List[Tensor]) -> None:
        capturable = group["capturable"]
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Adan does not support sparse gradients")
            if torch.is_complex(p):
                raise RuntimeError("Adan does not support complex parameters")
            state = self.state[p]
            if len(state) == 0:
                state["step"] = (
                    torch.zeros((), dtype=_get_scalar_dtype(), device=p.device)
                    if capturable
                    else torch.tensor(0.0, dtype=_get_scalar_dtype())
                )
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_diff"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                # g_0 := g_1, so the first difference is exactly 0 (official code).
                state["pre_grad"] = p.grad.detach().clone(memory_format=torch.preserve_format)
            step = state["step"]
            if capturable and step.device != p.device:  # e.g. capturable switched on later
                state["step"] = step = step.to(device=p.device)
            elif not capturable and step.device.type != "cpu":
                state["step"] = step = step.cpu()  # one sync now instead of one per step
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_diffs.append(state["exp_avg_diff"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            pre_grads.append(state["pre_grad"])
            steps.append(step)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Performs a single optimization step."""
        health_check = getattr(self, "_accelerator_graph_capture_health_check", None) or getattr(
            self, "_cuda_graph_capture_health_check", None)
        if health_check is not None:
            health_check()

        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            params: List[Tensor] = []
            grads: List[Tensor] = []
            exp_avgs: List[Tensor] = []
            exp_avg_diffs: List[Tensor] = []
            exp_avg_sqs: List[Tensor] = []
            pre_grads: List[Tensor] = []
            steps: List[Tensor] = []
            self._init_group(group, params, grads, exp_avgs, exp_avg_diffs, exp_avg_sqs,
                             pre_grads, steps)
            if not params:
                continue
            beta1, beta2, beta3 = group["betas"]
            lr = group["lr"]
            if isinstance(lr, Tensor) and not group["capturable"]:
                lr = float(lr)
            impl = _multi_tensor_adan if group["foreach"] else _single_tensor_adan
            impl(params, grads, exp_avgs, exp_avg_diffs, exp_avg_sqs, pre_grads, steps,
                 beta1=beta1, beta2=beta2, beta3=beta3, lr=lr,
                 weight_decay=group["weight_decay"], eps=group["eps"],
                 capturable=group["capturable"])
        return loss


def _device_scalars(steps: List[Tensor], lr: LR, beta1: float, beta2: float, beta3: float,
                    weight_decay: float, device: torch.device, dtype: torch.dtype
                    ) -> Tuple[Tuple[Tensor, ...], Tuple[Tensor, ...], Tuple[Tensor, ...], Any]:
    """Per-tensor step_size, step_size_diff, bias_correction3_sqrt and the weight-decay divisor,
    as 0-dim tensors on `device` computed without host syncs and with a fixed number of ops.

    The arithmetic is the host path's, in float64 (float32 on MPS, which has no float64), and
    is rounded to the parameters' dtype once at the end -- as the host path's Python floats are
    when a kernel takes them as scalars -- so capturable matches non-capturable to the last bit
    or so."""
    cdtype = torch.float32 if device.type == "mps" else torch.float64
    k = torch.stack(steps).to(dtype=cdtype)
    if isinstance(lr, Tensor):
        lr = lr.to(device=device, dtype=cdtype).reshape(())
    bc1 = 1.0 - torch.pow(beta1, k)
    bc2 = 1.0 - torch.pow(beta2, k)
    bc3_sqrt = torch.sqrt(1.0 - torch.pow(beta3, k))
    step_size = (lr / bc1).to(dtype)
    step_size_diff = (lr * beta2 / bc2).to(dtype)
    wd_div: Any = 1 + lr * weight_decay
    if isinstance(wd_div, Tensor):
        wd_div = wd_div.to(dtype)
    return step_size.unbind(0), step_size_diff.unbind(0), bc3_sqrt.to(dtype).unbind(0), wd_div


def _single_tensor_adan(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor],
                        exp_avg_diffs: List[Tensor], exp_avg_sqs: List[Tensor],
                        pre_grads: List[Tensor], steps: List[Tensor], *, beta1: float,
                        beta2: float, beta3: float, lr: LR, weight_decay: float, eps: float,
                        capturable: bool) -> None:
    for param, grad, m, v, n, buf, step_t in zip(params, grads, exp_avgs, exp_avg_diffs,
                                                  exp_avg_sqs, pre_grads, steps):
        step_t += 1
        # buf: pre_grad -> pre_grad - grad = -diff (exactly -(grad - pre_grad)).
        buf.sub_(grad)
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        v.mul_(beta2).add_(buf, alpha=-(1 - beta2))   # v + (1-beta2)*diff
        buf.mul_(-beta2).add_(grad)                   # u = grad + beta2*diff
        n.mul_(beta3).addcmul_(buf, buf, value=1 - beta3)

        if capturable:
            step_size, step_size_diff, bc3_sqrt, wd_div = _device_scalars(
                [step_t], lr, beta1, beta2, beta3, weight_decay, param.device, param.dtype)
            denom = (n.sqrt() / bc3_sqrt[0]).add_(eps)
            # p - (s*m)/denom: the official addcdiv_(m, denom, value=-s), same operations.
            param.sub_((m * step_size[0]).div_(denom))
            param.sub_((v * step_size_diff[0]).div_(denom))
            if weight_decay != 0:
                param.div_(wd_div)
        else:
            k = step_t.item()
            bc1 = 1.0 - beta1 ** k
            bc2 = 1.0 - beta2 ** k
            host_bc3_sqrt = math.sqrt(1.0 - beta3 ** k)
            denom = (n.sqrt() / host_bc3_sqrt).add_(eps)
            host_step_size = lr / bc1
            host_step_size_diff = lr * beta2 / bc2
            param.addcdiv_(m, denom, value=-host_step_size)
            param.addcdiv_(v, denom, value=-host_step_size_diff)
            if weight_decay != 0:
                param.div_(1 + lr * weight_decay)
        buf.copy_(grad)


def _multi_tensor_adan(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor],
                       exp_avg_diffs: List[Tensor], exp_avg_sqs: List[Tensor],
                       pre_grads: List[Tensor], steps: List[Tensor], *, beta1: float,
                       beta2: float, beta3: float, lr: LR, weight_decay: float, eps: float,
                       capturable: bool) -> None:
    for d_params, d_grads, d_m, d_v, d_n, d_buf, d_steps in _by_device_and_dtype(
            [params, grads, exp_avgs, exp_avg_diffs, exp_avg_sqs, pre_grads, steps]):
        if not capturable and d_steps[0].is_cpu:
            # CPU steps take foreach's slow path: wrap the 1 once rather than per tensor.
            torch._foreach_add_(d_steps, torch.tensor(1.0, device="cpu"), alpha=1.0)
        else:
            torch._foreach_add_(d_steps, 1)

        torch._foreach_sub_(d_buf, d_grads)                       # -diff
        torch._foreach_mul_(d_m, beta1)
        torch._foreach_add_(d_m, d_grads, alpha=1 - beta1)        # m
        torch._foreach_mul_(d_v, beta2)
        torch._foreach_add_(d_v, d_buf, alpha=-(1 - beta2))       # v
        torch._foreach_mul_(d_buf, -beta2)
        torch._foreach_add_(d_buf, d_grads)                       # u
        torch._foreach_mul_(d_n, beta3)
        torch._foreach_addcmul_(d_n, d_buf, d_buf, value=1 - beta3)  # n

        denom = torch._foreach_sqrt(d_n)
        if capturable:
            step_size, step_size_diff, bc3_sqrt, wd_div = _device_scalars(
                d_steps, lr, beta1, beta2, beta3, weight_decay, d_params[0].device, d_params[0].dtype)
            torch._foreach_div_(denom, bc3_sqrt)
            torch._foreach_add_(denom, eps)
            upd = torch._foreach_mul(d_m, step_size)
            torch._foreach_div_(upd, denom)
            torch._foreach_sub_(d_params, upd)
            torch._foreach_copy_(upd, d_v)
            torch._foreach_mul_(upd, step_size_diff)
            torch._foreach_div_(upd, denom)
            torch._foreach_sub_(d_params, upd)
            del upd
            if weight_decay != 0:
                torch._foreach_div_(d_params, wd_div)
        else:
            ks = torch.stack(d_steps).tolist()  # CPU steps: host reads, no device sync
            torch._foreach_div_(denom, [math.sqrt(1.0 - beta3 ** k) for k in ks])
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(d_params, d_m, denom, [-(lr / (1.0 - beta1 ** k)) for k in ks])
            torch._foreach_addcdiv_(d_params, d_v, denom,
                                    [-(lr * beta2 / (1.0 - beta2 ** k)) for k in ks])
            if weight_decay != 0:
                torch._foreach_div_(d_params, 1 + lr * weight_decay)
        del denom
        torch._foreach_copy_(d_buf, d_grads)                      # pre_grad = grad


def _by_device_and_dtype(lists: List[List[Tensor]]) -> Iterator[List[List[Tensor]]]:
    """torch's grouping of parallel tensor lists by the device and dtype of the first list's
    tensors, typed for lists that hold no None: torch types its lists Optional for callers with
    missing state, and every list here is filled (a parameter without a gradient is left out of
    all of them). The group's device is its parameters' (torch's key is None while torch.compile
    traces, so it is not read)."""
    grouped = Optimizer._group_tensors_by_device_and_dtype(cast(List[List[Optional[Tensor]]], lists))
    for group, _ in grouped.values():
        yield cast(List[List[Tensor]], group)
