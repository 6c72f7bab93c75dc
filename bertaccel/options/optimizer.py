"""Optimizers and the learning-rate schedule.

One home per optimizer: its YAML file in conf/optimizer/ names the class (`impl._target_`, a
torch.optim.Optimizer, `_partial_: true`) with its own settings (betas, eps, foreach/fused ...),
and the class itself validates them and says whether this machine can run it. Adding an
optimizer is that YAML file plus the class; nothing here lists the options. What every
optimizer shares stays in OptimizerConfig: lr and its schedule, weight decay (parameter groups),
clipping.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch

from bertaccel.config import LR_SCHEDULES, SCALE_LR, OptimizerConfig, first_line, not_one_of
from bertaccel.option import Option, problems
from bertaccel.optimizers.cost import StepCost

if TYPE_CHECKING:
    from bertaccel.config import RunConfig


def _param_groups(model: torch.nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Trainable parameters only; no decay on biases and LayerNorm weights (BERT's recipe)."""
    decay: List[torch.nn.Parameter] = []
    no_decay: List[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def optimizer_class(cfg: OptimizerConfig) -> Callable[..., torch.optim.Optimizer]:
    """The option's class with its own settings bound (Hydra instantiate of a `_partial_`)."""
    from hydra.utils import instantiate

    bound: Callable[..., torch.optim.Optimizer] = instantiate(cfg.impl, _convert_="all")  # (instantiate is untyped)
    return bound


def _build(factory: Callable[..., torch.optim.Optimizer], groups: List[Dict[str, Any]], lr: float,
           capturable: bool) -> torch.optim.Optimizer:
    if capturable:
        # Inside a CUDA graph the step reads lr from device memory: a float would be frozen into
        # the graph at capture, so the schedule could never change it (set_lr fills the tensor).
        return factory(groups, lr=torch.tensor(lr, device=groups[0]["params"][0].device), capturable=True)
    return factory(groups, lr=lr)


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig, capturable: bool = False, lr: Optional[float] = None) -> torch.optim.Optimizer:
    """capturable: state and lr on the device, so the step can be captured in a CUDA graph.
    lr: the starting lr (default cfg.lr; set_lr changes it every step)."""
    return _build(optimizer_class(cfg), _param_groups(model, cfg.weight_decay), cfg.lr if lr is None else lr,
                  capturable)


def _instantiated(cfg: OptimizerConfig) -> Tuple[Optional[Callable[..., torch.optim.Optimizer]], Optional[str]]:
    """(the option's class with its settings bound, None) or (None, why it cannot be instantiated)."""
    try:
        return optimizer_class(cfg), None
    except Exception as e:  # noqa: BLE001 - Hydra wraps import and argument errors alike
        return None, f"optimizer={cfg.name}: optimizer.impl cannot be instantiated: {first_line(e, last=True)}"


def check_optimizer(cfg: OptimizerConfig, capturable: bool) -> Optional[str]:
    """Why the option's settings are bad input (None if they are not): the class is built over
    one throw-away CPU parameter, so its own argument checks (ValueError, TypeError) speak. A
    RuntimeError says "not on this machine" instead: optimizer_unusable, a skip, not bad input."""
    factory, refusal = _instantiated(cfg)
    if factory is None:
        return refusal
    probe = torch.nn.Parameter(torch.zeros(4))
    try:
        _build(factory, [{"params": [probe], "weight_decay": cfg.weight_decay}], cfg.lr, capturable)
    except TypeError as e:
        if capturable and "capturable" in str(e):
            return (f"optimizer={cfg.name} has no capturable mode, which compile.step_graph=true needs "
                    "(the step runs inside a CUDA graph)")
        return f"optimizer={cfg.name}: {first_line(e, last=True)}"
    except ValueError as e:
        return f"optimizer={cfg.name}: {first_line(e, last=True)}"
    except RuntimeError:
        return None  # the machine, not the settings: optimizer_unusable
    return None


def check_built(cfg: "RunConfig") -> Optional[str]:
    """Refuses settings the optimizer's class itself rejects (optimizer.impl built over one CPU
    parameter). (Building one imports torch._dynamo, seconds: a sweep's process asks this check
    of a run it starts in a process of its own there, not here: runs/launch.py.) A class without
    the capturable mode compile.step_graph=true builds: a rule (options/rules.py step_graph_optimizer)."""
    return check_optimizer(cfg.optimizer, capturable=False)


