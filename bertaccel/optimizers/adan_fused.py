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
whatever the parameter dtype; the state is kept in the parameter's dtype (like zeros_like(p)).

Design: flat buffers, one launch per (param group, device, dtype) "bucket"
------------------------------------------------------------------------------
A foreach implementation runs every elementwise operation of the update as its own multi-tensor
call (about 15 for Adan), each reading and writing the state again, and each multi-tensor call
is itself one or more launches. Here the update is one elementwise kernel over flat buffers:

* At the first step (and after load_state_dict, add_param_group or a parameter whose storage was
  replaced, e.g. by model.to()), each bucket allocates six flat 1-D buffers, params, grads, m, v,
  n and pre_grad, copies the parameters in and re-points ``p.data`` to views of the flat
  parameter buffer; ``self.state[p]`` holds views of the flat state buffers. apex's
  multi_tensor_apply avoids per-tensor launches with tables of tensor pointers; a flat buffer
  does it with no table at all, as DeepSpeed's contiguous buffers and apex's DistributedFusedAdam
  do. The parameter stays the same nn.Parameter object (the module, autograd, hooks and
  state_dict see nothing different), only its storage moved. Each tensor starts at a multiple
  of BLOCK elements (the padding is at most BLOCK - 1 elements per tensor, kept at zero), so a
  kernel program never straddles two tensors: one program = BLOCK elements of one parameter.
