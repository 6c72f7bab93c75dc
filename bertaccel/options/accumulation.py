"""accumulation=adaptive: variance-aware gradient accumulation (Systematic
Training Compute Optimization, section III-B, eq. 6-7).

After each optimizer step the micro-batch gradients of its window give
    sigma^2 = 1/(k-1) sum_j || g_j - g_acc ||^2,   g_acc = (1/k) sum_j g_j          (eq. 7, 4)
and the next window has
    k = min(k_max, ceil(sigma^2 / (sigma_target^2 + eps)))                          (eq. 6)
micro-batches: noisy gradients (early training) get more accumulation, calm ones less.
sigma^2 is in the units of a squared gradient norm; `grad_variance` is logged per step so a
user can pick `accumulation_target_variance` (sigma_target^2) from a first run.

Choices the paper leaves open, made here:
- k never drops below 2: with one micro-batch the variance cannot be measured again, and k
  would stay 1 for good; the first window has k_max (nothing measured yet);
- g_j is micro-batch j's mean-loss gradient. The loop accumulates sum_j (n_j / n) g_j (exact
  weighting, train.accumulate_window), so g_j = (n / n_j) x its increment of the accumulated
  gradient; this needs one copy of the gradients (prev) and one running sum, only in this mode;
- eq. 9 (k_optimal = argmax throughput/memory) is a search over k, which a sweep over integer
  `accumulation=` values and the report already do; it is not repeated inside a run.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, List, Optional

import torch

from bertaccel.option import not_count_or
from bertaccel.option import Option, problems

if TYPE_CHECKING:
    from bertaccel.config import RunConfig

EPS = 1e-12


def is_adaptive(accumulation: object) -> bool:
    """accumulation=adaptive: k chosen per window from the gradients' variance (not a count)."""
    return accumulation == "adaptive"


class AccumulationOption(Option):
    section, schema = "accumulation", None

    def check(self, cfg: "RunConfig") -> List[str]:
        """Refuses an accumulation that is neither an integer >= 1 nor adaptive. Adaptive with
        num_gpus > 1 or compile.step_graph=true is a rule (options/rules.py)."""
        if cfg.accumulation == "adaptive":
            return []
        return problems(not_count_or("accumulation", cfg.accumulation, "adaptive"))


OPTION = AccumulationOption()


def next_k(sigma2: float, target_variance: float, k_max: int) -> int:
    """Eq. 6, bounded to [2, k_max]."""
    return max(2, min(k_max, math.ceil(sigma2 / (target_variance + EPS))))


class GradVariance:
    """sigma^2 of the micro-batch gradients of one window (eq. 7), from the loop's accumulation."""

    def __init__(self, params: List[torch.Tensor]):
        self.params = params
        self.prev: Optional[List[torch.Tensor]] = None
        self.total: Optional[List[torch.Tensor]] = None
        self.sq_norms = torch.zeros(())  # sum_j ||g_j||^2, accumulated on the device (begin() puts it there)
        self.k = 0

    def begin(self) -> None:
        """Before the window's first backward (gradients are zero or None then)."""
        self.prev = [torch.zeros_like(p) for p in self.params]
        self.total = [torch.zeros_like(p) for p in self.params]
        self.sq_norms = torch.zeros((), device=self.params[0].device)
        self.k = 0

    def after_backward(self, n_micro: int, n_window: int) -> None:
        """After micro-batch j's backward: its mean-loss gradient is (n/n_j) x the increment."""
        if self.prev is None or self.total is None:
            raise RuntimeError("adaptive accumulation: after_backward before begin()")
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        g = torch._foreach_sub(grads, self.prev)
        torch._foreach_mul_(g, n_window / max(n_micro, 1))
        self.sq_norms += torch.stack(torch._foreach_norm(g)).pow(2).sum()
        torch._foreach_add_(self.total, g)
        self.prev = [t.detach().clone() for t in grads]
        self.k += 1

    def sigma2(self) -> Optional[float]:
        """Eq. 7 for the window just ended (None with one micro-batch: no spread to measure)."""
        if self.k < 2 or self.total is None:
            return None
        total_sq = torch.stack(torch._foreach_norm(self.total)).pow(2).sum()
        # sum_j ||g_j - mean||^2 = sum_j ||g_j||^2 - ||sum_j g_j||^2 / k
        return float((self.sq_norms - total_sq / self.k) / (self.k - 1))