def optimizer_unusable(cfg: OptimizerConfig, device: torch.device) -> Optional[str]:
    """Why this machine cannot run the option (its class raises RuntimeError when built over a
    parameter on the run's device, e.g. a GPU-only kernel), or None."""
    probe = torch.nn.Parameter(torch.zeros(4, device=device))
    try:
        _build(optimizer_class(cfg), [{"params": [probe], "weight_decay": cfg.weight_decay}], cfg.lr, False)
    except RuntimeError as e:
        return f"optimizer={cfg.name} cannot run on {device.type}: {first_line(e, last=True)}"
    return None


# torch's classes, which cannot carry a step_cost of ours (optimizers/cost.py; our classes declare
# their own). Counted by dispatching a step on the CPU (torch 2.13; steps kept on the CPU left out);
# passes from the ops' operands: AdamW's foreach step is weight decay 2, lerp 3, mul 2, addcmul 3,
# sqrt 2, div 2, add 2, addcdiv 4 = 20 passes; a fused step (_fused_adamw_ and the on-device step
# count) reads param, grad and two states and writes three: 7.
TORCH_STEP_COSTS: Dict[type, StepCost] = {torch.optim.AdamW: StepCost(20, foreach_ops=7.5, fused=StepCost(7, foreach_ops=2))}


def _impl_class(cfg: OptimizerConfig) -> Optional[type]:
    """The class optimizer.impl names (its `_target_`), or None when it cannot be imported."""
    from hydra.utils import get_class

    try:
        return get_class(cfg.impl["_target_"])
    except Exception:  # noqa: BLE001 - Hydra wraps import errors; the check says them as bad input
        return None


def step_cost(cfg: OptimizerConfig) -> Optional[StepCost]:
    """What one step of this option costs (its class's `step_cost`, as its settings run it), or
    None when its class declares none."""
    cls = _impl_class(cfg)
    cost = getattr(cls, "step_cost", None) or (TORCH_STEP_COSTS.get(cls) if cls is not None else None)
    return cost.configured(cfg.impl) if isinstance(cost, StepCost) else None


def keeps_master_weights(cfg: OptimizerConfig) -> bool:
    """Whether the option's class keeps fp32 master weights of half parameters (`master_weights`)."""
    return bool(getattr(_impl_class(cfg), "master_weights", False))


class OptimizerOption(Option):
    section, schema = "optimizer", OptimizerConfig
    later = (check_built,)  # (left to the run's own process by a sweep: runs/launch.py)

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an unknown schedule or scale_lr, and an optimizer.impl Hydra cannot instantiate
        (an unknown class, an argument it does not take)."""
        opt = cfg.optimizer
        return problems(not_one_of("optimizer.schedule", opt.schedule, LR_SCHEDULES),
                        not_one_of("optimizer.scale_lr", opt.scale_lr, SCALE_LR),
                        _instantiated(opt)[1])

    def unusable(self, cfg: "RunConfig", device: torch.device, caps: Any) -> Optional[str]:
        """The option's own class says (it raises RuntimeError built on this device, e.g. a GPU-only kernel)."""
        return optimizer_unusable(cfg.optimizer, device)


OPTION = OptimizerOption()


def scales_lr(cfg: OptimizerConfig) -> bool:
    """optimizer.scale_lr=linear: lr follows the effective batch (scaled_lr)."""
    return cfg.scale_lr == "linear"


def scaled_lr(cfg: OptimizerConfig, effective_batch: int) -> float:
    """optimizer.scale_lr=linear: lr x effective batch / base_batch_size (the linear scaling
    rule, Systematic Training Compute Optimization, eq. 11); none: lr as given."""
    if scales_lr(cfg):
        return cfg.lr * effective_batch / cfg.base_batch_size
    return cfg.lr


def lr_factor(schedule: str, step: int, total_steps: int, warmup_ratio: float, min_lr_ratio: float = 0.0) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based) of `total_steps`.
    min_lr_ratio: cosine's floor, eta_min = min_lr_ratio x base (Systematic Training
    Compute Optimization, eq. 10: 0.1)."""
    if schedule == "constant":
        return 1.0
    warmup = math.ceil(warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if schedule == "cosine":  # eq. 10: warm-up, then half a cosine from 1 down to the floor
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    # linear: decay from 1 after warm-up to 0 after the last step
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    # Set by hand rather than by an LRScheduler because layer-wise freezing rebuilds the
    # optimizer every epoch, while the schedule runs over the whole training.
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)  # capturable: the graph reads this tensor (no host sync)
        else:
            group["lr"] = lr
