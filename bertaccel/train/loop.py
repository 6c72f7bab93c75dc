"""The training core: one loop that every option changes by argument, never by shape.

Per epoch: apply the freezing schedule, (re)build the optimizer, run accumulation windows of
`accumulation` micro-batches, then evaluate on the test split. Only the training window is
timed into train_time_s, and only it is measured by the collectors (energy, GPU activity);
evaluation has its own clock (the thesis excludes it too). An optional profiler window runs
after the last evaluation (profiling.py).

`loop` is the whole loop on one screen; everything else hangs on its events, one object per
concern (train/events.py: the events, their order, and what sits inside the timed window).
`Step` is the optimizer step, `Window` one epoch's timed window, `Run` what they all share.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from bertaccel import distributed
from bertaccel.config import uses_cuda_graphs
from bertaccel.measure.collectors import CollectorSet
from bertaccel.measure.flops import TokenCounts, bert_train_flops
from bertaccel.measure.step_clock import PhaseClock, StepClock
from bertaccel.options.accumulation import GradVariance, next_k
from bertaccel.options.freezing import count_trainable
from bertaccel.options.optimizer import optimizer_class, scaled_lr
from bertaccel.options.precision import Precision
from bertaccel.encoder.option import half_params
from bertaccel.train.checkpointing import apply_checkpointing
from bertaccel.train.events import (AfterTraining, Callback, Collectors, CompileEventCount, CompileWarmup, Evaluation,
                                    Events, FreezingSchedule, LayerTiming, LrSchedule, NonFiniteCheck, Profiler,
                                    ProgressBar, RanksTogether)
from bertaccel.train.isolation import warm_up_device
from bertaccel.train.result import EpochStats, TrainResult
from bertaccel.train.step import (_sync, accumulate_window, compile_model, compiles_anything, data_parallel,
                                  dynamo_settings, eval_batch, evaluate, mark_length_dynamic, real_rows, sdpa_backends,
                                  uses_triton, windows)
from bertaccel.train.step_graph import StepGraphs
from bertaccel.train.warmup import WarmupPlan, compiled_graph_count, padded_lengths


class Accumulation:
    """Micro-batches per window: accumulation=N, or accumulation=adaptive, whose first window has
    accumulation_max and each later one what eq. 6 says after the step before it."""

    def __init__(self, cfg: Any):
        self.adaptive = cfg.accumulation == "adaptive"
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
                     result: "TrainResult") -> None:
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


class Step(Callback):
    """The optimizer step over a window, and the same forward/backward for the warm-up and
    evaluation (what is compiled is what runs). As an event object it follows the parameters
    trainable each epoch and keeps the one-step phase clock for the window only."""

    def __init__(self, cfg: Any, model: torch.nn.Module, step_model: Callable, device: torch.device,
                 precision: Precision, attention_ctx: Callable, no_sync: Callable, accumulation: Accumulation,
                 result: "TrainResult"):
        self.cfg, self.model, self.step_model, self.device = cfg, model, step_model, device
        self.precision, self.attention_ctx, self.no_sync = precision, attention_ctx, no_sync
        self.accumulation, self.result = accumulation, result
        # Per step: a plain value, not an OmegaConf read (~20 Python calls each) a plain loop does not pay.
        self.max_grad_norm = cfg.optimizer.max_grad_norm
        cuda_graphs = uses_cuda_graphs(cfg.compile.mode)
        # A CUDA-graph mode records a graph per concrete shape anyway; a dynamic-length graph
        # underneath only adds symbolic-size kernels (and failed in cudagraph trees on an H200).
        self.dynamic_length = cfg.compile.mode != "off" and not cuda_graphs and cfg.compile.dynamic_length
        self.drop_full_mask = cfg.compile.mode == "off"  # model_inputs: why compiled runs keep the mask
        # compile=reduce-overhead with accumulation: the first micro-batch's gradients would be the
        # CUDA graph's output buffers, overwritten by the next micro-batch's replay before autograd
        # adds to them. Gradients in buffers of our own (zeroed, not freed, per step) make autograd
        # add into them in place. Without accumulation the optimizer reads them before any replay.
        self.graph_grad_buffers = cuda_graphs and accumulation.first > 1
        self.optimizer = None
        self.trainable_params: List[torch.Tensor] = []
        self.graphs: Optional[StepGraphs] = None  # compile.step_graph: captured once the optimizer exists
        self.phases: Optional[PhaseClock] = None  # the current window's one-step breakdown

    def prepare(self, batch: Dict[str, torch.Tensor]) -> None:
        if self.dynamic_length:
            mark_length_dynamic(batch)

    def __call__(self, window: List[Dict[str, torch.Tensor]]) -> torch.Tensor:
        """Forward+backward over one window, then the update; returns the window's mean loss."""
        if self.graphs is not None:
            return self.graphs.step(window, sum(real_rows(b) for b in window))
        if self.phases is not None:
            self.phases.begin_step()
        variance = self.accumulation.variance(self.trainable_params)
        window_loss = accumulate_window(self.step_model, window, self.precision, self.device, self.attention_ctx,
                                        self.prepare, self.drop_full_mask, self.no_sync, self.phases, variance)
        if variance is not None:
            self.accumulation.after_window(variance, window, self.precision, self.result)
        self.update(self.trainable_params)
        if self.phases is not None:
            self.phases.step_done()
        return window_loss

    def update(self, params: List[torch.Tensor]) -> None:
        """Clip, step, zero: the update after a window's backward (also the warm-up's first update)."""
        scaler = self.precision.scaler
        if self.max_grad_norm:
            scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        scaler.step(self.optimizer)
        scaler.update()
        self.optimizer.zero_grad(set_to_none=not self.graph_grad_buffers)

    def micro(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """One micro-batch's forward+backward, no update (the warm-up)."""
        return accumulate_window(self.step_model, [batch], self.precision, self.device, self.attention_ctx,
                                 self.prepare, self.drop_full_mask)

    def eval_forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        return eval_batch(self.step_model, batch, self.precision, self.device, self.attention_ctx, self.prepare,
                          self.drop_full_mask)

    def evaluate(self, loader: Any) -> float:
        return evaluate(self.model, loader, self.precision, self.device, self.attention_ctx, self.step_model,
                        self.prepare, self.drop_full_mask)

    def epoch_start(self, run: "Run", epoch: int) -> None:
        self.trainable_params = [p for p in self.model.parameters() if p.requires_grad]
        if self.graph_grad_buffers:
            for p in self.trainable_params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)

    def window_start(self, run: "Run", win: "Window") -> None:
        self.phases = PhaseClock(self.device)

    def window_end(self, run: "Run", win: "Window") -> None:
        win.phases, self.phases = self.phases, None  # the profiler window after training is not timed


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

    def open(self, result: "TrainResult") -> None:
        self.start_unix = time.time()
        if result.first_window_opened_at is None:
            result.first_window_opened_at = self.start_unix
        self._t0 = time.perf_counter()
        self.timing = True
        self.clock.mark()

    def close(self) -> None:
        """The device finishes the window's work before the clock stops."""
        _sync(self.device)
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
                          self.clock.step_ms(), self.compiles_in_window, self.phases.per_step(),
                          self.compiles_in_eval)


