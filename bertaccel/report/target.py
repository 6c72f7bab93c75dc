"""Time, energy and cost to a target accuracy (MLPerf's time-to-train form): when did a run first
reach --target-accuracy, from its accuracy after each epoch and each epoch's training window.

Accuracy is measured after each epoch's window (evaluation runs between windows and is not
counted, as in the thesis' T). Reached in epoch e > 1: the time is interpolated linearly between
the accuracies after epochs e - 1 and e, over epoch e's window. Reached in epoch 1: nothing is
measured before it, so the time is the end of epoch 1's window (an upper bound, said so). Energy
and cost are at the run's average rate over its windows (energy_kwh and cost_usd are logged
for the whole run, not per window).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from .scoring import Row


@dataclass(frozen=True)
class Reach:
    reached: Optional[bool]          # None: cannot tell (see why["time_s"])
    epoch: Optional[int] = None      # 1-based epoch in which it was reached
    time_s: Optional[float] = None   # training-window seconds until then
    energy_kwh: Optional[float] = None
    cost_usd: Optional[float] = None
    how: str = ""                    # how the time was found, or where the run got to
    why: Dict[str, str] = field(default_factory=dict)  # column -> why it is null


def _at_rate(row: Row, column: str, seconds: float, window_s: float, why: Dict[str, str]) -> Optional[float]:
    value = row.get(column)
    if value is None:
        why[column] = row.extra.get(column, "not measured")
        return None
    return value / window_s * seconds


def reach(row: Row, target: float) -> Reach:
    acc, win = row.epoch_accuracy, row.epoch_time_s
    if not acc:
        reason = row.extra.get("epoch_accuracy", "no per-epoch test_accuracy")
        return Reach(None, why={c: reason for c in ("time_s", "energy_kwh", "cost_usd")})
    if len(win) != len(acc):
        reason = (f"epoch_time_s {row.extra['epoch_time_s']}" if "epoch_time_s" in row.extra else
                  f"{len(acc)} per-epoch accuracies but {len(win)} training windows")
        return Reach(None, why={c: reason for c in ("time_s", "energy_kwh", "cost_usd")})
    first = next((e for e, a in enumerate(acc) if a >= target), None)
    if first is None:
        best = max(range(len(acc)), key=lambda e: acc[e])
        return Reach(False, how=f"not reached: best {acc[best]:.4f} after epoch {best + 1} of {len(acc)}")
    before = sum(win[:first])
    if first == 0:
        seconds = win[0]
        how = "by the end of epoch 1 (no accuracy is measured before it: an upper bound, not interpolated)"
    else:
        fraction = (target - acc[first - 1]) / (acc[first] - acc[first - 1])
        seconds = before + fraction * win[first]
        how = (f"in epoch {first + 1}, interpolated: {acc[first - 1]:.4f} after epoch {first}, "
               f"{acc[first]:.4f} after epoch {first + 1}")
    why: Dict[str, str] = {}
    total = sum(win)
    energy = _at_rate(row, "energy_kwh", seconds, total, why)
    cost = _at_rate(row, "cost_usd", seconds, total, why)
    return Reach(True, first + 1, seconds, energy, cost, how, why)
