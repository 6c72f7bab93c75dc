"""sweep.concurrent=N: runs of a sweep train side by side on one GPU, and each run's timed window
(a stretch of steady steps) runs with the GPU to itself.

The coordination is a readers-writer lock across the sweep's run processes, on two files in a
per-sweep directory (fcntl.flock: a lock ends with its holder's process, a killed run's too):

- `turnstile`: a window (the writer) takes it exclusively before it waits for the others, so no
  run starts or resumes its training while a window waits or runs (writer preference: a waiting
  window is never starved by the others' steps);
- `rw`: every run holds it shared while it uses the device (warm-up, steps, evaluation), a
  window exclusively.

A run holds the shared side from its start to its end and yields it only at a step boundary,
when a window is waiting (the turnstile is taken): it synchronizes its device first, so none of
its work is queued when the window's clock starts; then it waits at the turnstile until the
window is over. Between two windows a step costs one non-blocking flock call, no device sync.

All state is per run (the `ExclusiveWindow` object and its lock's file descriptors).
"""
from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from bertaccel.measure.step_clock import STEADY_SKIP
from bertaccel.train.state import Callback, Run, Window, sync


class SweepLock:
    """The readers-writer lock of one sweep's runs (see the module's docstring). One per run."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self._turnstile = os.open(directory / "turnstile", os.O_RDWR | os.O_CREAT, 0o644)
        self._rw = os.open(directory / "rw", os.O_RDWR | os.O_CREAT, 0o644)

    def acquire_shared(self) -> None:
        fcntl.flock(self._turnstile, fcntl.LOCK_SH)  # (blocks while a window waits or runs)
        fcntl.flock(self._rw, fcntl.LOCK_SH)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)

    def release_shared(self) -> None:
        fcntl.flock(self._rw, fcntl.LOCK_UN)

    def writer_waiting(self) -> bool:
        """A window holds the turnstile (waiting for the readers, or running)."""
        try:
            fcntl.flock(self._turnstile, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        return False

    def acquire_exclusive(self) -> None:
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)  # new readers wait from here
        fcntl.flock(self._rw, fcntl.LOCK_EX)  # the readers holding it yield at their next step boundary

    def release_exclusive(self) -> None:
        fcntl.flock(self._rw, fcntl.LOCK_UN)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)

    def close(self) -> None:
        """Drops whatever is still held (closing a file drops its locks); again: nothing."""
        for fd in (self._rw, self._turnstile):
            if fd >= 0:
                os.close(fd)
        self._rw = self._turnstile = -1


def window_plan(steps_per_epoch: int, wanted: int, skip: int = STEADY_SKIP) -> Tuple[int, int, str]:
    """(first step, steps, note): the exclusive window in the first epoch, after `skip` warm-up
    steps (allocator growth, first launches: step_clock's steady state), clipped to the steps there are."""
    first = skip if steps_per_epoch > skip else 0
    steps = min(wanted, steps_per_epoch - first)
    note = "" if steps == wanted else (f"sweep.window_steps={wanted} clipped to {steps}: the first epoch has "
                                       f"{steps_per_epoch} steps, the first {first} of them warm-up")
    return first, steps, note


@dataclass
class WindowFigures:
    """What the exclusive window measured (the record projects from it: record/exclusive.py)."""
    wanted_steps: int
    first_step: int = 0  # index in the first epoch of the window's first step
    steps: int = 0
    samples: int = 0
    time_s: float = 0.0
    start_unix: float = 0.0
    end_unix: float = 0.0
    note: str = ""  # the clipping, if any
    waited_s: float = 0.0  # for the others' steps to yield before the window could start
    # [start, end] (unix) of each stretch this run held the shared side: its steps, warm-up and
    # evaluations all fall inside them, and no other run's window overlaps one.
    holds_unix: List[List[float]] = field(default_factory=list)


class ExclusiveWindow(Callback):
    """The run's side of sweep.concurrent: the shared hold around its device work, its yields at
    step boundaries, and its own exclusive window, over which `collectors` (energy, GPU activity)
    measure. Listed first in train's events (loop.py: `outermost`), so its run_start comes before
    the warm-up and its run_end after everything else, and its step_start before the step's others."""

    def __init__(self, directory: Path, wanted_steps: int, collectors: Any):
        self.lock = SweepLock(directory)
        self.collectors = collectors
        self.figures = WindowFigures(wanted_steps)
        self.held = False
        self.open = False
        self._t0 = 0.0
        self._samples0 = 0

    def _hold(self) -> None:
        self.lock.acquire_shared()
        self.held = True
        self.figures.holds_unix.append([time.time(), 0.0])

    def _yield(self, run: Run) -> None:
        sync(run.device)  # (nothing of this run is queued on the device when it lets go)
        self.figures.holds_unix[-1][1] = time.time()
        self.lock.release_shared()
        self.held = False

    def run_start(self, run: Run) -> None:
        first, steps, note = window_plan(run.steps_per_epoch, self.figures.wanted_steps)
        self.figures.first_step, self.figures.steps, self.figures.note = first, steps, note
        if note:
            run.log(f"exclusive window: {note}")
        self._hold()

    def step_start(self, run: Run, win: Window) -> None:
        if self.open:
            return
        if win.epoch == 0 and win.steps == self.figures.first_step and self.figures.samples == 0:
            self._open(run, win)
        elif self.lock.writer_waiting():
            self._yield(run)
            self._hold()  # (waits at the turnstile until the window is over)

    def step_end(self, run: Run, win: Window) -> None:
        if self.open and win.steps - self.figures.first_step >= self.figures.steps:
            self._close(run, win)

    def window_end(self, run: Run, win: Window) -> None:
        if self.open:  # (the epoch ended before the window's steps, or a step raised)
            self._close(run, win)

    def run_end(self, run: Run) -> None:
        if self.held:
            self._yield(run)
        self.lock.close()

    def _open(self, run: Run, win: Window) -> None:
        self._yield(run)
        t_wait = time.perf_counter()
        self.lock.acquire_exclusive()
        self.figures.waited_s = time.perf_counter() - t_wait
        self.collectors.start()
        self.figures.start_unix = time.time()
        self._t0, self._samples0 = time.perf_counter(), win.samples
        self.open = True

    def _close(self, run: Run, win: Window) -> None:
        sync(run.device)
        f = self.figures
        f.time_s = time.perf_counter() - self._t0
        f.end_unix = time.time()
        f.steps = win.steps - f.first_step
        f.samples = win.samples - self._samples0
        self.collectors.stop()
        self.open = False
        self.lock.release_exclusive()
        self._hold()


BYTES_PER_PARAMETER = 16  # fp32 weights and gradients, and the two moments of Adam-style optimizers


def admits(free_bytes: Optional[int], need_bytes: int) -> bool:
    """A run starts when the device's free memory holds what it needs; None: nothing to check (a CPU)."""
    return free_bytes is None or free_bytes >= need_bytes


def wait_for_memory(read_free: Callable[[], Optional[int]], need_bytes: int, log: Callable[[str], None],
                    poll_s: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> float:
    """Waits until `admits`; returns the seconds waited (0.0 at once)."""
    t0 = time.perf_counter()
    said = False
    while not admits(read_free(), need_bytes):
        if not said:
            log(f"waiting for {need_bytes / 2**30:.2f} GiB of device memory: the runs beside this one hold the rest")
            said = True
        sleep(poll_s)
    return time.perf_counter() - t0 if said else 0.0
