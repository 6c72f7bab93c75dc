"""What the loop (loop.py) and its event objects share, apart from both: the run's state (`Run`),
one epoch's training window (`Window`), and the callback protocol (`Callback`, `Events`).

Each event object keeps its own state; `Run` holds only what the loop itself needs or several
objects read. The events and their order are written once, in loop.py's `train`.
"""
from __future__ import annotations

import math
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from bertaccel.config import RunConfig
from bertaccel.measure.flops import TokenCounts, bert_train_flops
from bertaccel.measure.step_clock import PhaseClock, StepClock
from bertaccel.options.freezing import count_trainable
from bertaccel.train.accumulation import Accumulation
from bertaccel.train.forward import real_rows
from bertaccel.train.result import EpochStats, TrainResult

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel


def sync(device: torch.device) -> None:
    """The host waits for the device's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Window:
    """One epoch's training window: its clock, its per-step clocks, and what its steps add up.
    Timed (train_time_s) from open() to close(); `timing` says which side of it the code is on."""

    def __init__(self, epoch: int, model: torch.nn.Module, device: torch.device):
        self.epoch, self.device = epoch, device
        self.trainable = count_trainable(model)
        self.loss_sum = torch.zeros((), device=device)
        self.samples = self.steps = 0
        self.tokens = TokenCounts()
        self.clock = StepClock(device)
        self.phases: Optional[PhaseClock] = None  # handed over by Step at window end
        self.timing = False
        self.start_unix = self.end_unix = 0.0
        self.train_time_s = self.eval_time_s = self.test_accuracy = 0.0
        self.compiles_in_window = 0
        self.compiles_in_eval = 0
        self._t0 = 0.0
        self._mean_loss: Tuple[int, float] = (-1, math.nan)  # (at step, value)
        self._epoch_loss: Optional[float] = None

    def open(self, result: TrainResult) -> None:
        self.start_unix = time.time()
        if result.first_window_opened_at is None:
            result.first_window_opened_at = self.start_unix
        self._t0 = time.perf_counter()
        self.timing = True
        self.clock.mark()

    def close(self) -> None:
        """The device finishes the window's work before the clock stops."""
        sync(self.device)
        self.train_time_s = time.perf_counter() - self._t0
        self.timing = False
        self.end_unix = time.time()

    def elapsed_s(self) -> float:
        return time.perf_counter() - self._t0

    def add(self, window: List[Dict[str, torch.Tensor]], window_loss: torch.Tensor) -> None:
        n = 0
        for batch in window:  # shapes and masks are on the host: no device sync
            self.tokens.add(batch)
            n += real_rows(batch)
        self.loss_sum += window_loss * n
        self.samples += n
        self.steps += 1

    def mean_loss(self) -> float:
        """The window's mean loss so far: one host sync per step, however many ask."""
        if self._mean_loss[0] != self.steps:
            self._mean_loss = (self.steps, float(self.loss_sum) / self.samples)
        return self._mean_loss[1]

    def epoch_loss(self) -> float:
        """The epoch's mean loss (after the whole-job sums under data parallel)."""
        if self._epoch_loss is None:
            self._epoch_loss = float(self.loss_sum) / max(self.samples, 1)
        return self._epoch_loss

    def stats(self, model: torch.nn.Module) -> EpochStats:
        return EpochStats(self.epoch, self.epoch_loss(), self.test_accuracy, self.trainable, self.train_time_s,
                          self.eval_time_s, self.steps, self.samples, self.tokens,
                          bert_train_flops(model, self.tokens), (self.start_unix, self.end_unix),
                          self.clock.step_ms(), self.compiles_in_window, self._phases().per_step(),
                          self.compiles_in_eval)

    def _phases(self) -> PhaseClock:
        if self.phases is None:  # (Step hands its clock over at every window's end)
            raise RuntimeError("the window's phase clock was not handed over (Step.window_end)")
        return self.phases


