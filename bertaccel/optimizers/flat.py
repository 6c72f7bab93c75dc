"""Flat-buffer optimizers: a group's whole update in ONE Triton launch (capturable: + its step count's).

This module is the machinery AdanFused (adan_fused.py) and AdamWFused (adamw_flat.py) share;
each of them adds its hyper-parameter rules, its state tensors and its kernel (adan_kernel.py,
adamw_kernel.py; their common device code is flat_kernel.py).

Flat buffers, one launch per (param group, device, dtype) "bucket"
-----------------------------------------------------------------
A foreach implementation runs every elementwise operation of the update as its own multi-tensor
call (about 15 for Adan), each reading and writing the state again, and each multi-tensor call
is itself one or more launches. Here the update is one elementwise kernel over flat buffers:

* At the first step (and after load_state_dict, add_param_group or a parameter whose storage was
  replaced, e.g. by model.to()), each bucket is built: flat buffers of the parameters, their
  gradients and the state, the parameters re-pointed to views of them (flat_buffers.py: the
  layout, BLOCK). apex's multi_tensor_apply avoids per-tensor launches with tables of tensor
  pointers; a flat buffer does it with no table at all, as DeepSpeed's contiguous buffers and
  apex's DistributedFusedAdam do.
* Gradients: after a step, ``p.grad`` is a view of the flat gradient buffer. If the gradient is
  still that view at the next step (zero_grad(set_to_none=False), or the step-graph loop that
  zeroes gradients in place), the kernel reads it where backward accumulated it: no copy at all.
  With zero_grad(set_to_none=True) (torch's default) backward creates fresh gradient tensors
  (autograd steals them, no accumulate kernel), and the step copies them into the flat buffer
  with ONE torch._foreach_copy_ per bucket before the kernel: an extra read + write of the
  gradients and, on CUDA, a few multi-tensor launches. Keeping the views is not free either:
  autograd then accumulates into them with one in-place add kernel per parameter in the backward
  (+ the zeroing), so which of the two is cheaper depends on the loop; both are exact. The flat
  gradient buffer costs one extra copy of the gradients in memory for the whole run.
* A parameter whose gradient is None at a step is skipped exactly (its blocks are left out of the
  launch through a small table of block indices, rebuilt only when the set of such parameters
  changes), so conditional branches behave as with torch's optimizers.
* The step count belongs to the bucket (it counts the group's steps): every tensor of a group uses
  the same bias corrections. The optimizers say what that means for a tensor that misses steps.

Mixed precision: fp32 master weights in the optimizer (``master_weights = True``)
---------------------------------------------------------------------------------
A bucket of fp16 or bf16 parameters keeps an fp32 flat MASTER copy of them and fp32 state; the
parameters' ``p.data`` are views of a flat half "workspace" buffer, which is what the model
computes with, and their gradients are half (a flat half gradient buffer, same view rules as
above). The kernel reads the half gradient and the fp32 master, converts the gradient to fp32,
updates master and state in fp32, and writes the fp32 master and its half rounding
(round-to-nearest-even, as Tensor.to) into the workspace in the same pass: one launch, no cast
kernel, no fp32 weight copy on the model's side (LightSeq's mixed-precision update). So a model
whose parameters were cast to half trains with fp32 updates: tiny updates accumulate in the master
instead of rounding away in a bf16 weight. fp32 parameters have no master (no extra buffer).
The master is the truth: a write into a half parameter (p.copy_) does not reach it, except at a
first step (step count 0), where the kernel reseeds the master from the workspace, so zeroing the
state (as the step-graph capture does, after putting the weights back) restarts from the weights
the parameters hold. The kernel moves as many bytes per element as for an fp32 parameter: the
half gradient read is 2 bytes narrower, the workspace write 2 bytes more.

state_dict keys: the algorithm's own (the same as the torch or bertaccel optimizer of that
algorithm, so either can resume from the other), plus ``master_param`` (fp32, shaped like the
parameter) for a half parameter. torch's load_state_dict casts floating state to the parameter's
dtype; load_state_dict here keeps the saved fp32 values instead, so a resumed run loses nothing.
A loaded master is used only if the parameter still equals it rounded to the parameter's dtype
(the model was loaded from the same checkpoint); otherwise the master restarts from the
parameter. Each parameter's entry gets its own "step" tensor (a bucket shares one, and torch's
optimizers advance each parameter's step in place).

Loss scaling (fp16): ``_step_supports_amp_scaling = True``
---------------------------------------------------------
torch.amp.GradScaler.step then calls step() with ``self.grad_scale`` (the scale, a device tensor)
and ``self.found_inf`` set (after its own inf/NaN check of the gradients, which allows fp16
ones). The kernel multiplies the gradients by 1/scale while it reads them (no unscale pass). A
found inf/NaN skips the step: capturable, on the device (no element read or written, the step
count left as it was); otherwise the host reads found_inf once (the one sync GradScaler's usual
path makes too) and launches nothing. After an explicit scaler.unscale_ (for clipping) there is
no scale left to apply and only found_inf is used.

Clipping with fp16 parameters does not work as torch's recipe writes it: GradScaler.unscale_
refuses fp16 gradients (ValueError "Attempting to unscale FP16 gradients.") whatever the
optimizer, so scaler.unscale_ -> clip_grad_norm_ -> scaler.step stops at unscale_. Clipping the
still-scaled fp16 gradients (max_norm times the scale) is unsafe too: clip_grad_norm_ returns
the norm in the gradients' dtype, a scaled fp16 norm overflows to inf at the usual scales (2**16
and up), every gradient is then multiplied by 0, and the scaler's inf check, which runs after,
sees zeros: the step silently applies a zero gradient. bf16 needs no loss scaling (unscale_ is a
no-op with the scaler disabled; clipping bf16 gradients works, the norm rounded to bf16); fp32
parameters under fp16 autocast unscale and clip as before.

Capturable mode (CUDA graphs)
-----------------------------
Non-capturable mode computes the bias corrections on the host in float64 (the step count is a
CPU tensor). Capturable mode reads the step count from a device tensor, computes the bias
corrections from it inside the kernel (beta ** k by fp64 binary exponentiation of the fp64 betas);
a one-program launch after it advances the count (flat_kernel.optimizer_advance_step; stream order:
after every program has read it): two launches, no host sync; a step without gradients, at most
the second. lr may be a tensor on the parameters' device, read inside the kernel (set_lr fills it;
a float lr is frozen into a captured graph, as in torch). Capture after one eager step (it
builds the buffers and compiles the kernel), as bertaccel.train.step_graph does; zeroing every
state tensor, step included, makes the next step a first step again.

Under TRITON_INTERPRET=1 the same kernels run on CPU tensors (that is how CI tests them);
without it, parameters must be on a CUDA device. Without Triton the constructors raise
RuntimeError (bertaccel.options.optimizer reads that as "not on this machine").
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple, cast, overload

import torch

from . import flat_kernel
from .flat_buffers import BLOCK, MASTER_DTYPES, MASTER_KEY, Bucket, Stale, build_bucket

__all__ = ["FlatOptimizer", "kernel_launches_per_step", "grad_copies_last_step", "BLOCK", "MASTER_KEY",
           "MASTER_DTYPES"]

_NUM_WARPS = 4


class FlatOptimizer(torch.optim.Optimizer):
    """Base class of the flat-buffer, one-launch optimizers (see the module docstring).

    A subclass sets the class attributes below and implements `_check_group` (one-line
    ValueErrors), `_bias_corrections` (the host's, fp64) and `_hyperparameters` (the floats its
    kernel takes after them); `_prepare` if its state needs work before a tensor's first step.
    Its kernel takes (P, W, G, *state buffers in `_state_keys` order, Blocks, Step, Lr,
    Betas64, GradScale, FoundInf, lr_f, k_host, *bias corrections, *hyper-parameters) and the
    constexprs BLOCK, USE_TABLE, CAPTURABLE, LR_PTR, MASTER, UNSCALE, SKIP_INF.
    """

    #: The optimizer keeps fp32 master weights (and fp32 state) of fp16/bf16 parameters and updates
    #: the half parameters from them: training code may cast the model's parameters to half.
    master_weights = True
    # (each subclass declares its step_cost: optimizers/cost.py, read by the plan's roofline)
    # torch.amp.GradScaler.step hands this optimizer the scale and found_inf (see the module docstring).
    _step_supports_amp_scaling = True

    _kernels: ModuleType           # the kernel's module: `step`, and `triton`/`TRITON_ERROR`
    _state_keys: Tuple[str, ...]   # state tensors, one flat buffer each, in the kernel's order
    _fallback: str                 # the optimizer to name where Triton cannot run
    _counts_empty_steps: bool      # a step where no tensor of the group has a gradient still counts

    def __init__(self, params: Iterable[Any], defaults: Dict[str, Any]) -> None:
        name = type(self).__name__
        if self._kernels.triton is None:
            error = self._kernels.TRITON_ERROR
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise RuntimeError(f"{name} needs Triton, which cannot be imported here ({first}); "
                               f"use {self._fallback} instead")
        self._check_group(defaults)
        super().__init__(params, defaults)
        if not torch.cuda.is_available() and not flat_kernel.interpreting():
            raise RuntimeError(f"{name} runs a Triton kernel: it needs a CUDA GPU, or TRITON_INTERPRET=1 "
                               "to run it on the CPU in Triton's interpreter (slow; for tests)")
        self._buckets: Optional[List[List[Bucket]]] = None
        self._launches_last_step: Optional[int] = None
        self._copies_last_step = 0

    # -- what a subclass provides --------------------------------------------------------------
    def _check_group(self, group: Dict[str, Any]) -> None:
        raise NotImplementedError

    def _bias_corrections(self, betas: Tuple[float, ...], k: int) -> Tuple[float, ...]:
        raise NotImplementedError

    def _hyperparameters(self, group: Dict[str, Any]) -> Tuple[float, ...]:
        raise NotImplementedError

    def _prepare(self, b: Bucket, newcomers: List[int], grad_scale: Optional[torch.Tensor]) -> int:
        """Work before the kernel for tensors taking their first step (`newcomers`); returns the
        number of gradient copies made."""
        return 0

    # -- bookkeeping -------------------------------------------------------------------------
    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._check_group(self.param_groups[-1])
        self._buckets = None  # rebuilt (state kept) at the next step

    def __setstate__(self, state: Dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("capturable", False)
        self.__dict__.setdefault("_buckets", None)
        self.__dict__.setdefault("_launches_last_step", None)
        self.__dict__.setdefault("_copies_last_step", 0)

    def state_dict(self) -> Dict[str, Any]:
        sd = super().state_dict()
        # The bucket's one step tensor, once per parameter: torch's optimizers (and Adan) loading this
        # would otherwise advance the same tensor once per parameter.
        sd["state"] = {k: {**st, "step": st["step"].clone()} if isinstance(st.get("step"), torch.Tensor) else st
                       for k, st in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # torch cast every floating state tensor to its parameter's dtype: a half parameter's fp32
        # master and state would come back rounded to half. Keep the saved tensors instead (the
        # next step copies them into its fp32 flat buffers; they are only read).
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            for key, value in state_dict["state"].get(i, {}).items():
                if (key != "step" and isinstance(value, torch.Tensor) and value.is_floating_point()
                        and value.dtype != p.dtype):
                    self.state[p][key] = value.to(device=p.device)
        # torch put fresh tensors into self.state: the next step copies them into new flat buffers.
        self._buckets = None

    def _build(self) -> List[List[Bucket]]:
        buckets: List[List[Bucket]] = []
        for group in self.param_groups:
            by_key: Dict[Tuple[torch.device, torch.dtype], List[torch.nn.Parameter]] = {}
            for p in group["params"]:
                if not p.is_floating_point():
                    raise RuntimeError(f"{type(self).__name__}: parameters must be floating point, got {p.dtype}")
                by_key.setdefault((p.device, p.dtype), []).append(p)
            buckets.append([self._build_bucket(group, ps, dev, dt) for (dev, dt), ps in by_key.items()])
        self._buckets = buckets
        return buckets

    def _build_bucket(self, group: Dict[str, Any], params: List[torch.nn.Parameter],
                      device: torch.device, dtype: torch.dtype) -> Bucket:
        name = type(self).__name__
        if device.type != "cuda" and not flat_kernel.interpreting():
            raise RuntimeError(f"{name}: parameters on {device} need TRITON_INTERPRET=1 (Triton kernels "
                               "run on CUDA devices, elsewhere only in its interpreter)")
        return build_bucket(params, device, dtype, self._state_keys, self.state, group, name)

    # -- the step ----------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """set_to_none=True: torch's semantics (grads None; the next step copies the fresh
        gradients into the flat buffer with one foreach copy per bucket). set_to_none=False: one
        memset per bucket, gradients stay views of the flat buffer (no copy at the next step)."""
        if set_to_none or self._buckets is None:
            return super().zero_grad(set_to_none)
        others = []
        for group, buckets in zip(self.param_groups, self._buckets):
            mine: Set[int] = set()
            for b in buckets:
                b.g.zero_()
                mine.update(id(v) for v in b.gviews)
            others += [p.grad for p in group["params"] if p.grad is not None and id(p.grad) not in mine]
        if others:
            torch._foreach_zero_(others)

    # torch's Optimizer.step is overloaded: no closure, no loss; a closure, its loss.
    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

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
        plans: List[List[Tuple[List[bool], List[int]]]] = []
        buckets: List[List[Bucket]] = []
        for attempt in range(2):
            buckets = self._build() if self._buckets is None else self._buckets
            try:  # every bucket checked before any runs, so a rebuild never repeats an update
                plans = [[self._plan(b) for b in bs] if self._same_params(group, bs) else self._stale()
                         for group, bs in zip(self.param_groups, buckets)]
                break
            except Stale:
                if attempt:
                    raise RuntimeError(f"{type(self).__name__}: parameters changed while rebuilding the flat buffers")
                self._buckets = None
        # Set by torch.amp.GradScaler.step for this call (_step_supports_amp_scaling).
        grad_scale: Optional[torch.Tensor] = getattr(self, "grad_scale", None)
        found_inf: Optional[torch.Tensor] = getattr(self, "found_inf", None)
        skip = False
        if found_inf is not None and not all(g["capturable"] for g in self.param_groups):
            # The host keeps a non-capturable step count, so it must know whether this step is
            # skipped: one sync, as GradScaler's own path makes for other optimizers.
            skip = bool(found_inf.item())
        launches = copies = 0
        for group, bs, ps in zip(self.param_groups, buckets, plans):
            if skip and not group["capturable"]:
                continue
            for b, plan in zip(bs, ps):
                n, c = self._run(group, b, *plan, grad_scale, found_inf if group["capturable"] else None)
                launches += n
                copies += c
        self._launches_last_step, self._copies_last_step = launches, copies
        return loss

    @staticmethod
    def _stale() -> Any:
        raise Stale()

    @staticmethod
    def _same_params(group: Dict[str, Any], buckets: List[Bucket]) -> bool:
        return sum(len(b.params) for b in buckets) == len(group["params"])

    def _plan(self, b: Bucket) -> Tuple[List[bool], List[int]]:
        """(active per tensor, indices of gradients that are not views of the flat buffer)."""
        active, foreign = [], []
        for i, p in enumerate(b.params):
            if p.data_ptr() != b.ptrs[i]:
                raise Stale()  # e.g. model.to(...) replaced the storage: copy it into new buffers
            g = p.grad
            if g is None:
                active.append(False)
                continue
            active.append(True)
            if g is not b.gviews[i]:
                if g.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                foreign.append(i)
        return active, foreign

    @staticmethod
    def _on(b: Bucket, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t.to(b.device, non_blocking=True)

    def _run(self, group: Dict[str, Any], b: Bucket, active: List[bool], foreign: List[int],
             grad_scale: Optional[torch.Tensor], found_inf: Optional[torch.Tensor]) -> Tuple[int, int]:
        copies = 0
        if foreign:  # fresh gradients (zero_grad(set_to_none=True)): one copy into the flat buffer
            # (foreign lists the parameters whose gradient _plan saw set: none is None)
            torch._foreach_copy_([b.gviews[i] for i in foreign], cast(List[torch.Tensor], [b.params[i].grad for i in foreign]))
            for i in foreign:
                b.params[i].grad = b.gviews[i]
            copies += 1
        grad_scale, found_inf = self._on(b, grad_scale), self._on(b, found_inf)
        newcomers = [i for i, a in enumerate(active) if a and not b.started[i]]
        if newcomers:
            copies += self._prepare(b, newcomers, grad_scale)
            for i in newcomers:
                b.started[i] = True
        capturable = group["capturable"]
        all_active = all(active)
        if not any(active) and not (capturable and self._counts_empty_steps):
            if self._counts_empty_steps:
                b.step += 1  # CPU tensor: no device sync
                b.host_k += 1
            return 0, copies

        lr = group["lr"]
        lr_ptr = isinstance(lr, torch.Tensor) and lr.device == b.device
        if isinstance(lr, torch.Tensor) and not lr_ptr:
            if capturable:
                raise RuntimeError(f"{type(self).__name__}(capturable=True): the lr tensor must be on "
                                   f"{b.device}, it is on {lr.device}")
            lr = float(lr)
        if capturable:
            if b.betas != tuple(group["betas"]):  # changed since the buffers were built
                b.betas = tuple(group["betas"])
                assert b.betas64 is not None  # build_bucket made it: the group was capturable then
                b.betas64.copy_(torch.tensor(b.betas, dtype=torch.float64))
            k = b.host_k + 1  # (the kernel reads its k from b.step; this only fills the host arguments)
        else:
            k = int(b.step) + 1
        unused = b.p  # a pointer argument the compiled variant never reads
        launches = 0
        if any(active):
            table = b.p if all_active else b.block_table(active)
            grid = (b.total // BLOCK if all_active else table.numel(),)
            self._kernels.step[grid](
                b.p if b.master is None else b.master, b.p, b.g, *[b.state[key] for key in self._state_keys],
                table, b.step if capturable else unused,
                lr if lr_ptr else unused, b.betas64 if capturable else unused,
                unused if grad_scale is None else grad_scale, unused if found_inf is None else found_inf,
                0.0 if lr_ptr else float(lr), k, *self._bias_corrections(tuple(group["betas"]), k),
                *self._hyperparameters(group),
                BLOCK=BLOCK, USE_TABLE=not all_active, CAPTURABLE=capturable, LR_PTR=lr_ptr,
                MASTER=b.master is not None, UNSCALE=grad_scale is not None, SKIP_INF=found_inf is not None,
                num_warps=_NUM_WARPS)
            launches += 1
        if capturable:
            flat_kernel.optimizer_advance_step[(1,)](b.step, unused if found_inf is None else found_inf,
                                                     SKIP_INF=found_inf is not None)
            launches += 1
        else:
            b.step += 1  # CPU tensor: no device sync
        b.host_k += 1
        return launches, copies


def kernel_launches_per_step(optimizer: torch.optim.Optimizer) -> Optional[int]:
    """Triton launches of a flat-buffer optimizer's step: those of the last step() if one ran,
    else what every step with gradients launches: one per bucket (param group x device x dtype
    with parameters), two in a capturable group (the update, then the step count's advance).
    Gradient copies (zero_grad(set_to_none=True)) are reported by `grad_copies_last_step`. None for other optimizers."""
    if not isinstance(optimizer, FlatOptimizer):
        return None
    if optimizer._launches_last_step is not None:
        return optimizer._launches_last_step
    return sum(len({(p.device, p.dtype) for p in g["params"]}) * (2 if g["capturable"] else 1)
               for g in optimizer.param_groups)


def grad_copies_last_step(optimizer: torch.optim.Optimizer) -> Optional[int]:
    """torch._foreach_copy_ calls the last flat-buffer step made before its kernels (fresh
    gradients into the flat buffer, Adan's pre_grad of tensors seen for the first time); 0 when
    gradients stayed views. None for other optimizers."""
    return optimizer._copies_last_step if isinstance(optimizer, FlatOptimizer) else None
