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


def steady_steps(windows: List[List[float]], skip: int = STEADY_SKIP) -> List[float]:
    """Step times of all windows with each window's first `skip` steps left out (all steps when a
    window is too short to leave any)."""
    steady: List[float] = []
    for times in windows:
        steady += times[skip:] if len(times) > skip else times
    return steady


def steady_median_ms(windows: List[List[float]], skip: int = STEADY_SKIP) -> Optional[float]:
    """Median step time over steady_steps."""
    steady = steady_steps(windows, skip)
    return statistics.median(steady) if steady else None


def steady_source(device: torch.device, skip: int = STEADY_SKIP) -> str:
    clock = ("CUDA events recorded between optimizer steps (no per-step host sync)" if device.type == "cuda"
             else "time.perf_counter between optimizer steps")
    return f"median over the steps of the training windows, first {skip} of each window left out; {clock}"


PHASES = ("forward_ms", "backward_ms", "optimizer_ms")


class PhaseClock:
    """The one-step breakdown (seed 004, Table 4.10): forward, backward and optimizer time per
    optimizer step, marked at the same boundaries StepClock uses (CUDA events on a GPU, the host
    clock on a CPU; no host sync). With accumulation a step's forward and backward are the sums
    over its micro-batches; the host-to-device copy of a batch counts in its forward, clipping in
    the optimizer phase."""

    def __init__(self, device: torch.device):
        self.clock = StepClock(device)
        self.steps: List[List[str]] = []  # per step: the labels of its marks after the first

    def begin_step(self) -> None:
        self.clock.mark()
        self.steps.append([])

    def forward_done(self) -> None:
        self._mark("forward_ms")

    def backward_done(self) -> None:
        self._mark("backward_ms")

    def step_done(self) -> None:
        self._mark("optimizer_ms")

    def _mark(self, label: str) -> None:
        if self.steps:  # marks outside a step (the warm-up's calls) are not timed
            self.clock.mark()
            self.steps[-1].append(label)

    def per_step(self) -> List[dict]:
        """{phase: ms} per step; on a GPU only after the window's closing synchronize."""
        gaps = iter(self.clock.step_ms())
        out = []
        for labels in self.steps:
            phases = dict.fromkeys(PHASES, 0.0)
            for label, gap in zip(labels, gaps):
                phases[label] += gap
            next(gaps, None)  # the gap from this step's last mark to the next step's first
            out.append(phases)
        return out


def steady_phase_medians(windows: List[List[dict]], skip: int = STEADY_SKIP) -> dict:
    """Median of each phase over the steady-state steps of all windows (as steady_median_ms)."""
    return {p: steady_median_ms([[s[p] for s in w] for w in windows], skip) for p in PHASES}