@dataclass
class Run:
    """What the loop and its event objects share in one train() call (an object's own state is its own)."""
    cfg: RunConfig
    device: torch.device
    log: Callable[[str], None]
    model: torch.nn.Module
    parallel: Optional[DistributedDataParallel]  # the model under DDP when there are several ranks
    train_loader: Any
    test_loader: Any
    step: Any  # train.step.Step (not imported here: step.py imports this module)
    accumulation: Accumulation
    result: TrainResult
    steps_per_epoch: int
    total_steps: int
    global_step: int = 0
    micro_batches_done: int = 0
    # Read per step by two hooks, as a plain value: an OmegaConf attribute costs ~20 Python calls,
    # which a plain loop does not pay (tests/test_host_work.py counts them).
    log_every_steps: int = 0

    def __post_init__(self) -> None:
        self.log_every_steps = int(self.cfg.train.log_every_steps)

    def log_due(self, win: Window) -> bool:
        """Steps that read the loss on the host (NaN check, bar): every log_every_steps, and the last."""
        return win.steps % self.log_every_steps == 0 or win.steps == self.steps_per_epoch


class Callback:
    """The events of the loop; an object overrides the hooks it needs (the rest do nothing)."""

    def run_start(self, run: Run) -> None: ...

    def epoch_start(self, run: Run, epoch: int) -> None: ...

    def window_start(self, run: Run, win: Window) -> None: ...

    def step_start(self, run: Run, win: Window) -> None: ...

    def step_end(self, run: Run, win: Window) -> None: ...

    def window_end(self, run: Run, win: Window) -> None: ...

    def epoch_end(self, run: Run, win: Window) -> None: ...

    def run_end(self, run: Run) -> None: ...


FORWARD = ("run_start", "epoch_start", "step_start")  # called in list order
REVERSE = ("step_end", "epoch_end", "run_end")        # called in reverse


def _defines(o: Callback, hook: str) -> bool:
    return getattr(type(o), hook) is not getattr(Callback, hook)


class Events:
    """Calls the objects' hooks: start events in list order, end events in reverse, so each
    object's end nests inside its start as with-blocks do. The window's hooks are with-blocks
    (`window`): an object's window_end runs once its window_start has, also when a later
    window_start, a step or the clock raises."""

    def __init__(self, objects: Sequence[Callback]):
        self.objects = list(objects)
        # Per hook, the bound methods of the objects that define it, in calling order: the base
        # class's empty hooks are not called (per step they were ~24 Python calls of the ~108 the
        # loop adds to a plain loop's; tests/test_host_work.py).
        self.hooks = {name: [getattr(o, name) for o in (self.objects if name in FORWARD else reversed(self.objects))
                             if _defines(o, name)]
                      for name in (*FORWARD, *REVERSE)}
        self.window_hooks = [(o.window_start if _defines(o, "window_start") else None,
                              o.window_end if _defines(o, "window_end") else None) for o in self.objects]

    def _call(self, hook: str, *args: object) -> None:
        for call in self.hooks[hook]:
            call(*args)

    def run_start(self, run: Run) -> None: self._call("run_start", run)
    def epoch_start(self, run: Run, epoch: int) -> None: self._call("epoch_start", run, epoch)
    def step_start(self, run: Run, win: Window) -> None: self._call("step_start", run, win)
    def step_end(self, run: Run, win: Window) -> None: self._call("step_end", run, win)
    def epoch_end(self, run: Run, win: Window) -> None: self._call("epoch_end", run, win)
    def run_end(self, run: Run) -> None: self._call("run_end", run)

    @contextmanager
    def window(self, run: Run, win: Window) -> Iterator[None]:
        """window_start in list order on entry, window_end in reverse on exit."""
        with ExitStack() as ends:
            for start, end in self.window_hooks:
                if start is not None:
                    start(run, win)
                if end is not None:
                    ends.callback(end, run, win)
            yield
