"""Per-step times inside a training window, without a host sync per step.

On a GPU a step boundary is a CUDA event recorded on the stream (the host does not wait, so the
loop can run ahead of the GPU as it would untimed); the differences are read once, after the
window's closing sync. On a CPU work is synchronous, so the host clock at each boundary serves.
`step_time_ms` is the median over the steady-state steps: the first `skip` steps of each window
(allocator growth, first launches of a freshly unfrozen layer set) are left out.
"""
from __future__ import annotations

import statistics
import time
from typing import List, Optional

import torch

STEADY_SKIP = 3


class StepClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        """A step boundary (call before the first step and after every step)."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def step_ms(self) -> List[float]:
        """Milliseconds per step; on a GPU only after the window's closing synchronize."""
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [1000 * (b - a) for a, b in zip(self.marks, self.marks[1:])]


def steady_median_ms(windows: List[List[float]], skip: int = STEADY_SKIP) -> Optional[float]:
    """Median step time over all windows with each window's first `skip` steps left out (all
    steps when a window is too short to leave any)."""
    steady: List[float] = []
    for times in windows:
        steady += times[skip:] if len(times) > skip else times
    return statistics.median(steady) if steady else None


def steady_source(device: torch.device, skip: int = STEADY_SKIP) -> str:
    clock = ("CUDA events recorded between optimizer steps (no per-step host sync)" if device.type == "cuda"
             else "time.perf_counter between optimizer steps")
    return f"median over the steps of the training windows, first {skip} of each window left out; {clock}"
