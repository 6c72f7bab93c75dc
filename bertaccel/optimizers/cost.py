"""What one optimizer step costs, declared on the optimizer's class (`step_cost = StepCost(...)`),
so the plan (plan/roofline.py) counts a new optimizer from its class, with no list to extend.
torch's own classes, which we cannot annotate, have theirs in options/optimizer.py."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class StepCost:
    """Per optimizer step, over the trainable parameters (fp32 state)."""
    passes: float              # elements read + written per parameter (4 bytes each)
    foreach_ops: float = 0.0   # multi-tensor ops per parameter group
    per_tensor_ops: float = 0.0
    fixed_launches: float = 0.0
    fused: Optional["StepCost"] = None  # the class's cost with `fused: true` (torch's one-kernel step)

    def configured(self, settings: Mapping[str, Any]) -> "StepCost":
        """The cost as the option's settings run the class: `fused: true` its fused step; `foreach:
        false` the same elementwise ops one tensor at a time."""
        if settings.get("fused") is True and self.fused is not None:
            return self.fused
        if settings.get("foreach") is False and self.foreach_ops:
            return replace(self, foreach_ops=0.0, per_tensor_ops=self.per_tensor_ops + self.foreach_ops)
        return self