@dataclass
class Run:
    """What the loop and its event objects share in one train() call."""
    cfg: Any
    device: torch.device
    log: Callable[[str], None]
    model: torch.nn.Module
    parallel: Optional[torch.nn.Module]
    train_loader: Any
    test_loader: Any
    step: Step
    accumulation: Accumulation
    result: TrainResult
    plan: WarmupPlan
    graphs_at_start: int   # dynamo's counters outlive torch.compiler.reset()
    cuda_graphs: bool
    has_triton: bool
    steps_per_epoch: int
    total_steps: int
    base_lr: float
    global_step: int = 0
    micro_batches_done: int = 0

    # What the per-step hooks read, as plain values (__post_init__): an OmegaConf attribute costs
    # ~20 Python calls, which a plain loop does not pay (tests/test_host_work.py counts them).
    log_every_steps: int = 0
    lr_schedule: Tuple[str, float, float] = ("constant", 0.0, 0.0)  # schedule, warmup_ratio, min_lr_ratio

    def __post_init__(self) -> None:
        self.log_every_steps = int(self.cfg.train.log_every_steps)
        o = self.cfg.optimizer
        self.lr_schedule = (str(o.schedule), float(o.warmup_ratio), float(o.min_lr_ratio))

    def log_due(self, win: Window) -> bool:
        """Steps that read the loss on the host (NaN check, bar): every log_every_steps, and the last."""
        return win.steps % self.log_every_steps == 0 or win.steps == self.steps_per_epoch


def loop(run: Run, events: Events) -> TrainResult:
    """The epoch / window / step loop; the events and their order are train/events.py's."""
    cfg, result = run.cfg, run.result
    events.run_start(run)
    for epoch in range(cfg.train.epochs):
        events.epoch_start(run, epoch)
        run.model.train()
        win = Window(epoch, run.model, run.device)
        events.window_start(run, win)
        try:
            win.open(result)  # train_time_s from here
            for window in windows(run.train_loader, run.accumulation.k):
                if win.steps == run.steps_per_epoch:
                    break
                if result.first_step_started_at is None:
                    result.first_step_started_at = time.time()
                events.step_start(run, win)
                window_loss = run.step(window)
                run.micro_batches_done += len(window)
                win.clock.mark()
                win.add(window, window_loss)
                run.global_step += 1
                events.step_end(run, win)
            win.close()  # to here, after a device sync
        finally:
            events.window_end(run, win)
        events.epoch_end(run, win)
        result.epochs.append(win.stats(run.model))
        result.last_window_end_unix = win.end_unix
        run.log(f"epoch {epoch + 1}/{cfg.train.epochs}: train_loss={win.epoch_loss():.4f} "
                f"test_accuracy={win.test_accuracy:.4f} train_time_s={win.train_time_s:.1f} "
                f"eval_time_s={win.eval_time_s:.1f} trainable_params={win.trainable:,}")
    events.run_end(run)
    return result