* Gradients: after a step, ``p.grad`` is a view of the flat gradient buffer. If the gradient is
  still that view at the next step (zero_grad(set_to_none=False), or the step-graph loop that
  zeroes gradients in place), the kernel reads it where backward accumulated it: no copy at all.
  With zero_grad(set_to_none=True) (torch's default) backward creates fresh gradient tensors
  (autograd steals them, no accumulate kernel), and the step copies them into the flat buffer
  with ONE torch._foreach_copy_ per bucket before the kernel: an extra read + write of the
  gradients (8 bytes per fp32 element, next to the kernel's 44) and, on CUDA, a few
  multi-tensor launches. Keeping the views is not free either: autograd then accumulates into
  them with one in-place add kernel per parameter in the backward (+ the zeroing), so which of
  the two is cheaper depends on the loop; both are exact. The flat gradient buffer costs one
  extra copy of the model's size in memory for the whole run.
* A parameter whose gradient is None at a step is skipped exactly (its blocks are left out of the
  launch through a small table of block indices, rebuilt only when the set of such parameters
  changes), so conditional branches behave as with torch's optimizers.

The kernel reads lr, the bias corrections and weight decay as scalars. Non-capturable mode
computes the bias corrections on the host in float64 (the step count is a CPU tensor). Capturable
mode (CUDA graphs) reads the step count from a device tensor, computes the bias corrections from
it inside the kernel (beta ** k by fp64 binary exponentiation of the fp64 betas) and writes k + 1
back: the last program to finish (an atomic count of finished programs, which that program resets)
writes it, after every program has read k, so the step stays one launch with no host sync. lr
may be a tensor on the parameters' device, read inside the kernel (set_lr fills it; a float lr is
frozen into a captured graph, as in torch). Capture after one eager step (it builds the buffers
and compiles the kernel), as bertaccel.train.step_graph does; zeroing every state tensor, step
included, makes the next step a first step again.

Cost: 11 fp32 words moved per element (read p, g, m, v, n, pre_grad; write p, m, v, n, pre_grad),
44 bytes, the minimum for this state; the foreach form moves several times that.

Under TRITON_INTERPRET=1 the same kernel runs on CPU tensors (that is how CI tests it); without
it, parameters must be on a CUDA device. Without Triton the constructor raises RuntimeError.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from . import adan_kernel
from .adan import check_hyperparameters

__all__ = ["AdanFused", "kernel_launches_per_step", "grad_copies_last_step", "BLOCK"]

BLOCK = 1024       # elements per kernel program; every tensor's segment starts at a multiple of it
_NUM_WARPS = 4
_STATE_KEYS = ("exp_avg", "exp_avg_diff", "exp_avg_sq", "pre_grad")  # m, v, n, pre_grad


def _check_hyperparameters(lr: Any, betas: Any, eps: Any, weight_decay: Any, capturable: Any) -> None:
    """Adan's rules (adan.check_hyperparameters) plus the capturable switch."""
    check_hyperparameters(lr, betas, eps, weight_decay, who="AdanFused")
    if not isinstance(capturable, bool):
        raise ValueError(f"AdanFused: capturable must be a bool, got {capturable!r}")


class _Stale(Exception):
    """A bucket no longer matches its parameters (storage replaced, params changed): rebuild."""


class _Bucket:
    """The flat buffers of one (param group, device, dtype): params, grads, m, v, n, pre_grad."""

    def __init__(self, params: List[torch.nn.Parameter], device: torch.device, dtype: torch.dtype):
        self.params = params
        self.device, self.dtype = device, dtype
        self.offsets: List[int] = []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += -(-p.numel() // BLOCK) * BLOCK  # segments start at multiples of BLOCK
        self.total = max(total, BLOCK)
        self.blocks_of: List[range] = [range(o // BLOCK, (o + p.numel() + BLOCK - 1) // BLOCK)
                                       for o, p in zip(self.offsets, params)]
        z = lambda: torch.zeros(self.total, device=device, dtype=dtype)  # noqa: E731
        self.p, self.g, self.m, self.v, self.n, self.pre = z(), z(), z(), z(), z(), z()
        self.pviews = [self._view(self.p, i) for i in range(len(params))]
        self.gviews = [self._view(self.g, i) for i in range(len(params))]
        self.ptrs = [t.data_ptr() for t in self.pviews]
        self.started = [False] * len(params)  # pre_grad holds a gradient of this tensor
        self.host_k = 0                       # steps this bucket took as far as the host knows
        self.step: torch.Tensor = torch.zeros(())
        self.count: Optional[torch.Tensor] = None  # capturable: programs finished (atomic)
        self.betas: Tuple[float, ...] = ()
        self.betas64: Optional[torch.Tensor] = None  # capturable: the betas in fp64, on the device
        self.table_key: Optional[Tuple[bool, ...]] = None
        self.table: Optional[torch.Tensor] = None

    def _view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        p = self.params[i]
        return flat[self.offsets[i]:self.offsets[i] + p.numel()].view(p.shape)

    def block_table(self, active: List[bool]) -> torch.Tensor:
        key = tuple(active)
        if key != self.table_key:
            idx = [b for a, r in zip(active, self.blocks_of) if a for b in r] or [-1]
            self.table = torch.tensor(idx, dtype=torch.int32, device=self.device)
            self.table_key = key
        return self.table


class AdanFused(torch.optim.Optimizer):
    """Adan, one Triton kernel launch per param group (and device/dtype) per step.

    See the module docstring for the update and the flat-buffer design.

    Args:
        params: tensors or param groups; a group may set its own lr, betas, eps, weight_decay.
        lr: learning rate (a float, or a one-element tensor on the parameters' device, read by the
            kernel: what capturable mode needs for a schedule inside a CUDA graph).
        betas: (beta1, beta2, beta3) of m, v (gradient difference) and n.
        eps: added to the bias-corrected sqrt(n), > 0.
        weight_decay: p / (1 + lr * weight_decay) after the update (official proximal form).
        capturable: the step count lives on the device and the kernel advances it, so step() does
            no host sync and can be captured in a CUDA graph (take one eager step first).
    """

    def __init__(self, params: Iterable[Any], lr: Any = 1e-3,
                 betas: Tuple[float, float, float] = (0.98, 0.92, 0.99), eps: float = 1e-8,
                 weight_decay: float = 0.0, capturable: bool = False) -> None:
        if adan_kernel.triton is None:
            error = adan_kernel.TRITON_ERROR
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise RuntimeError(f"AdanFused needs Triton, which cannot be imported here ({first}); "
                               "use Adan(foreach=True) instead")
        _check_hyperparameters(lr, betas, eps, weight_decay, capturable)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        capturable=capturable)
        super().__init__(params, defaults)
        if not torch.cuda.is_available() and not adan_kernel.interpreting():
            raise RuntimeError("AdanFused runs a Triton kernel: it needs a CUDA GPU, or TRITON_INTERPRET=1 "
                               "to run it on the CPU in Triton's interpreter (slow; for tests)")
        self._buckets: Optional[List[List[_Bucket]]] = None
        self._launches_last_step: Optional[int] = None
        self._copies_last_step = 0

    # -- bookkeeping -------------------------------------------------------------------------
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        _check_hyperparameters(g["lr"], g["betas"], g["eps"], g["weight_decay"], g["capturable"])
        self._buckets = None  # rebuilt (state kept) at the next step

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("capturable", False)
        self.__dict__.setdefault("_buckets", None)
        self.__dict__.setdefault("_launches_last_step", None)
        self.__dict__.setdefault("_copies_last_step", 0)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # torch put fresh tensors into self.state: the next step copies them into new flat buffers.
        self._buckets = None

    def _build(self) -> None:
        buckets: List[List[_Bucket]] = []
        for group in self.param_groups:
            by_key: Dict[Tuple[torch.device, torch.dtype], List[torch.nn.Parameter]] = {}
            for p in group["params"]:
                if not p.is_floating_point():
                    raise RuntimeError(f"AdanFused: parameters must be floating point, got {p.dtype}")
                by_key.setdefault((p.device, p.dtype), []).append(p)
            buckets.append([self._build_bucket(group, ps, dev, dt) for (dev, dt), ps in by_key.items()])
        self._buckets = buckets

    @torch.no_grad()
    def _build_bucket(self, group: Dict[str, Any], params: List[torch.nn.Parameter],
                      device: torch.device, dtype: torch.dtype) -> _Bucket:
        if device.type != "cuda" and not adan_kernel.interpreting():
            raise RuntimeError(f"AdanFused: parameters on {device} need TRITON_INTERPRET=1 (Triton kernels "
                               "run on CUDA devices, elsewhere only in its interpreter)")
        b = _Bucket(params, device, dtype)
        steps = []
        for i, p in enumerate(params):
            flat = slice(b.offsets[i], b.offsets[i] + p.numel())
            b.p[flat].copy_(p.detach().reshape(-1))
            st = self.state.get(p, {})
            for key, buf in zip(_STATE_KEYS, (b.m, b.v, b.n, b.pre)):
                if key in st:
                    buf[flat].copy_(st[key].detach().reshape(-1))
            b.started[i] = "pre_grad" in st
            if "step" in st:
                steps.append(float(st["step"]))  # (a host sync once, at a rebuild)
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise RuntimeError("AdanFused does not support sparse gradients")
                b.g[flat].copy_(p.grad.reshape(-1))
        k = max(steps) if steps else 0.0
        b.host_k = int(k)
        if group["capturable"]:
            b.step = torch.full((), k, dtype=torch.float32, device=device)
            b.count = torch.zeros(1, dtype=torch.int32, device=device)
            b.betas = tuple(group["betas"])
            b.betas64 = torch.tensor(b.betas, dtype=torch.float64, device=device)
        else:
            b.step = torch.full((), k, dtype=torch.float32)
        for i, p in enumerate(params):
            p.data = b.pviews[i]  # the same Parameter object, its storage now in the flat buffer
            if p.grad is not None:
                p.grad = b.gviews[i]
            self.state[p] = {"step": b.step, "exp_avg": b._view(b.m, i), "exp_avg_diff": b._view(b.v, i),
                             "exp_avg_sq": b._view(b.n, i), "pre_grad": b._view(b.pre, i)}
        return b

    # -- the step ----------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """set_to_none=True: torch's semantics (grads None; the next step copies the fresh
        gradients into the flat buffer with one foreach copy per bucket). set_to_none=False: one
        memset per bucket, gradients stay views of the flat buffer (no copy at the next step)."""
        if set_to_none or self._buckets is None:
            return super().zero_grad(set_to_none)
        others = []
        for group, buckets in zip(self.param_groups, self._buckets):
            mine = set()
            for b in buckets:
                b.g.zero_()
                mine.update(id(v) for v in b.gviews)
            others += [p.grad for p in group["params"] if p.grad is not None and id(p.grad) not in mine]
        if others:
            torch._foreach_zero_(others)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        # Refuses a graph capture of a non-capturable instance (its step count is host state).
        health_check = getattr(self, "_accelerator_graph_capture_health_check", None) or getattr(
            self, "_cuda_graph_capture_health_check", None)
        if health_check is not None:
            health_check()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        launches = copies = 0
        plans = None
        for attempt in range(2):
            if self._buckets is None:
                self._build()
            try:  # every bucket checked before any runs, so a rebuild never repeats an update
                plans = [[self._plan(b) for b in bs] if self._same_params(group, bs) else self._stale()
                         for group, bs in zip(self.param_groups, self._buckets)]
                break
            except _Stale:
                if attempt:
                    raise RuntimeError("AdanFused: parameters changed while rebuilding the flat buffers")
                self._buckets = None
        for group, bs, ps in zip(self.param_groups, self._buckets, plans):
            for b, plan in zip(bs, ps):
                n, c = self._run(group, b, *plan)
                launches += n
                copies += c
        self._launches_last_step, self._copies_last_step = launches, copies
        return loss

    @staticmethod
    def _stale() -> Any:
        raise _Stale()

    @staticmethod
    def _same_params(group: Dict[str, Any], buckets: List[_Bucket]) -> bool:
        return sum(len(b.params) for b in buckets) == len(group["params"])

    @staticmethod
    def _plan(b: _Bucket) -> Tuple[List[bool], List[int]]:
        """(active per tensor, indices of gradients that are not views of the flat buffer)."""
        active, foreign = [], []
        for i, p in enumerate(b.params):
            if p.data_ptr() != b.ptrs[i]:
                raise _Stale()  # e.g. model.to(...) replaced the storage: copy it into new buffers
            g = p.grad
            if g is None:
                active.append(False)
                continue
            active.append(True)
            if g is not b.gviews[i]:
                if g.is_sparse:
                    raise RuntimeError("AdanFused does not support sparse gradients")
                foreign.append(i)
        return active, foreign

    def _run(self, group: Dict[str, Any], b: _Bucket, active: List[bool], foreign: List[int]) -> Tuple[int, int]:
        copies = 0
        if foreign:  # fresh gradients (zero_grad(set_to_none=True)): one copy into the flat buffer
            torch._foreach_copy_([b.gviews[i] for i in foreign], [b.params[i].grad for i in foreign])
            for i in foreign:
                b.params[i].grad = b.gviews[i]
            copies += 1
        newcomers = [i for i, a in enumerate(active) if a and not b.started[i]]
        if newcomers:
            if b.host_k > 0:  # first gradient after the group's first step: pre_grad = g (diff = 0)
                torch._foreach_copy_([b._view(b.pre, i) for i in newcomers], [b.gviews[i] for i in newcomers])
                copies += 1
            for i in newcomers:
                b.started[i] = True
        capturable = group["capturable"]
        all_active = all(active)
        if not any(active) and not capturable:
            b.step += 1  # the group's step count advances with every step (official Adan)
            b.host_k += 1
            return 0, copies

        beta1, beta2, beta3 = group["betas"]
        lr = group["lr"]
        lr_ptr = isinstance(lr, torch.Tensor) and lr.device == b.device
        if isinstance(lr, torch.Tensor) and not lr_ptr:
            if capturable:
                raise RuntimeError(f"AdanFused(capturable=True): the lr tensor must be on {b.device}, "
                                   f"it is on {lr.device}")
            lr = float(lr)
        lr_t = lr if lr_ptr else b.p
        lr_f = 0.0 if lr_ptr else float(lr)
        if capturable:
            c1 = c2 = bc3s = 1.0
            first = 0
            if b.betas != tuple(group["betas"]):  # changed since the buffers were built
                b.betas = tuple(group["betas"])
                b.betas64.copy_(torch.tensor(b.betas, dtype=torch.float64))
        else:
            k = int(b.step) + 1
            c1 = 1.0 / (1.0 - beta1 ** k)
            c2 = beta2 / (1.0 - beta2 ** k)
            bc3s = math.sqrt(1.0 - beta3 ** k)
            first = int(k == 1)
        table = b.p if all_active else b.block_table(active)
        grid = (b.total // BLOCK if all_active else table.numel(),)
        adan_kernel.kernel()[grid](
            b.p, b.g, b.m, b.v, b.n, b.pre, table, b.step if capturable else b.p,
            b.count if capturable else b.p, lr_t, b.betas64 if capturable else b.p,
            lr_f, c1, c2, bc3s, first,
            float(beta1), float(beta2), float(beta3), float(group["eps"]), float(group["weight_decay"]),
            BLOCK=BLOCK, USE_TABLE=not all_active, CAPTURABLE=capturable, LR_PTR=lr_ptr,
            num_warps=_NUM_WARPS)
        if not capturable:
            b.step += 1  # CPU tensor: no device sync
        b.host_k += 1
        return 1, copies


def kernel_launches_per_step(optimizer: torch.optim.Optimizer) -> Optional[int]:
    """Triton launches of an AdanFused step: those of the last step() if one ran, else the number
    of buckets (param group x device x dtype with parameters), which is what every step with
    gradients launches. Gradient copies (zero_grad(set_to_none=True)) are not kernels of the
    optimizer's own and are reported by `grad_copies_last_step`. None for other optimizers."""
    if not isinstance(optimizer, AdanFused):
        return None
    if optimizer._launches_last_step is not None:
        return optimizer._launches_last_step
    return sum(len({(p.device, p.dtype) for p in g["params"]}) for g in optimizer.param_groups)


def grad_copies_last_step(optimizer: torch.optim.Optimizer) -> Optional[int]:
    """torch._foreach_copy_ calls the last AdanFused step made before its kernels (fresh gradients
    into the flat buffer, pre_grad of tensors seen for the first time); 0 when gradients stayed
    views. None for other optimizers."""
    return optimizer._copies_last_step if isinstance(optimizer, AdanFused) else None

