"""A step's time as overhead + FLOPs / rate: the plan's model of training time.

    time = overhead_s x optimizer steps + FLOPs / (rate_tflops x 1e12)

The overhead is what a step costs however little it computes: kernel launches, the host's Python
between them, the optimizer's loop over parameter tensors, the loss read back for the bar. A
small model at a small batch is all overhead (0.4-10% MFU measured for MiniLM at batch 32 on an
H200), a large one all FLOPs; a FLOP-only model (overhead 0) predicted the first as 1-30% of its
real time. Fit by non-negative least squares on points of different FLOPs per step (the probe's
three lengths, or finished runs of one configuration at different batch sizes or lengths); with
one point, or points whose FLOPs per step do not differ, the two cannot be told apart and the fit
says so (the rate alone, as before).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

# Points whose FLOPs per step differ by less than this (relative) cannot separate the two terms.
MIN_SPREAD = 0.05


@dataclass
class Fit:
    overhead_ms: float           # per optimizer step
    tflops: Optional[float]      # achieved rate of the FLOP-proportional part; None: no such part seen
    points: int
    how: str                     # what was fit, in words (a basis names it)

    def seconds(self, steps: float, flops: float) -> Optional[float]:
        compute = 0.0 if self.tflops is None else flops / (self.tflops * 1e12)
        return self.overhead_ms / 1e3 * steps + compute


def fit_overhead(flops: Sequence[float], seconds: Sequence[float], steps: Optional[Sequence[float]] = None) -> Fit:
    """seconds[i] = overhead x steps[i] + flops[i] / rate (steps: 1 each when not given: a point
    is one step). Non-negative least squares over the two terms."""
    n = list(steps) if steps is not None else [1.0] * len(flops)
    f, t = [float(x) for x in flops], [float(x) for x in seconds]
    if not f:
        raise ValueError("fit_overhead needs at least one point")
    per_step = [fi / ni for fi, ni in zip(f, n)]
    spread = (max(per_step) - min(per_step)) / max(per_step) if max(per_step) > 0 else 0.0
    if len(f) < 2 or spread < MIN_SPREAD:
        # One FLOPs-per-step level: time per FLOP only (the overhead is in it, not apart).
        rate = sum(f) / sum(t) / 1e12 if sum(t) > 0 else None
        return Fit(0.0, rate, len(f), "FLOPs / rate only: the points do not differ in FLOPs per step, so the "
                                      "per-step overhead cannot be told apart")
    snn = sum(x * x for x in n)
    sff = sum(x * x for x in f)
    snf = sum(a * b for a, b in zip(n, f))
    snt = sum(a * b for a, b in zip(n, t))
    sft = sum(a * b for a, b in zip(f, t))
    det = snn * sff - snf * snf
    a = (snt * sff - sft * snf) / det if det else -1.0
    c = (sft * snn - snt * snf) / det if det else -1.0
    if a < 0:  # no overhead visible: all FLOPs
        a, c = 0.0, sft / sff
    elif c <= 0:  # flat: every step costs the same, whatever it computes (launch-bound)
        a, c = snt / snn, 0.0
    how = (f"least squares over {len(f)} points: {a * 1e3:.3g} ms per step"
           + (f" + FLOPs / {1 / c / 1e12:.3g} TFLOP/s" if c > 0 else ", no FLOP-proportional part (launch-bound)"))
    return Fit(a * 1e3, (1 / c / 1e12) if c > 0 else None, len(f), how)
