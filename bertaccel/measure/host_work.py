"""Host work per optimizer step, counted rather than timed: Python function calls and aten ops
dispatched on the training thread over a span of steps.

A timing of host overhead moves with the machine and its load; these counts do not, so a CPU
test can hold the eager loop's host work to a plain loop's (tests/test_host_work.py) and fail on
the next per-step sync, hook or bookkeeping that a plain loop does not pay. What they cannot
see: work on other threads (the telemetry samplers), and the cost of one call against another.
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from torch.utils._python_dispatch import TorchDispatchMode


class _OpCounter(TorchDispatchMode):
    """Counts every aten op that reaches the dispatcher below autograd and autocast."""

    def __init__(self, ops: Counter):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@dataclass
class HostWork:
    """Counts between start() and stop() on this thread (both may be called from inside a loop's
    hooks: start at one step's beginning, stop at a later one's). kind: "calls" (Python function
    calls, through sys.setprofile) or "ops" (aten ops, through a dispatch mode). One kind per
    span: the dispatch mode runs Python for every op, which a call count would then include."""
    kind: str = "calls"
    counts: Counter = field(default_factory=Counter)   # 'module:function' or aten op -> how many
    steps: int = 0
    _mode: Optional[_OpCounter] = None

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":  # Python frames only; calls into C ("c_call") are not counted
            self.counts[f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_name}"] += 1

    def start(self) -> None:
        if self.kind == "ops":
            self._mode = _OpCounter(self.counts)
            self._mode.__enter__()
        else:
            sys.setprofile(self._profile)

    def stop(self, steps: int) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        else:
            sys.setprofile(None)
        self.steps = steps

    def per_step(self) -> Dict[str, float]:
        """ops: aten ops and scalar reads (aten _local_scalar_dense: .item(), float(), bool() of a
        tensor; of a GPU tensor each one waits for the device) per step; calls: Python calls per step."""
        if self.kind == "ops":
            return {"aten_ops": sum(self.counts.values()) / self.steps,
                    "scalar_reads": self.counts["aten._local_scalar_dense"] / self.steps}
        return {"python_calls": sum(self.counts.values()) / self.steps}

    def added_over(self, other: "HostWork", top: int = 15) -> List[Tuple[str, float]]:
        """Where this span's extra work comes from: the functions (or ops) counted more often here
        than in `other` (same kind), per step, most first."""
        return [(name, n / self.steps) for name, n in (self.counts - other.counts).most_common(top)]