def train(model: torch.nn.Module, train_loader: Any, test_loader: Any, cfg: Any,
          device: torch.device, log: Callable[[str], None] = print,
          collectors: Optional[CollectorSet] = None, profile_dir: Optional[Path] = None,
          after_training: Optional[Callable[[], None]] = None,
          warmup_plan: Optional[WarmupPlan] = None, callbacks: Sequence[Callback] = ()) -> TrainResult:
    """collectors: started/stopped around each training window. after_training: called after
    the last evaluation, before the optional profiler window (cfg.profile), which writes its
    trace to profile_dir. warmup_plan: the shapes to compile before the first window (job.py
    builds it from the data); None = derive the lengths from max_length (every multiple).
    callbacks: more event objects, innermost (their start hooks run last before the window's
    clock starts, their end hooks first after it stops)."""
    collectors = collectors or CollectorSet()
    run = _prepare(model, train_loader, test_loader, cfg, device, log, warmup_plan)
    # Outermost first; the order is part of the measurement (train/events.py).
    events = Events([Profiler(profile_dir), LayerTiming(), AfterTraining(after_training), FreezingSchedule(),
                     CompileWarmup(), run.step, Evaluation(), ProgressBar(), NonFiniteCheck(), RanksTogether(),
                     CompileEventCount(), Collectors(collectors), LrSchedule(), *callbacks])
    with dynamo_settings(cfg, len(run.plan.train_lengths) + len(run.plan.eval_lengths)):
        return loop(run, events)


def _prepare(model: torch.nn.Module, train_loader: Any, test_loader: Any, cfg: Any, device: torch.device,
             log: Callable[[str], None], warmup_plan: Optional[WarmupPlan]) -> Run:
    """The model on the device and wrapped (DDP, torch.compile), the step, and the step counts."""
    precision = Precision(cfg.precision, device)
    attention_ctx = sdpa_backends(cfg)
    accumulation = Accumulation(cfg)
    k = accumulation.first  # adaptive: accumulation_max, the window's largest
    model.to(device)
    if half_params(cfg, optimizer_class(cfg.optimizer)):
        # encoder=fused's mixed-precision update: the parameters live in the autocast dtype and the
        # optimizer keeps their fp32 masters in its flat buffers, so no weight is cast per step.
        model.to(precision.dtype)
        log(f"parameters in {precision.dtype}, fp32 master weights in optimizer={cfg.optimizer.name}'s buffers")
    apply_checkpointing(model, cfg.train.gradient_checkpointing)
    warm_up_device(device)
    result = TrainResult(device_ready_at=time.time())
    graphs_at_start = compiled_graph_count()
    parallel = data_parallel(model, device)
    step_model = compile_model(parallel or model, cfg)
    no_sync = parallel.no_sync if parallel is not None else nullcontext
    step = Step(cfg, model, step_model, device, precision, attention_ctx, no_sync, accumulation, result)
    # adaptive: windows have at least 2 micro-batches, so ceil(len/2) bounds the steps; the
    # schedule then runs over micro-batches, the one count known in advance.
    steps_per_epoch = math.ceil(len(train_loader) / (2 if accumulation.adaptive else k))
    if cfg.train.max_steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, cfg.train.max_steps_per_epoch)
    total_steps = cfg.train.epochs * (len(train_loader) if accumulation.adaptive else steps_per_epoch)
    # The linear scaling rule counts the global batch: per-rank batch x accumulation x ranks.
    base_lr = scaled_lr(cfg.optimizer, cfg.train.batch_size * k * distributed.world_size())
    every_length = padded_lengths(cfg.dataset.max_length, cfg.train.pad_to_multiple_of)
    plan = warmup_plan or WarmupPlan(cfg.train.batch_size, cfg.train.eval_batch_size, every_length, every_length)
    has_triton = uses_triton(cfg, device.type)
    result.compiled_anything = compiles_anything(cfg, device.type)
    return Run(cfg, device, log, model, parallel, train_loader, test_loader, step, accumulation, result, plan,
               graphs_at_start, uses_cuda_graphs(cfg.compile.mode), has_triton, steps_per_epoch, total_steps, base_lr)
