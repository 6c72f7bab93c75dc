"""Optimizer registry and learning-rate schedule.

Adding an optimizer is one function plus one line in OPTIMIZERS.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List

import torch


def _param_groups(model: torch.nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Trainable parameters only; no decay on biases and LayerNorm weights (BERT's recipe)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def _adamw(groups: List[Dict[str, Any]], cfg: Any, capturable: bool, **impl: bool) -> torch.optim.Optimizer:
    lr: Any = cfg.lr
    if capturable:
        # Inside a CUDA graph the step reads lr from device memory: a float would be frozen into
        # the graph at capture, so the schedule could never change it (set_lr fills the tensor).
        lr = torch.tensor(cfg.lr, device=groups[0]["params"][0].device)
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             capturable=capturable, **impl)


OPTIMIZERS: Dict[str, Callable[..., torch.optim.Optimizer]] = {
    # foreach: one multi-tensor kernel per op over all params; fused: one kernel for the whole step.
    "adamw": lambda groups, cfg, capturable: _adamw(groups, cfg, capturable, foreach=True),
    "adamw_fused": lambda groups, cfg, capturable: _adamw(groups, cfg, capturable, fused=True),
}


def build_optimizer(model: torch.nn.Module, cfg: Any, capturable: bool = False) -> torch.optim.Optimizer:
    """capturable: state and lr on the device, so the step can be captured in a CUDA graph."""
    return OPTIMIZERS[cfg.name](_param_groups(model, cfg.weight_decay), cfg, capturable)


def lr_factor(schedule: str, step: int, total_steps: int, warmup_ratio: float) -> float:
    """Multiplier of the base lr at optimizer step `step` (0-based) of `total_steps`."""
    if schedule == "constant":
        return 1.0
    warmup = math.ceil(warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if schedule == "cosine":  # seed 001: warm-up, then half a cosine from 1 to 0
        return 0.5 * (1.0 + math.cos(math.pi * progress))
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
