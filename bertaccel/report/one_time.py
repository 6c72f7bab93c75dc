"""A winner whose one-time costs outweigh its training (issue 44, item 4).

A run's warm-up (compile_time_s: torch.compile, Triton's JIT of our kernels and fused optimizers,
CUDA-graph capture, the first update; whatever produced it) is paid before its training window,
and the ranking leaves it out (--time train): with caches that outlive a run it is paid once per
machine. That is fair only when the run is long enough for it not to matter. When the warm-up is
longer than the window itself, the answer says so beside the winner, with the steps after which
its faster steps pay the extra warm-up back against the baseline's (or that they never do).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from .scoring import Row


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    if not values or len(known) < len(values):
        return None
    return sum(known) / len(known)


def _per_sample(rows: Sequence[Row], members: Sequence[int]) -> Optional[float]:
    """Seconds per trained sample (per optimizer step where the samples are unknown): the pace
    the break-even compares, so runs of different batch sizes compare fairly."""
    paces = []
    for i in members:
        r = rows[i]
        amount = r.train_samples or r.optimizer_steps
        paces.append(r.time_s / amount if r.time_s is not None and amount else None)
    return _mean(paces)


def one_time_warning(rows: Sequence[Row], runs: Sequence[int], base_runs: Sequence[int]) -> Optional[str]:
    """rows: as measured (time_s the training window); runs: the winner's (its repeats);
    base_runs: the baseline's (empty: none). None when the warm-up is shorter than the window."""
    warm = _mean([rows[i].compile_time_s for i in runs])
    window = _mean([rows[i].time_s for i in runs])
    if not warm or window is None or warm <= window:
        return None
    said = (f"its one-time warm-up ({warm:.2f} s: compile_time_s, compile / Triton JIT / CUDA-graph capture) is "
            f"longer than its training window ({window:.2f} s)")
    if not base_runs or set(base_runs) == set(runs):
        return said + "; the ranking leaves it out (--time train): --time total counts it"
    extra = warm - (_mean([rows[i].compile_time_s or 0.0 for i in base_runs]) or 0.0)
    if extra <= 0:
        return said + "; the baseline's is as long, so it is not a cost of this choice"
    mine, theirs = _per_sample(rows, runs), _per_sample(rows, base_runs)
    if mine is None or theirs is None:
        return said + f"; {extra:.2f} s more than the baseline's, break-even unknown (no step count)"
    if mine >= theirs:
        return said + f"; {extra:.2f} s more than the baseline's, never paid back: its steps are not faster"
    r = rows[runs[0]]
    per_step = (r.train_samples / r.optimizer_steps) if r.train_samples and r.optimizer_steps else 1.0
    steps = math.ceil(extra / (theirs - mine) / per_step)
    took = f"; its run took {r.optimizer_steps:,} steps" if r.optimizer_steps else ""
    return said + f"; the {extra:.2f} s more than the baseline's pays back after {steps:,} steps{took}"
