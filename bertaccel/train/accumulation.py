"""accumulation=N|adaptive as the loop sees it: how many micro-batches the next window has."""
from __future__ import annotations

from typing import Any, List, Optional

import torch

from bertaccel.config import RunConfig
from bertaccel.options.accumulation import GradVariance, is_adaptive, next_k
from bertaccel.options.precision import Precision
from bertaccel.train.result import TrainResult


class Accumulation:
    """Micro-batches per window: accumulation=N, or accumulation=adaptive, whose first window has
    accumulation_max and each later one what eq. 6 says after the step before it."""

    def __init__(self, cfg: RunConfig):
        self.adaptive = is_adaptive(cfg.accumulation)
        self.first = cfg.accumulation_max if self.adaptive else cfg.accumulation
        self.next = self.first
        self.target_variance, self.k_max = cfg.accumulation_target_variance, cfg.accumulation_max

    def k(self) -> int:
        """Read by `windows` as each window begins."""
        return self.next

    def variance(self, params: List[torch.Tensor]) -> Optional[GradVariance]:
        if not self.adaptive:
            return None
        variance = GradVariance(params)
        variance.begin()
        return variance

    def after_window(self, variance: GradVariance, window: List[Any], precision: Precision,
                     result: TrainResult) -> None:
        """Inside the step, before the update: it reads the micro-batches' gradients and the loss
        scale the update may change."""
        # Gradients carry the fp16 loss scale: sigma^2 scales with its square. (A host sync,
        # which only this mode pays.)
        sigma2 = variance.sigma2()
        if sigma2 is not None:
            sigma2 /= float(precision.scaler.get_scale()) ** 2 if precision.scaler.is_enabled() else 1.0
            self.next = next_k(sigma2, self.target_variance, self.k_max)
        result.accumulation_k.append(len(window))
        result.grad_variance.append(sigma2)
