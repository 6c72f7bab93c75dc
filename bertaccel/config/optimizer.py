"""optimizer=<name>: the optimizer class and the lr schedule. Its option: bertaccel/options/optimizer.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from bertaccel.option import bounded

SCALE_LR = ("none", "linear")
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class OptimizerConfig:
    """The optimizer class and the learning-rate schedule. Options in conf/optimizer/; meaning and
    checks in bertaccel/options/optimizer.py."""
    name: str = "adamw"  # the option that set this group (optimizer=<name>)
    lr: float = bounded(1e-4, gt=0)  # Peak learning rate (after warm-up)
    weight_decay: float = bounded(0.01, ge=0)  # Decoupled weight decay; not applied to biases and LayerNorm weights
    schedule: str = "linear"  # The lr after warm-up: constant, linear decay to 0, or cosine to min_lr_ratio x lr
    warmup_ratio: float = bounded(0.1, ge=0, lt=1)  # The fraction of the optimizer steps lr warms up over
    # The floor cosine decays lr to, as a fraction of lr (Systematic Training Compute Optimization, eq. 10: 0.1)
    min_lr_ratio: float = bounded(0.0, ge=0, lt=1)
    # How lr follows the effective batch. linear: lr x effective batch (batch_size x accumulation x
    # num_gpus) / base_batch_size (the linear scaling rule, Systematic Training Compute Optimization, eq. 11)
    scale_lr: str = "none"
    base_batch_size: int = bounded(32, gt=0)  # The batch lr was tuned for (scale_lr=linear)
    max_grad_norm: Optional[float] = bounded(1.0, gt=0, note="null: no clipping")  # The gradients' global norm is clipped to this
    # The optimizer itself (bertaccel/options/optimizer.py): `_target_` a torch.optim.Optimizer class,
    # `_partial_: true`, and that class's own settings. lr and weight decay come from above.
    impl: Dict[str, Any] = field(default_factory=lambda: {"_target_": "torch.optim.AdamW", "_partial_": True})
